"""Faults end clearly: NaN loss, sizes that disagree, SIGTERM during initialisation, side files of a
freed slot, unusable results folders, throughput instances. (Stopped and resumed runs:
test_resume.py.) Each: exit status, one line naming the culprit, the results folder scoring
exactly its good runs."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from test_distributed import BIN, launch
from test_resume import one_line_error, start_run, wait_for
from test_run_e2e import events, run_cli, tiny_args, tiny_data  # noqa: F401 (fixture)


def scored_runs(out: Path, cwd: Path) -> tuple[list[str], dict]:
    """(names of the logs `mlhpc report` scores in ``out``, its dropped runs)."""
    proc = run_cli(["report", str(out), "--format", "json", "--no-compliance"], cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    [folder] = json.loads(proc.stdout)["folders"]
    names = [Path(r["path"]).name for r in folder["runs"] if str(r["path"]) not in folder["resumed"]]
    return [n for n in names if not any(n in k for k in folder["dropped"])], folder["dropped"]


def test_model_and_data_sizes_that_disagree_are_one_line_and_set_aside(tmp_path, repo, tiny_data):
    """The sample is first read inside the logged initialisation (after init_start, after
    staging), never before the log: a mismatch is one line naming the source file (not the staged
    copy) and its sample, exit 2, and the attempt's log moved to failed/, so the folder holds no
    run; the next run takes slot 0 and scores alone."""
    out = tmp_path / "out"
    proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "model.input_size=32"), cwd=tmp_path)
    one_line_error(proc, "model.input_size=32")
    assert f"{tiny_data / 'train'}/" in proc.stderr and " sample 0" in proc.stderr, proc.stderr
    assert "a training sample of shape (16, 16, 16, 4)" in proc.stderr
    assert "failed/result_0.log" in proc.stderr
    assert not list(out.glob("result_*")) and not list(out.glob("summary_*"))
    keys = [e["key"] for e in events(out / "failed" / "result_0.log")]
    assert keys.index("init_start") < keys.index("staging_stop") and "init_stop" not in keys
    assert "run_start" not in keys and "run_stop" not in keys
    good = run_cli(tiny_args(repo, tiny_data, out, "--set", "train.target=10.0"), cwd=tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    assert scored_runs(out, tmp_path) == (["result_0.txt"], {})


def test_sizes_that_disagree_with_staging_in_the_run_abort_the_timed_run(tmp_path, repo, tiny_data):
    """``data.staging.placement: run``: the dataset is first touched after run_start, so the
    sample is checked there (after staging) and a mismatch ends that run with run_stop
    (aborted, naming the source file): one line, exit 2, nothing read before the clock."""
    out = tmp_path / "out"
    proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "model.input_size=32",
                             "--set", "data.staging.placement=run"), cwd=tmp_path)
    one_line_error(proc, "model.input_size=32")
    assert f"{tiny_data / 'train'}/" in proc.stderr and "failed/" not in proc.stderr
    log = events(out / "result_0.txt")
    keys = [e["key"] for e in log]
    assert keys.index("run_start") < keys.index("staging_start") < keys.index("run_stop")
    assert "epoch_start" not in keys
    [stop] = [e for e in log if e["key"] == "run_stop"]
    assert stop["metadata"]["status"] == "aborted" and "DataError" in stop["metadata"]["reason"]
    assert str(tiny_data / "train") in stop["metadata"]["reason"]


def test_sigterm_during_init_sets_the_log_aside(tmp_path, repo, tiny_data):
    """SIGTERM between init_start and run_start: exit 143, the log moved to failed/ and named,
    nothing left that scores as a run; the next run takes the freed slot and scores alone."""
    for attempt in range(3):  # the window is ~0.3 s; retry when the signal lands after run_start
        out = tmp_path / f"out{attempt}"
        proc = start_run(tiny_args(repo, tiny_data, out), cwd=tmp_path)
        wait_for(out / "result_0.txt", '"init_start"', proc)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        if (out / "failed").exists():
            break
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert "SIGTERM before run_start" in stderr and "failed/result_0.log" in stderr
    assert not (out / "result_0.txt").exists() and (out / "failed" / "result_0.log").is_file()
    assert not list(out.glob("checkpoint_*"))
    good = run_cli(tiny_args(repo, tiny_data, out, "--set", "train.target=10.0"), cwd=tmp_path)
    assert good.returncode == 0, good.stderr[-2000:]
    assert scored_runs(out, tmp_path) == (["result_0.txt"], {})


def test_side_files_of_a_freed_slot_are_never_overwritten(tmp_path, repo, tiny_data):
    """result_0.txt moved away, its summary and checkpoint left: slot 0 is not free."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary_0.json").write_text('{"precious": true}\n')
    (out / "checkpoint_0.pt").write_bytes(b"a resumable checkpoint")
    proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "train.target=10.0"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (out / "summary_0.json").read_text() == '{"precious": true}\n'
    assert (out / "checkpoint_0.pt").read_bytes() == b"a resumable checkpoint"
    assert sorted(p.name for p in out.iterdir() if p.name.endswith("_1.txt") or "_1." in p.name) == [
        "config_1.yaml", "env_1.json", "measured_1.json", "result_1.txt", "summary_1.json"]


def test_output_dir_that_is_a_file_is_one_line(tmp_path, repo, tiny_data):
    target = tmp_path / "a-file"
    target.write_text("not a folder\n")
    proc = run_cli(tiny_args(repo, tiny_data, target), cwd=tmp_path)
    one_line_error(proc, "is a file")
    assert target.read_text() == "not a folder\n"


def test_nan_loss_aborts_with_reason(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "optimizer.base_learning_rate=1.0e+30",
                             "--set", "train.check_every_steps=1"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    stop = [e for e in events(out / "result_0.txt") if e["key"] == "run_stop"]
    assert stop[0]["metadata"]["status"] == "aborted"
    assert "non-finite" in stop[0]["metadata"]["reason"]


def test_resume_without_checkpoint_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    proc = run_cli(["run", "--resume", str(tmp_path / "run")], cwd=tmp_path)
    assert proc.returncode == 2 and "no checkpoint_N.pt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


@pytest.mark.cluster  # torchrun
def test_two_instances_write_two_logs(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    args = tiny_args(repo, tiny_data, out, "--set", "train.target=10.0", "--instances", "2")
    proc = launch([str(BIN / "torchrun"), "--nproc-per-node", "2", "--no-python", str(BIN / "mlhpc"),
                   *args], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logs = sorted(out.glob("result_*.txt"))
    assert len(logs) == 2
    seeds, instances = set(), set()
    for log in logs:
        ev = events(log)
        seeds.add([e["value"] for e in ev if e["key"] == "seed"][0])
        instances.add([e["metadata"]["instance"] for e in ev if e["key"] == "run_start"][0])
        assert [e["value"] for e in ev if e["key"] == "number_of_nodes"] == [1]
    assert instances == {0, 1} and len(seeds) == 2
    # the report scores the two instance logs as a throughput (weak-scaling) result
    report = run_cli(["report", str(out), "--format", "json", "--no-compliance"], cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    folder = json.loads(report.stdout)["folders"][0]
    assert folder["kind"] == "weak" and folder["number_of_models"] == 2
    assert folder["models_per_min"] == pytest.approx(2 / folder["ttta_min"])
