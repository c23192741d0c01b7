"""Stopped and resumed runs, as a user meets them: a real run killed with SIGTERM, its folder moved,
resumed from another folder, resumed twice, a finished run resumed, checkpoints corrupted on disk.

The MLPerf rules time a run as one contiguous period ("The clock may not be paused during the
run.", training_rules.adoc "Run Results"): a resumed run carries the honest total across attempts
and is kept apart from the scored runs, with the stopped attempt it continues."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from test_distributed import BIN
from test_run_e2e import TINY, events, run_cli, tiny_data  # noqa: F401 (fixture)


def one_line_error(proc: subprocess.CompletedProcess, fragment: str, status: int = 2) -> None:
    assert proc.returncode == status, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert fragment in lines[0], lines[0]


def start_run(args: list[str], cwd: Path) -> subprocess.Popen:
    return subprocess.Popen([str(BIN / "mlhpc"), *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})


def wait_for(log: Path, token: str, proc: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline and proc.poll() is None:
        if log.exists() and token in log.read_text():
            return
        time.sleep(0.005)
    raise AssertionError(f"{token} never appeared in {log}")


def mini_args(repo: Path, data: str, out: str, *extra: str) -> list[str]:
    return ["run", str(repo / "configs" / "cosmoflow-mini.yaml"), *TINY, "--set", f"data.path={data}",
            "--set", f"output.dir={out}", "--set", "data.synthesize_if_missing=false", *extra]


@pytest.fixture(scope="module")
def stopped(tmp_path_factory, repo, tiny_data):
    """A run with relative paths (data.path=data, output.dir=out, from folder a/) stopped by
    SIGTERM in its second epoch; its folder then moved to b/moved."""
    root = tmp_path_factory.mktemp("resume")
    first = root / "a"
    first.mkdir()
    (first / "data").symlink_to(tiny_data)
    proc = start_run(mini_args(repo, "data", "out", "--set", "train.max_epochs=4",
                               "--set", "train.target=0.0", "--set", "train.check_every_steps=1"),
                     cwd=first)
    wait_for(first / "out" / "result_0.txt", '"epoch_num": 2', proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    (root / "b").mkdir()
    shutil.move(str(first / "out"), str(root / "b" / "moved"))
    return root, proc.returncode, stderr


def test_sigterm_exits_143_with_a_checkpoint(stopped):
    root, status, stderr = stopped
    assert status == 128 + signal.SIGTERM, stderr
    assert "--resume" in stderr and "Traceback" not in stderr
    run_dir = root / "b" / "moved"
    stop = [e for e in events(run_dir / "result_0.txt") if e["key"] == "run_stop"]
    assert len(stop) == 1 and stop[0]["metadata"]["status"] == "aborted"
    assert stop[0]["metadata"]["signal"] == "SIGTERM"
    state = torch.load(run_dir / "checkpoint_0.pt", weights_only=True)
    assert state["epoch"] == 2 and Path(state["config"]["data"]["path"]).is_absolute()


@pytest.fixture(scope="module")
def resumed(stopped):
    """The moved folder resumed from a third folder c/ (nothing there, nothing in a/)."""
    root = stopped[0]
    (root / "c").mkdir()
    proc = run_cli(["run", "--resume", "../b/moved"], cwd=root / "c")
    return root, proc


def test_resume_of_a_moved_folder_writes_there_and_reads_the_same_data(resumed):
    root, proc = resumed
    assert proc.returncode == 1, proc.stderr[-3000:]  # target 0.0: runs to max_epochs 4
    run_dir = root / "b" / "moved"
    assert (run_dir / "result_1.txt").is_file() and (run_dir / "summary_1.json").is_file()
    assert list((root / "c").iterdir()) == []  # nothing synthesised or written in the cwd
    assert not (root / "a" / "out").exists()  # nor in the old run folder
    ev = events(run_dir / "result_1.txt")
    [resume] = [e for e in ev if e["key"] == "resume"]
    assert resume["value"]["from_result_file"] == "result_0.txt"
    assert resume["value"]["checkpoint"] == "checkpoint_0.pt"
    epochs = [e["metadata"]["epoch_num"] for e in ev if e["key"] == "epoch_start"]
    assert epochs[0] == 2 and epochs[-1] == 4
    claim = json.loads((run_dir / "resumed_0.json").read_text())
    assert claim["resumed_by"] == "result_1.txt"


def test_resumed_log_summary_and_report_carry_the_total_across_attempts(resumed):
    root, _ = resumed
    run_dir = root / "b" / "moved"
    first = {e["key"]: e["time_ms"] for e in reversed(events(run_dir / "result_0.txt"))}
    first_s = (first["run_stop"] - first["run_start"]) / 1000
    [resume] = [e for e in events(run_dir / "result_1.txt") if e["key"] == "resume"]
    assert resume["value"]["earlier_attempts_s"] == pytest.approx(first_s, abs=0.002)
    summary = json.loads((run_dir / "summary_1.json").read_text())
    assert summary["resumed"] and summary["earlier_attempts_s"] == pytest.approx(first_s, abs=0.002)
    assert summary["time_to_train_total_s"] == pytest.approx(summary["time_to_train_s"] + first_s,
                                                             abs=0.002)
    report = run_cli(["report", str(run_dir), "--format", "json", "--no-compliance"], cwd=root)
    assert report.returncode == 0, report.stderr
    runs = {Path(r["path"]).name: r for r in json.loads(report.stdout)["folders"][0]["runs"]}
    assert runs["result_1.txt"]["resumed"] and not runs["result_0.txt"]["resumed"]
    assert runs["result_1.txt"]["time_to_train_total_s"] == pytest.approx(
        summary["time_to_train_total_s"], abs=1e-6)


def test_resuming_the_same_checkpoint_twice_is_one_line(resumed):
    root, _ = resumed
    proc = run_cli(["run", "--resume", str(root / "b" / "moved")], cwd=root)
    one_line_error(proc, "already resumed by result_1.txt")
    assert not (root / "b" / "moved" / "result_2.txt").exists()


def test_folder_scores_exactly_its_good_runs_and_package_refuses_the_resumed(resumed, repo, tiny_data):
    root, _ = resumed
    run_dir = root / "b" / "moved"
    good = run_cli(mini_args(repo, str(tiny_data), str(run_dir), "--set", "train.target=10.0"), cwd=root)
    assert good.returncode == 0, good.stderr[-2000:]
    assert (run_dir / "result_2.txt").is_file()
    report = run_cli(["report", str(run_dir), "--format", "json", "--level", "folders",
                      "--no-compliance"], cwd=root)
    assert report.returncode == 0, report.stderr
    [folder] = json.loads(report.stdout)["folders"]
    # the stopped attempt is no failed run: nothing dropped, both attempts kept apart
    assert not folder["dropped"], folder["dropped"]
    assert sorted(Path(p).name for p in folder["resumed"]) == ["result_0.txt", "result_1.txt"]
    package = run_cli(["report", str(run_dir / "result_1.txt"), "--package", str(root / "pkg")], cwd=root)
    one_line_error(package, "resumed run")
    package = run_cli(["report", str(run_dir / "result_0.txt"), "--package", str(root / "pkg")], cwd=root)
    one_line_error(package, "continued by --resume")
    assert not (root / "pkg").exists()


def test_resuming_a_finished_run_is_one_line(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    proc = run_cli(mini_args(repo, str(tiny_data), str(out), "--set", "train.max_epochs=1",
                             "--set", "train.target=0.0", "--set", "train.checkpoint_every_epochs=1"),
                   cwd=tmp_path)
    assert proc.returncode == 1 and (out / "checkpoint_0.pt").is_file(), proc.stderr
    proc = run_cli(["run", "--resume", str(out)], cwd=tmp_path)
    one_line_error(proc, "finished")
    assert sorted(p.name for p in out.glob("result_*")) == ["result_0.txt"]


@pytest.mark.parametrize("content, fragment", [
    (b"not a checkpoint at all", "cannot read checkpoint"),
    ({"epoch": 1}, "no 'config' entry"),
    ([1, 2, 3], "not a dict"),
    ("shapes", "does not fit the model"),
    ("config", "config"),
])
def test_bad_checkpoint_contents_are_one_line(resumed, tmp_path, content, fragment):
    root, _ = resumed
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    good = torch.load(root / "b" / "moved" / "checkpoint_0.pt", weights_only=True)
    path = run_dir / "checkpoint_0.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif content == "shapes":
        name = next(iter(good["model"]))
        good["model"][name] = torch.zeros(3, 3)
        torch.save(good, path)
    elif content == "config":
        good["config"]["train"]["global_batch_size"] = -4
        torch.save(good, path)
    else:
        torch.save(content, path)
    proc = run_cli(["run", "--resume", str(run_dir)], cwd=tmp_path)
    one_line_error(proc, fragment)
    assert not list(run_dir.glob("result_*")) and not (run_dir / "failed").exists()
    assert not (run_dir / "resumed_0.json").exists()


def test_several_stopped_runs_need_the_checkpoint_named(tmp_path, resumed):
    root, _ = resumed
    for n in (0, 1):
        shutil.copy(root / "b" / "moved" / "checkpoint_0.pt", tmp_path / f"checkpoint_{n}.pt")
    proc = run_cli(["run", "--resume", str(tmp_path)], cwd=tmp_path)
    one_line_error(proc, "give the checkpoint file")
