"""benchmarks/gpu.py, the CUDA path in one command, kept alive between GPU sessions: its
``--tiny`` mode on the CPU runs every part (the machine, each workload's step in fp32 and bf16
autocast, `mlhpc run` with MLCommons' checker, the process group, the side-by-side comparisons
and the loader-feeds ratio), and every workload's settings for the GPU run still load."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu  # noqa: E402
import gpu_harness  # noqa: E402
import gpu_steps  # noqa: E402

from mlhpc import config as cfg  # noqa: E402


@pytest.mark.cluster  # a process group and a run per workload, about a minute
def test_tiny_run_passes_on_the_cpu(tmp_path):
    """One ``--tiny`` run (about 45 s of one core), every part checked."""
    out = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "gpu.py"), "--tiny",
                           "--json", str(out), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=840, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    _steps_timed_every_workload_in_fp32_and_bf16(proc, report)
    _runs_passed_the_checker_and_the_comparisons_said_their_ratios(proc, report)


def _steps_timed_every_workload_in_fp32_and_bf16(proc: subprocess.CompletedProcess, report: dict) -> None:
    assert set(report["steps"]) == set(gpu.WORKLOADS)
    for workload, row in report["steps"].items():
        assert row["train_flops_per_sample"] > 0 and row["sample_bytes"] > 0, workload
        for precision in ("fp32", "bf16"):
            figures = row["precisions"][precision]
            assert "skipped" in figures or (figures["samples_per_s"] > 0 and 0 < figures["mfu"] < 1), \
                (workload, precision, figures)
            shown = f"step {workload} {precision}: "
            assert any(line.startswith(shown) for line in proc.stdout.splitlines()), shown
    cosmoflow = report["steps"]["cosmoflow"]["precisions"]
    assert cosmoflow["fp32"]["steps_timed"] >= 1 and cosmoflow["bf16"]["samples_per_s"] > 0
    for workload in ("cosmoflow", "deepcam"):  # compile on/off: said why not, on a CPU
        assert "on a CPU" in report["steps"][workload]["compile"]["skipped"]
    openfold = report["steps"]["openfold"]
    assert openfold["measured_evoformer_blocks"] == [1, 2] and "linearly" in openfold["scaled"]
    peaks = report["machine"]["peaks"]
    assert peaks["fp32"]["flop_per_s"] > 0 and peaks["bf16"]["source"]


def _runs_passed_the_checker_and_the_comparisons_said_their_ratios(
        proc: subprocess.CompletedProcess, report: dict) -> None:
    assert report["ok"] and report["harness"]["process_group"] == {
        **report["harness"]["process_group"], "backend": "gloo", "ok": True}
    runs = report["harness"]["runs"]
    assert set(runs) == set(gpu.TINY_END_TO_END)
    for workload, run in runs.items():
        assert run["returncode"] == 0 and run["status"] == "success", run
        # a bounded run stops short of the reference target: that, and only that, fails
        assert run["checker"]["only_target"] or run["checker"]["ok"], run["checker"]
        assert f"run {workload}: exit 0, success" in proc.stdout
    for workload in gpu.TINY_END_TO_END:
        row = report["compare"][workload]
        assert row["harness"]["mlhpc"] > 0 and row["data-vs-training"]["goal"] == 2.0
        assert report["feeds_reference"][workload]["ratio"] > 0
    assert report["compare"]["oc20"]["model"]["goal"] == 1.0
    assert "compare oc20 model: " in proc.stdout and "feeds-reference cosmoflow: " in proc.stdout
    assert set(report["part_seconds"]) == {"machine", "steps", "harness", "compare"}


def test_the_gpu_run_fits_its_eight_minutes_and_every_setting_loads(tmp_path):
    assert sum(gpu.BUDGETS_S.values()) + gpu.GRACE_S * len(gpu.BUDGETS_S) <= 500
    for case in (*gpu_steps.REFERENCE, *gpu_steps.TINY):
        config = gpu_steps.load_config(case)
        assert config.workload == case.workload
        assert case.workload in gpu_steps.MAKERS
    assert {c.workload for c in gpu_steps.REFERENCE} == set(gpu.WORKLOADS)
    for workload in gpu.WORKLOADS:
        for tiny in (False, True):
            path, sets = gpu_harness.mini_overrides(workload, tmp_path, tiny)
            config = cfg.load(path, (*sets, "data.num_workers=2"))
            assert config.workload == workload and config.train.max_epochs == 1 and config.train.amp


def test_reference_batches_have_the_reference_shapes():
    import torch

    cpu = torch.device("cpu")
    deepcam = next(c for c in gpu_steps.REFERENCE if c.workload == "deepcam")
    assert gpu_steps.sample_bytes(deepcam, cpu) == 768 * 1152 * (16 * 4 + 8)
    slab = gpu_steps.slab(80, torch.Generator().manual_seed(0))
    assert slab["pos"].shape == (80, 3) and slab["fixed"].any() and not slab["fixed"].all()


@pytest.mark.parametrize("args, says", [
    (["--workloads", "cosmoflow,nosuch"], "--workloads 'nosuch'"),
    (["--parts", "steps,speed"], "--parts 'speed'"),
    (["--budget-scale", "0"], "--budget-scale"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, args, says):
    assert gpu.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and says in err, err


def test_a_bounded_run_past_its_time_stops_the_processes_it_started(tmp_path):
    """`gpu_harness.run_bounded` past its timeout stops the whole process group: a grandchild
    (as a synthesis pool's worker is to `mlhpc run`) does not outlive it."""
    import os
    import time

    pid_file = tmp_path / "grandchild.pid"
    code = ("import subprocess, sys, time\n"
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
            f"open({str(pid_file)!r}, 'w').write(str(p.pid))\n"
            "time.sleep(120)\n")
    with pytest.raises(subprocess.TimeoutExpired):
        gpu_harness.run_bounded([sys.executable, "-c", code], 3.0, tmp_path)
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"the grandchild {grandchild} outlived the bounded run")
