"""Storage mode (`mlhpc.run.emulate`): ``mlhpc run CONFIG --emulate-accelerator NAME|TIME`` runs
the real data path with each training step a sleep, and ``mlhpc report`` gives the accelerator
utilisation (AU) and samples/s from the log alone, per node too; bad names and times are one
line and exit 2; the published rates in mlhpc/run/accelerators.json are what the MLCommons logs
give (recomputed where the fixtures exist)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.run import emulate

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "cosmoflow-mini.yaml"
FIXTURES = Path("/work/shared/fixtures/mlperf-hpc-results/hpc_results_v3.0")
TINY = ["--set", "synth.cube_size=16", "--set", "synth.train_samples=64", "--set", "synth.eval_samples=16",
        "--set", "synth.samples_per_file=8", "--set", "train.global_batch_size=8",
        "--set", "train.max_epochs=1", "--set", "train.threads=1", "--set", "data.num_workers=0"]


@pytest.fixture(scope="module")
def tiny_data(tmp_path_factory) -> Path:
    data = tmp_path_factory.mktemp("emulate") / "data"
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "data", "synth", "cosmoflow", "--out", str(data),
                           "--config", str(MINI), *TINY], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return data


def storage_run(data: Path, out: Path, accelerator: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlhpc", "run", str(MINI), *TINY, "--set", f"data.path={data}",
                           "--set", f"output.dir={out}", "--emulate-accelerator", accelerator, *extra],
                          capture_output=True, text=True, timeout=300)


def report_run(out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "report", str(out), "--format", "json", "--no-compliance"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (run,) = json.loads(proc.stdout)["folders"][0]["runs"]
    return run


@pytest.mark.parametrize("value,words", [
    ("x100", "unknown accelerator 'x100' for cosmoflow; known: a100, h100"),
    ("0ms", "a time per sample must be greater than 0"),
    ("-2.5ms", "a time per sample must be greater than 0"),
    ("12.5xs", "neither an accelerator's name"),
    ("12", "neither an accelerator's name"),
])
def test_a_bad_accelerator_or_time_is_one_line_and_exit_2(tmp_path: Path, value: str, words: str) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["run", str(MINI), "--set", f"output.dir={out}",
                                       "--set", f"data.path={tmp_path / 'data'}", "--emulate-accelerator", value])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error:") and words in lines[0], lines
    assert "train.emulate_accelerator" in lines[0]
    assert not out.exists() and not (tmp_path / "data").exists()  # refused before anything was made


def test_published_rates_and_known_names() -> None:
    rate = emulate.published_rate("cosmoflow", "H100")
    assert rate.accelerator == "h100" and 100 < rate.samples_per_s < 1000
    assert rate.source.startswith("hpc_results_v3.0/NVIDIA/") and rate.time_per_sample_s == 1 / rate.samples_per_s
    assert emulate.known_accelerators("cosmoflow") == ["a100", "h100"]
    assert "a100-pcie" in emulate.known_accelerators("openfold") and emulate.known_accelerators("nothing") == []
    assert emulate.minimum_utilization("cosmoflow")[0] == 0.7
    with pytest.raises(emulate.ConfigError, match="known: a100, h100"):
        emulate.published_rate("cosmoflow", "tpu")


@pytest.mark.skipif(not FIXTURES.is_dir(), reason="MLCommons' published logs are not on this machine")
def test_the_rates_file_holds_what_the_published_logs_give() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from accelerator_rates import derive

    derived = derive(FIXTURES)
    table = json.loads(emulate.RATES_FILE.read_text())["rates"]
    assert {w: sorted(a) for w, a in derived.items()} == {w: sorted(a) for w, a in table.items()}
    for workload, accelerators in derived.items():
        for name, record in accelerators.items():
            assert table[workload][name]["samples_per_s"] == record["samples_per_s"], (workload, name)
            assert table[workload][name]["source"] == record["source"]


def test_a_storage_run_exits_0_and_the_report_gives_au_and_samples_per_s(tmp_path: Path, tiny_data: Path) -> None:
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    for out, time in ((fast, "0.1ms"), (slow, "25ms")):
        proc = storage_run(tiny_data, out, time)
        assert proc.returncode == 0, proc.stderr[-3000:]
    runs = [report_run(out) for out in (fast, slow)]
    for run in runs:
        assert 0 < run["accelerator_utilization"] <= 1 and run["samples_per_s"] > 0
        assert run["status"] == "aborted" and "no quality claimed" in run["reason"]
        assert run["emulation"]["nodes"][0]["ranks"] == 1 and run["emulation"]["epochs"] == 1
        assert not run["eval_s"]  # nothing evaluated
    assert runs[1]["accelerator_utilization"] > runs[0]["accelerator_utilization"]
    assert runs[1]["emulation"]["time_per_sample_s"] == pytest.approx(0.025)
    assert runs[1]["accelerator_utilization"] > 0.5  # 8 x 25 ms a step: the sleeps dominate
    summary = json.loads((slow / "summary_0.json").read_text())  # the steps computed nothing
    assert summary["perf"]["achieved_flop_per_s"] is None and summary["perf"]["mfu"] is None
    log = (slow / "result_0.txt").read_text()
    assert '"key": "emulated_accelerator"' in log and '"key": "emulated_compute"' in log
    table = subprocess.run([sys.executable, "-m", "mlhpc", "report", str(slow), "--no-compliance"],
                           capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "accelerator utilization" in table.stdout and "minimum 70%" in table.stdout


def test_a_named_accelerator_s_run_logs_its_source_and_a_normal_run_s_log_is_unchanged(
        tmp_path: Path, tiny_data: Path) -> None:
    proc = storage_run(tiny_data, tmp_path / "h100", "h100")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = report_run(tmp_path / "h100")
    assert run["emulation"]["accelerator"] == "h100" and "NVIDIA" in run["emulation"]["source"]
    assert run["emulation"]["meets_minimum"] in (True, False) and run["accelerator_utilization"] > 0
    normal = subprocess.run([sys.executable, "-m", "mlhpc", "run", str(MINI), *TINY, "--set", f"data.path={tiny_data}",
                             "--set", f"output.dir={tmp_path / 'normal'}"], capture_output=True, text=True, timeout=300)
    assert normal.returncode == 1, normal.stderr[-3000:]  # one epoch: the target is not reached
    log = (tmp_path / "normal" / "result_0.txt").read_text()
    assert "emulated" not in log and '"key": "eval_start"' in log  # trained and evaluated as before
    assert report_run(tmp_path / "normal")["accelerator_utilization"] is None


@pytest.mark.cluster  # two torchrun agents, each node with its own node-local copy
def test_two_nodes_give_per_node_figures(tmp_path: Path, tiny_data: Path) -> None:
    from test_multinode import two_nodes

    out = tmp_path / "results"
    args = ["run", str(MINI), *TINY, "--set", f"data.path={tiny_data}", "--set", f"output.dir={out}",
            "--set", f"data.staging.dest={tmp_path}/node{{node_rank}}-local", "--emulate-accelerator", "10ms"]
    for proc in two_nodes(args, tmp_path):
        assert proc.returncode == 0, proc.stderr[-3000:]
    run = report_run(out)
    nodes = run["emulation"]["nodes"]
    assert [n["node"] for n in nodes] == [0, 1] and all(n["ranks"] == 1 for n in nodes)
    assert all(0 < n["accelerator_utilization"] <= 1 and n["samples_per_s"] > 0 for n in nodes)
    assert sum(n["samples_per_s"] for n in nodes) == pytest.approx(run["emulation"]["samples_per_s"])
