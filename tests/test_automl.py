"""`mlhpc automl`: AIPerf's AutoML search on an Optuna study (mlhpc/automl/). Bad input is one
line naming the key; a tiny search runs its trials as ordinary `mlhpc run`s in their own
folders and scores; a worker killed mid-trial leaves its trial failed and the search going."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from conftest import compliance_check, made_once
from mlhpc.cli import main

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "cosmoflow-automl-mini.yaml"
#: The AutoML mini shrunk to seconds: tiny data, trials of a few epochs.
TINY = ("synth.train_samples=64", "synth.eval_samples=16", "synth.samples_per_file=32",
        "train.max_epochs=4", "train.global_batch_size=8", "optimizer.base_batch_size=8",
        "optimizer.decay_schedule={}", "power.enabled=false",
        "automl.space={model.conv_channels: {low: 2, high: 8}, "
        "optimizer.base_learning_rate: {low: 0.0003, high: 0.01, log: true}}",
        "automl.startup_trials=2", "automl.heartbeat_s=2", "automl.min_duration_s=1",
        "automl.min_quality=10.0")


@pytest.fixture(scope="module")
def tiny_data() -> Path:
    def synth(data: Path) -> None:
        args = [sys.executable, "-m", "mlhpc", "data", "synth", "cosmoflow", "--out", str(data),
                "--config", str(MINI)]
        for o in TINY[:3]:
            args += ["--set", o]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
    return made_once("automl-tiny-cosmoflow", synth)


def sets(*overrides: str) -> list[str]:
    return [part for o in overrides for part in ("--set", o)]


def tiny_args(data: Path, out: Path, budget_s: float, *extra: str) -> list[str]:
    return [str(MINI), *sets(*TINY, f"data.path={data}", "data.synthesize_if_missing=false",
                             f"output.dir={out}", f"automl.budget_s={budget_s}",
                             f"automl.mark_every_s={budget_s / 3:.3f}", *extra)]


def mlhpc(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlhpc", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "MLHPC_STORE": "none", **(env or {})})


def study_trials(out: Path) -> list:
    import optuna
    from optuna.storages.journal import JournalFileBackend

    storage = optuna.storages.JournalStorage(JournalFileBackend(str(out / "study.journal")))
    return optuna.load_study(study_name=out.name, storage=storage).get_trials(deepcopy=False)


@pytest.mark.parametrize("override, named", [
    ("automl.space={model.conv_chanels: {low: 2, high: 6}}", "automl.space.model.conv_chanels"),
    ("automl.space={model.conv_channels: {low: 6, high: 2}}", "automl.space.model.conv_channels"),
    ("automl.space={model.conv_channels: {low: 4, high: 4}}", "automl.space.model.conv_channels"),
    ("automl.space={model.conv_channels: {choices: []}}", "automl.space.model.conv_channels"),
    ("automl.space={model.conv_channels: {low: 0, high: 6}}", "automl.space.model.conv_channels.low"),
    ("automl.budget_s=0", "automl.budget_s"),
    ("automl.mark_every_s=1000", "mark_every_s"),
    ("automl.storage=/nonexistent-folder/study.journal", "automl.storage"),
    ("automl.storage=nosuchdriver://host/db", "automl.storage"),
])
def test_bad_input_is_one_line_naming_the_key(tmp_path, override, named):
    out = tmp_path / "search"
    args = [str(MINI), *sets(f"output.dir={out}", f"data.path={tmp_path / 'no-data'}",
                             "data.synthesize_if_missing=false", "automl.budget_s=600",
                             "automl.mark_every_s=60", override)]
    result = CliRunner().invoke(main, ["automl", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error:") and named in lines[0], lines
    assert not (out / "study.json").exists()


def test_a_config_without_a_search_is_refused(tmp_path):
    result = CliRunner().invoke(main, ["automl", str(ROOT / "configs" / "cosmoflow-mini.yaml"),
                                       "--set", f"output.dir={tmp_path}"])
    assert result.exit_code == 2 and "automl: section missing" in result.stderr


def test_knobs_lists_the_workloads_declared_knobs():
    result = CliRunner().invoke(main, ["automl", str(MINI), "--knobs"])
    assert result.exit_code == 0
    assert "model.conv_channels" in result.output and "train.global_batch_size" in result.output


def test_a_tiny_search_runs_its_trials_as_runs_and_scores(tmp_path, tiny_data):
    out, store = tmp_path / "search", tmp_path / "results.db"
    proc = mlhpc("automl", *tiny_args(tiny_data, out, 12), "--workers", "2", env={"MLHPC_STORE": str(store)})
    assert proc.returncode == 0, proc.stderr + proc.stdout
    trials = study_trials(out)
    assert len(trials) >= 2 and {t.user_attrs["worker"] for t in trials} and len(
        {t.user_attrs["worker"] for t in trials}) == 2  # both workers took trials from one study
    assert trials[0].params == {"model.conv_channels": 8, "optimizer.base_learning_rate": 0.001}  # the seed trial
    for t in trials:
        folder = out / f"trial_{t.number:04d}"
        record = json.loads((folder / "trial.json").read_text())
        assert record["state"] == t.state.name
        # a run stopped by the budget before its first evaluation may have no log; every other has one
        assert (folder / "result_0.txt").is_file() or (record["state"] == "FAIL" and record["stopped"] == "budget")
        assert "automl" not in yaml.safe_load((folder / "trial.yaml").read_text())
    logged = sorted(str(p) for p in out.glob("trial_*/result_0.txt"))
    stored = mlhpc("results", "list", "--campaign", out.name, "--format", "json", "--store", str(store))
    assert stored.returncode == 0, stored.stderr
    assert len(json.loads(stored.stdout)) == len(logged) > 0  # every trial's run recorded under the study's name
    report = mlhpc("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    score = json.loads(report.stdout)
    assert [m["elapsed_s"] for m in score["marks"]] == pytest.approx([4.0, 8.0, 12.0], abs=1e-3)
    assert score["marks"][-1]["total_flops"] > 0 and score["valid"] is True
    assert "AutoML study" in proc.stdout  # the launcher ends with the score


def _running_trial_of(out: Path, pid: int, timeout_s: float = 60) -> int:
    """The number of the trial worker ``pid`` is running once its log has an evaluation."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if (out / "study.journal").exists():
            for t in study_trials(out):
                log = out / f"trial_{t.number:04d}" / "result_0.txt"
                if (t.state.name == "RUNNING" and t.user_attrs.get("worker", "").endswith(f":{pid}")
                        and log.exists() and "eval_error" in log.read_text()):
                    return t.number
        time.sleep(0.2)
    raise AssertionError("no running trial with an evaluation")


def test_a_killed_worker_leaves_its_trial_failed_and_the_search_going(tmp_path, tiny_data):
    out = tmp_path / "search"
    args = tiny_args(tiny_data, out, 20, "train.max_epochs=40")
    assert mlhpc("automl", *args, "--prepare").returncode == 0
    env = {**os.environ, "MLHPC_STORE": "none"}
    workers = [subprocess.Popen([sys.executable, "-m", "mlhpc", "automl", *args, "--worker"], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(2)]
    try:
        number = _running_trial_of(out, workers[0].pid)
        workers[0].send_signal(signal.SIGKILL)
        assert workers[1].wait(timeout=120) == 0
    finally:
        for w in workers:
            w.kill()
            w.wait()
    assert mlhpc("automl", *args, "--finish").returncode in (0, 1)
    states = {t.number: t.state.name for t in study_trials(out)}
    assert states[number] == "FAIL"
    others = [n for n in states if n != number]
    records = {n: json.loads((out / f"trial_{n:04d}" / "trial.json").read_text()) for n in others}
    # the surviving worker's trials ended as trials do; one started just before the budget's end may
    # have been stopped before its first evaluation (FAIL, stopped by the budget)
    assert others and all(states[n] in ("COMPLETE", "PRUNED") or records[n]["stopped"] == "budget"
                          for n in others), (states, records)
    log = (out / f"trial_{number:04d}" / "result_0.txt").read_text()
    assert "eval_error" in log and "run_stop" in log  # its run was stopped with its parent, log closed


@pytest.mark.slow
@pytest.mark.timeout(1500)  # a 15-minute search after its data's synthesis; pytest's default is 900 s
def test_the_automl_mini_scores_and_its_best_trial_passes_the_checker(tmp_path):
    """The done-when of the AutoML mini: on a fresh folder (its data synthesised first) the search
    exits 0 (its gates passed) within 20 minutes, every trial that evaluated wrote its own log, and
    the best trial's log passes MLCommons' compliance checker."""
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "automl", str(MINI), "--workers", "2"],
                          capture_output=True, text=True, timeout=1500, cwd=tmp_path,
                          env={**os.environ, "MLHPC_STORE": "none"})
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    assert time.perf_counter() - began < 20 * 60
    out = tmp_path / "results" / "cosmoflow-automl-mini"
    records = [json.loads(p.read_text()) for p in sorted(out.glob("trial_*/trial.json"))]
    assert len(records) >= 4
    for r in records:
        assert not r["evaluations"] or (out / f"trial_{r['number']:04d}" / "result_0.txt").is_file()
    score = json.loads(mlhpc("report", str(out), "--format", "json").stdout)
    assert score["valid"] and len(score["marks"]) == 5
    qualities = [m["best_quality"] for m in score["marks"] if m["best_quality"] is not None]
    assert qualities == sorted(qualities, reverse=True)  # eval_error: the best only improves
    best = Path(score["best_trial"]["log"])
    check = compliance_check(best)
    assert check.returncode == 0 and "SUCCESS" in check.stdout + check.stderr, check.stdout + check.stderr


@pytest.mark.cluster
def test_a_trial_at_two_ranks_is_a_torchrun_of_its_own(tmp_path, tiny_data):
    """automl.ranks_per_trial: each trial is `torchrun --standalone` with that many ranks, its
    run data-parallel over them (its side file says world size 2)."""
    out = tmp_path / "search"
    proc = mlhpc("automl", *tiny_args(tiny_data, out, 20, "automl.ranks_per_trial=2",
                                      "automl.trial_threads=2"), "--workers", "1")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    measured = [json.loads(p.read_text()) for p in out.glob("trial_*/measured_0.json")]
    assert measured and all(m["world_size"] == 2 for m in measured)


def test_a_trial_past_run_stop_is_not_signalled_at_the_budget(tmp_path):
    """A trial whose log holds run_stop is writing its files and recording itself in the store:
    the budget's SIGTERM would cut that short (it once left a finished trial out of the store), so
    the worker lets it end by itself."""
    from mlhpc.automl.trial import Watch, run_trial

    log = tmp_path / "result_0.txt"
    script = ("import pathlib, sys, time\n"
              "pathlib.Path(sys.argv[1]).write_text(':::MLLOG {\"key\": \"eval_error\", \"value\": 0.5}\\n'\n"
              "    ':::MLLOG {\"key\": \"run_stop\", \"value\": null}\\n')\n"
              "time.sleep(4)\n")
    watch = Watch(folder=tmp_path, metric_key="eval_error", deadline_unix_s=time.time() + 2,
                  heartbeat_s=60, report=lambda value, step: False, beat=lambda: None,
                  asked_to_stop=lambda: None)
    out = os.open(tmp_path / "output.txt", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        began = time.time()
        run = run_trial([sys.executable, "-c", script, str(log)], dict(os.environ), out, watch)
    finally:
        os.close(out)
    assert run.exit_status == 0 and run.stopped is None and run.values == [0.5]
    assert time.time() - began >= 4
