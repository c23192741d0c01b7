"""benchmarks/throughput.py (compute ceiling, FLOPs, MFU) and the train.compile switch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mlhpc import workload as workloads
from mlhpc import config as cfg
from mlhpc.run import command, step
from mlhpc.errors import ConfigError
from test_run_e2e import TINY, tiny_data  # noqa: F401 (fixture)


def _overrides(data) -> tuple[str, ...]:
    return tuple(v for v in TINY if v != "--set") + (f"data.path={data}",
                                                     "data.synthesize_if_missing=false")


def test_throughput_reports_counted_flops_and_mfu(tmp_path, repo, tiny_data):
    out = tmp_path / "tp.json"
    sets = [arg for o in _overrides(tiny_data) for arg in ("--set", o)]
    proc = subprocess.run([sys.executable, str(repo / "benchmarks" / "throughput.py"),
                           str(repo / "configs" / "cosmoflow-mini.yaml"), *sets, "--steps", "2",
                           "--warmup", "1", "--device", "cpu", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["sample_shape"] == [4, 16, 16, 16] and result["batch_size"] == 8
    assert result["samples_per_s"] > 0 and result["compile"] is None
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", _overrides(tiny_data))
    wl = workloads.get("cosmoflow")
    model = wl.build_model(config.model).to("meta")
    counted = step.count_flops(model, torch.empty(1, 4, 16, 16, 16, device="meta"),
                               wl.build_loss(config), torch.empty(1, 4, device="meta"))
    assert result["train_flops_per_sample"] == counted.train_flops
    assert result["achieved_flop_per_s"] == pytest.approx(
        result["samples_per_s"] * counted.train_flops)
    assert result["mfu"] == pytest.approx(result["achieved_flop_per_s"] / result["peak_flop_per_s"])
    assert f"{result['samples_per_s']:,.1f} samples/s" in proc.stdout


def test_throughput_bad_input_is_one_line_exit_2(tmp_path, repo):
    proc = subprocess.run([sys.executable, str(repo / "benchmarks" / "throughput.py"),
                           str(repo / "configs" / "cosmoflow-mini.yaml"), "--set",
                           f"data.path={tmp_path / 'none'}", "--set",
                           "data.synthesize_if_missing=false"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "dataset folder not found" in proc.stderr


@pytest.mark.parametrize("value, expected", [("true", "default"), ("false", None),
                                             ("reduce-overhead", "reduce-overhead"),
                                             ("max-autotune", "max-autotune")])
def test_compile_setting(repo, value, expected):
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", (f"train.compile={value}",))
    assert step.compile_mode(config.train.compile) == expected


def test_compile_setting_rejects_unknown_modes(repo):
    with pytest.raises(ConfigError, match=r"train\.compile: .*expected true, false or a "
                                          r"torch\.compile mode .*got 'fast'"):
        cfg.load(repo / "configs" / "cosmoflow-mini.yaml", ("train.compile=fast",))


def test_run_passes_the_compile_mode_to_torch(tmp_path, repo, tiny_data, monkeypatch):
    modes = []

    def fake_compile(model, mode=None):
        modes.append(mode)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", _overrides(tiny_data) + (
        f"output.dir={tmp_path}", "train.compile=reduce-overhead", "train.max_epochs=1",
        "train.target=10", "data.staging.enabled=false"))
    result = command.run(config)
    assert modes == ["reduce-overhead"]
    assert result.summary["perf"]["data_path"]["compile"] == "reduce-overhead"
    summary = json.loads(next(tmp_path.glob("summary_*.json")).read_text())
    assert summary["perf"]["data_path"]["compile"] == "reduce-overhead"
