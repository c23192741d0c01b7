"""Power sampling through `mlhpc run` (issue 24): tiny CosmoFlow runs with a node meter command that
prints a known constant, their power/result_N/node_K.txt files read by mlperf_logging's official
result_summarizer and by `mlhpc report`, and the closed form (watts x the logged interval).

The tiny runs cannot reach the reference target in seconds, so MLCommons' compliance checker (the
summarizer's first gate, `_read_result_file`) would drop them before any power is integrated: the
summarizer is run by its own `main` with that one function replaced by the same parse without the
compliance verdict; every other line (layout, `_compute_total_power`, the olympic means) is the
official code. `mlhpc report` is run with ``--no-compliance`` for the same reason.
"""

from __future__ import annotations

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_distributed import BIN, launch
from test_resume import start_run, wait_for
from test_run_e2e import events, run_cli, tiny_args, tiny_data  # noqa: F401 (fixture)

WATTS = 312.5
_SUMMARIZER = """
import sys
from mlperf_logging.compliance_checker.mlp_parser import parse_file
from mlperf_logging.result_summarizer import result_summarizer as rs

def read_parsed(result_file, usage, ruleset):  # rs._read_result_file without the compliance gate
    loglines, failed = parse_file(result_file, ruleset=ruleset)
    if failed:
        raise ValueError("Parse error")
    return loglines

rs._read_result_file = read_parsed
sys.argv = ["mlperf_logging.result_summarizer", *sys.argv[1:]]
rs.main()
"""
SYSTEM = {"submitter": "mlhpc", "division": "open", "status": "research", "system_name": "tinycpu",
          "number_of_nodes": "1", "host_processors_per_node": "1", "host_processor_model_name": "cpu",
          "host_processor_core_count": "2", "accelerator_model_name": "none", "accelerators_per_node": "0",
          "framework": "PyTorch", "hw_notes": "", "sw_notes": ""}


def power_args(tmp_path: Path, *extra: str) -> list[str]:
    meter = tmp_path / "meter.py"
    meter.write_text(f"print({WATTS})\n")
    return ["--set", "train.max_epochs=1", "--set", "data.staging.enabled=false",
            "--set", "power.interval_s=0.05", "--set", f"power.node_meter_command={sys.executable} {meter}",
            *extra]


def run_window_s(log: Path) -> float:
    """run_stop - run_start of a result log, seconds (the interval the summarizer scales to)."""
    times = {e["key"]: e["time_ms"] for e in events(log) if e["key"] in ("run_start", "run_stop")}
    return (times["run_stop"] - times["run_start"]) / 1e3


def assert_complete(node: Path) -> list[dict]:
    """A published node file: every line an MLLOG record, start first, stop last, its reading
    count right; returns the records."""
    lines = node.read_text().splitlines()
    assert lines and all(line.startswith(":::MLLOG {") for line in lines)
    records = [json.loads(line.split(" ", 1)[1]) for line in lines]
    keys = [r["key"] for r in records]
    assert keys[0] == "power_measurement_start" and keys[-1] == "power_measurement_stop"
    assert set(keys[1:-1]) == {"power_reading"}
    assert records[-1]["metadata"]["readings"] == len(keys) - 2
    assert all(r["value"] == WATTS for r in records[1:-1])
    return records


def layout(out: Path, root: Path, scaling: str) -> Path:
    """``root/mlhpc/{systems/tinycpu.json, results/tinycpu/<scaling>/cosmoflow/}``: the run
    folder's result logs and power folder as a submission, for the summarizer."""
    org = root / "mlhpc"
    (org / "systems").mkdir(parents=True)
    (org / "systems" / "tinycpu.json").write_text(json.dumps(SYSTEM))
    bench = org / "results" / "tinycpu" / scaling / "cosmoflow"
    bench.mkdir(parents=True)
    for log in out.glob("result_*.txt"):
        (bench / log.name).write_bytes(log.read_bytes())
    for node in (out / "power").glob("result_*/node_*.txt"):
        (bench / "power" / node.parent.name).mkdir(parents=True, exist_ok=True)
        (bench / "power" / node.parent.name / node.name).write_bytes(node.read_bytes())
    return org


def summarize(org: Path, cwd: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", _SUMMARIZER, str(org), "hpc", "3.0.0", "--csv",
                           str(cwd / "summary.csv")], capture_output=True, text=True, timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def report_json(out: Path, cwd: Path) -> dict:
    proc = run_cli(["report", str(out), "--format", "json", "--no-compliance"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    [folder] = json.loads(proc.stdout)["folders"]
    return folder


def test_runs_with_a_node_meter_agree_with_the_official_summarizer_and_the_closed_form(tmp_path, repo,
                                                                                      tiny_data):
    out = tmp_path / "out"
    for _ in range(3):  # the olympic mean of a strong result needs three runs
        proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "train.target=10.0", *power_args(tmp_path)),
                       cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-2000:]
    assert not list((out / "power").rglob("*.mlhpc-part")) and not list((out / "power").glob(".*"))
    closed_j = {}
    for n in range(3):
        log, node = out / f"result_{n}.txt", out / "power" / f"result_{n}" / "node_0.txt"
        records = assert_complete(node)
        assert records[0]["metadata"]["sources"] == ["node_meter (gauge)"]
        start = next(e["time_ms"] for e in events(log) if e["key"] == "run_start")
        assert records[0]["time_ms"] >= start  # the run's clock, sampling inside the timed run
        closed_j[log.name] = WATTS * run_window_s(log)
    folder = report_json(out, tmp_path)
    for run in folder["runs"]:
        assert run["energy_to_train_j"] == pytest.approx(closed_j[Path(run["path"]).name], rel=1e-9)
        assert run["mean_power_w"] == pytest.approx(WATTS, rel=1e-9)
    summarize(layout(out, tmp_path / "package", "strong"), tmp_path)
    row = next(csv.DictReader((tmp_path / "summary_detailed.csv").open()))
    official_j = float(row["cosmoflow:Energy"])
    assert folder["energy_olympic_j"] == pytest.approx(official_j, rel=1e-3)
    assert official_j == pytest.approx(sorted(closed_j.values())[1], rel=1e-9)  # middle time = middle energy


def test_sigterm_during_the_run_exits_143_with_a_complete_node_file(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    proc = start_run(tiny_args(repo, tiny_data, out, *power_args(tmp_path, "--set", "train.max_epochs=500")),
                     cwd=tmp_path)
    wait_for(out / "result_0.txt", '"epoch_stop"', proc)
    time.sleep(0.5)  # a few readings in
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    records = assert_complete(out / "power" / "result_0" / "node_0.txt")
    assert records[-1]["metadata"]["readings"] >= 3
    assert [p.name for p in (out / "power").iterdir()] == ["result_0"]  # no temporary file left
    [stop] = [e for e in events(out / "result_0.txt") if e["key"] == "run_stop"]
    assert stop["metadata"]["status"] == "aborted"
    assert abs(records[-1]["time_ms"] - stop["time_ms"]) < 1000  # stopped as the run stopped
    run = report_json(out, tmp_path)["runs"][0]
    assert run["energy_to_train_j"] == pytest.approx(WATTS * run_window_s(out / "result_0.txt"), rel=1e-9)


@pytest.mark.cluster  # torchrun
def test_instances_sharing_a_node_each_get_the_node_file(tmp_path, repo, tiny_data):
    """Throughput mode, three instances of one rank on one node: each result_N gets the node's
    file (same meter, its own run's window, marked shared), so the summarizer finds power for
    every result and scores it as `mlhpc report` does."""
    out = tmp_path / "out"
    args = tiny_args(repo, tiny_data, out, "--set", "train.target=10.0", "--instances", "3", *power_args(tmp_path))
    proc = launch([str(BIN / "torchrun"), "--nproc-per-node", "3", "--no-python", str(BIN / "mlhpc"), *args],
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted(out.glob("result_*.txt"))
    assert len(logs) == 3
    for log in logs:
        records = assert_complete(out / "power" / log.stem / "node_0.txt")
        assert records[0]["metadata"]["instances_on_node"] == 3
    assert "shared by 3 instances" in proc.stdout + proc.stderr
    folder = report_json(out, tmp_path)
    assert folder["kind"] == "weak" and not any("no power" in note for note in folder["notes"])
    # the report says the instances' energies overlap (one folder note, each run's power_note)
    assert [n for n in folder["notes"] if "node power shared by 3 instances" in n and "do not add" in n]
    for run in folder["runs"]:
        assert run["energy_to_train_j"] == pytest.approx(WATTS * run_window_s(Path(run["path"])), rel=1e-9)
    summarize(layout(out, tmp_path / "package", "weak"), tmp_path)
    power = json.loads((tmp_path / "summary_power.json").read_text())
    official_j = [v for k, v in _flatten(power) if "cosmoflow" in k and "time_to_train_all" in k]
    assert official_j and folder["energy_olympic_j"] == pytest.approx(official_j[0], rel=1e-3)


def _flatten(value, prefix: str = ""):  # type: ignore[no-untyped-def]
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{prefix}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _flatten(item, f"{prefix}/{index}")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield prefix, float(value)


def test_one_sampler_per_instance_on_a_shared_node_and_one_per_node_otherwise():
    from mlhpc.power import samples_node
    from mlhpc.runtime import Runtime

    # two one-rank instances on one node: instance 1's rank 0 is the node's local rank 1
    assert samples_node(Runtime(rank=0, local_rank=0, instances_per_node=2))
    assert samples_node(Runtime(rank=0, local_rank=1, instances_per_node=2))
    # two-rank instances on a four-rank node: ranks 0 and 2 sample, 1 and 3 do not
    assert [samples_node(Runtime(rank=local % 2, local_rank=local, local_world_size=2, instances_per_node=2))
            for local in range(4)] == [True, False, True, False]
    # no throughput mode: local rank 0 alone, whatever the rank
    assert [samples_node(Runtime(rank=r, world_size=4, local_rank=r % 2, local_world_size=2))
            for r in range(4)] == [True, False, True, False]
