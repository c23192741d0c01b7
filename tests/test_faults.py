"""Faults end clearly: NaN loss, SIGTERM with checkpoint and --resume, throughput instances."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from test_distributed import BIN, launch
from test_run_e2e import events, run_cli, tiny_args, tiny_data  # noqa: F401 (fixture)


def test_nan_loss_aborts_with_reason(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    proc = run_cli(tiny_args(repo, tiny_data, out, "--set", "optimizer.base_learning_rate=1.0e+30",
                             "--set", "train.check_every_steps=1"), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    stop = [e for e in events(out / "result_0.txt") if e["key"] == "run_stop"]
    assert stop[0]["metadata"]["status"] == "aborted"
    assert "non-finite" in stop[0]["metadata"]["reason"]


def test_sigterm_checkpoints_and_resume_continues(tmp_path, repo, tiny_data):
    out = tmp_path / "out"
    args = tiny_args(repo, tiny_data, out, "--set", "train.max_epochs=4", "--set", "train.target=0.0",
                     "--set", "train.check_every_steps=1")
    proc = subprocess.Popen([str(BIN / "mlhpc"), *args], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    log = out / "result_0.txt"
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.exists() and '"epoch_start"' in log.read_text():
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, stderr
    stop = [e for e in events(log) if e["key"] == "run_stop"]
    assert len(stop) == 1 and stop[0]["metadata"]["status"] == "aborted"
    assert "SIGTERM" in stop[0]["metadata"]["reason"]
    checkpoint = out / "checkpoint_0.pt"
    state = torch.load(checkpoint, weights_only=True)  # loads with weights_only=True
    stopped_epoch = state["epoch"]

    resumed = run_cli(["run", "--resume", str(out)], cwd=tmp_path)
    assert resumed.returncode == 1, resumed.stderr  # target 0.0: runs to max_epochs
    log2 = out / "result_1.txt"
    ev = events(log2)
    resume = [e for e in ev if e["key"] == "resume"]
    assert len(resume) == 1 and resume[0]["value"]["from_result_file"] == "result_0.txt"
    epochs = [e["metadata"]["epoch_num"] for e in ev if e["key"] == "epoch_start"]
    assert epochs[0] == stopped_epoch and epochs[-1] == 4
    assert json.loads((out / "summary_1.json").read_text())["resumed_from"].endswith("checkpoint_0.pt")
    # the first log is untouched by the resumed run
    assert [e["key"] for e in events(log)][-1] == "run_stop"
    # and the report shows the second run as resumed
    report = run_cli(["report", str(out), "--format", "json", "--no-compliance"], cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    runs = {Path(r["path"]).name: r for r in json.loads(report.stdout)["folders"][0]["runs"]}
    assert runs["result_1.txt"]["resumed"] and not runs["result_0.txt"]["resumed"]


def test_resume_without_checkpoint_is_one_line(tmp_path):
    (tmp_path / "run").mkdir()
    proc = run_cli(["run", "--resume", str(tmp_path / "run")], cwd=tmp_path)
    assert proc.returncode == 2 and "no checkpoint_N.pt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


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
