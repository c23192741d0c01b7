import json
import socket
import subprocess
import sys

import pytest

import torch

from mlhpc.run import assemble
from mlhpc import config as cfg
from mlhpc.run import profile as profile_module
from mlhpc import runtime
from mlhpc.run.profile import profile
from test_run_e2e import TINY, tiny_data  # noqa: F401 (fixture)


def test_profile_reports_phases_operators_memory_and_trace(tmp_path, repo, tiny_data):
    overrides = tuple(v for v in TINY if v != "--set") + (f"data.path={tiny_data}", "optimizer.name=sgd")
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", overrides)
    result = profile(config, steps=2, warmup=1, trace_path=tmp_path / "trace.json")
    assert set(result.phase_ms) == {"data", "forward", "backward", "optimizer"}
    assert result.phase_ms["backward"] > 0 and result.phase_ms["forward"] > 0
    names = [row["name"] for row in result.operators]
    assert any("conv" in name for name in names)
    mem = result.memory
    assert mem["parameters_bytes"] == mem["gradients_bytes"]  # fp32 weights and grads
    assert mem["optimizer_state_bytes"] == mem["parameters_bytes"]  # SGD momentum: one buffer
    assert mem["saved_activations_bytes"] > 0
    assert result.flops["train_flops"] > 2 * result.flops["forward_flops"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["traceEvents"]


def test_profile_runs_the_training_step_with_ddp_and_amp(tmp_path, repo, tiny_data, monkeypatch):
    """The profiled step is `mlhpc.run.step.train_step` on the DDP-wrapped model under autocast, as in
    a run: here a one-rank Gloo group, and bf16 autocast allowed on the CPU for the test."""
    overrides = tuple(v for v in TINY if v != "--set") + (f"data.path={tiny_data}", "train.amp=true")
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", overrides)
    seen = []
    real_step = profile_module.train_step

    def spy(step, x, y, last_micro=True, phase=None):
        seen.append((type(step.model).__name__, step.precision))
        return real_step(step, x, y, last_micro, phase)

    monkeypatch.setattr(profile_module, "train_step", spy)
    monkeypatch.setattr(assemble, "precision", lambda amp, device: "bf16" if amp else "fp32")
    monkeypatch.setattr(runtime.Runtime, "distributed", property(lambda self: True))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                                         world_size=1)
    try:
        result = profile(config, steps=2, warmup=1, trace_path=tmp_path / "trace.json")
    finally:
        runtime.destroy_process_group()
    assert seen and set(seen) == {("DistributedDataParallel", "bf16")}
    assert result.distributed and result.precision == "bf16"
    # The operator table keeps the costliest operators only, and a one-rank all-reduce may not
    # be among them on a loaded machine; the trace holds every operator the profiler saw.
    trace = (tmp_path / "trace.json").read_text().lower()
    assert "allreduce" in trace, "no gradient all-reduce in the profiled steps"


@pytest.mark.parametrize("args, fragment", [
    (["--steps", "0"], "--steps 0"),
    (["--steps", "-3"], "--steps -3"),
    (["--warmup", "-1"], "--warmup -1"),
    (["--trace", "FILE/trace.json"], "--trace folder"),
])
def test_profile_bad_arguments_are_one_line(tmp_path, repo, args, fragment):
    blocker = tmp_path / "FILE"
    blocker.write_text("a file\n")
    args = [str(blocker / "trace.json") if a == "FILE/trace.json" else a for a in args]
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "profile",
                           str(repo / "configs" / "cosmoflow-mini.yaml"), *args,
                           "--set", f"data.path={tmp_path / 'data'}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and fragment in lines[0] and "Traceback" not in proc.stderr
    assert "trace:" not in proc.stdout and not (tmp_path / "data").exists()


def test_profile_writes_its_trace_under_the_results_folder_unless_told(tmp_path, repo, tiny_data):
    """Without --trace the Chrome trace goes to <output.dir>/profile/<workload>-trace.json, never
    the current folder, and the command says where; --trace PATH puts it at PATH."""
    sets = [a for o in tuple(v for v in TINY if v != "--set") + (
        f"data.path={tiny_data}", f"output.dir={tmp_path / 'results'}",
        "data.synthesize_if_missing=false") for a in ("--set", o)]
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cmd = [sys.executable, "-m", "mlhpc", "profile", str(repo / "configs" / "cosmoflow-mini.yaml"),
           "--steps", "1", "--warmup", "0", *sets]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    default = tmp_path / "results" / "profile" / "cosmoflow-trace.json"
    assert json.loads(default.read_text())["traceEvents"]
    assert not list(cwd.iterdir()), list(cwd.iterdir())  # nothing in the current folder
    assert f"trace: {default} " in " ".join(proc.stdout.split())
    chosen = tmp_path / "elsewhere" / "t.json"
    proc = subprocess.run(cmd + ["--trace", str(chosen)], cwd=cwd, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(chosen.read_text())["traceEvents"] and f"trace: {chosen} " in " ".join(proc.stdout.split())
