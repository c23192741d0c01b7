"""AIPerf's score of an AutoML folder (mlhpc/report/automl.py) and `mlhpc report FOLDER` on it.

The folder is made by hand: study.json and three trials with MLLOG records at chosen times;
every expected number below is worked out here in plain arithmetic, not by the module."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.report.automl import score_folder

START = 1_700_000_000.0  # the search's start, Unix seconds
MARK = 100.0


def _line(t_s: float, key: str, value=None, epoch: int | None = None) -> str:
    record = {"namespace": "", "time_ms": (START + t_s) * 1000.0, "event_type": "POINT_IN_TIME",
              "key": key, "value": value, "metadata": {} if epoch is None else {"epoch_num": epoch}}
    return ":::MLLOG " + json.dumps(record) + "\n"


def _trial(root: Path, number: int, records: list[tuple], measured: dict | None, config: str,
           state: str = "COMPLETE") -> Path:
    folder = root / f"trial_{number:04d}"
    folder.mkdir()
    (folder / "result_0.txt").write_text("".join(_line(*r) for r in records))
    (folder / "config_0.yaml").write_text(config)
    (folder / "trial.yaml").write_text("train:\n  lr: 0.1\n")
    (folder / "trial.json").write_text(json.dumps({"number": number, "state": state, "params": {"lr": 0.1}}))
    if measured is not None:
        (folder / "measured_0.json").write_text(json.dumps({"perf": measured}))
    return folder


def make_folder(root: Path, ended_s: float | None = 350.0, gates: dict | None = None,
                precision_1: str = "bf16", direction: str = "min") -> Path:
    """Three trials of an error metric (eval_error, smaller is better):

    - trial 0: a pass is the log's train_samples (64) samples; epochs end at 50 s and 150 s,
      evaluations (32 samples) at 55 s and 152 s with eval_error 0.30 and 0.20; run_stop 160 s.
    - trial 1: eval_every_steps 3 x global_batch_size 8 = 24 samples an epoch (its log's
      train_samples, 1000, is not the count); epochs end at 120 s and 220 s, evaluations (16
      samples) at 125 s and 230 s, eval_error 0.15 both times; run_stop 240 s.
    - trial 2: killed: no run_stop, no measured_0.json; eval_error 0.10 at 270 s.
    """
    folder = root / "study"
    folder.mkdir()
    study = {"format": "mlhpc-automl-study/1", "study_name": "s1", "workload": "someworkload",
             "metric_key": "eval_error", "direction": direction, "target": 0.124,
             "started_unix_s": START, "ended_unix_s": None if ended_s is None else START + ended_s,
             "budget_s": 400.0, "mark_every_s": MARK,
             "gates": gates or {"min_duration_s": 300.0, "min_quality": 0.12},
             "storage": "journal:study.journal", "config": "automl.yaml"}
    (folder / "study.json").write_text(json.dumps(study))
    plain = "train:\n  global_batch_size: 4\n  eval_every_steps: null\n"
    _trial(folder, 0, [(0, "train_samples", 64), (0, "eval_samples", 32), (5, "run_start"),
                       (50, "epoch_stop", None, 1), (55, "eval_stop", None, 1), (55, "eval_error", 0.30, 1),
                       (150, "epoch_stop", None, 2), (152, "eval_stop", None, 2), (152, "eval_error", 0.20, 2),
                       (160, "run_stop", None, 2)],
           {"train_flops_per_sample": 1e9, "forward_flops_per_sample": 4e8, "precision": "fp32"}, plain)
    _trial(folder, 1, [(100, "train_samples", 1000), (100, "eval_samples", 16), (101, "run_start"),
                       (120, "epoch_stop", None, 1), (125, "eval_stop", None, 1), (125, "eval_error", 0.15, 1),
                       (220, "epoch_stop", None, 2), (230, "eval_stop", None, 2), (230, "eval_error", 0.15, 2),
                       (240, "run_stop", None, 2)],
           {"train_flops_per_sample": 2e9, "forward_flops_per_sample": 5e8, "precision": precision_1},
           "train:\n  global_batch_size: 8\n  eval_every_steps: 3\n")
    _trial(folder, 2, [(250, "train_samples", 64), (250, "eval_samples", 32), (251, "run_start"),
                       (260, "epoch_stop", None, 1), (265, "eval_stop", None, 1), (270, "eval_error", 0.10, 1)],
           None, plain, state="FAIL")
    return folder


# FLOPs each counted event adds, by hand.
T0_EPOCH, T0_EVAL = 1e9 * 64, 4e8 * 32
T1_EPOCH, T1_EVAL = 2e9 * (3 * 8), 5e8 * 16


def test_marks_match_the_hand_worked_arithmetic(tmp_path):
    data = score_folder(make_folder(tmp_path)).to_dict()
    flops = {100.0: T0_EPOCH + T0_EVAL,
             200.0: 2 * (T0_EPOCH + T0_EVAL) + T1_EPOCH + T1_EVAL,
             300.0: 2 * (T0_EPOCH + T0_EVAL) + 2 * (T1_EPOCH + T1_EVAL)}
    best = {100.0: 0.30, 200.0: 0.15, 300.0: 0.10}
    trials = {100.0: 0, 200.0: 1, 300.0: 2}
    assert [m["elapsed_s"] for m in data["marks"]] == [100.0, 200.0, 300.0]  # 400 > 350 s, no fourth
    for mark in data["marks"]:
        m = mark["elapsed_s"]
        assert mark["trials"] == trials[m]
        assert mark["best_quality"] == best[m]
        assert mark["error"] == best[m]  # an error metric is its own Error
        assert mark["total_flops"] == pytest.approx(flops[m], rel=1e-12)
        assert mark["score_flop_per_s"] == pytest.approx(flops[m] / m, rel=1e-12)
        assert mark["regulated_score_flop_per_s"] == pytest.approx(flops[m] * math.log(1 / best[m]) / m, rel=1e-12)
    assert data["duration_s"] == 350.0
    assert data["error_is"] == "eval_error"
    assert data["trials"] == {"total": 3, "without_flops": 1}
    assert all(g["passed"] for g in data["gates"]) and data["valid"] is True
    best_trial = data["best_trial"]
    assert best_trial["number"] == 2 and best_trial["quality"] == 0.10  # a killed trial's quality counts
    assert best_trial["config"].endswith("trial_0002/trial.yaml") and Path(best_trial["config"]).is_file()
    assert best_trial["state"] == "FAIL" and best_trial["params"] == {"lr": 0.1}


def test_without_an_end_the_search_lasts_to_its_last_event(tmp_path):
    data = score_folder(make_folder(tmp_path, ended_s=None)).to_dict()
    assert data["duration_s"] == pytest.approx(270.0)
    assert [m["elapsed_s"] for m in data["marks"]] == [100.0, 200.0]
    assert "last logged event" in data["gates"][0]["reason"]


def test_the_first_trial_to_log_the_best_quality_is_the_best(tmp_path):
    folder = make_folder(tmp_path, ended_s=250.0)  # trial 2's 0.10 comes after the end: not counted
    data = score_folder(folder).to_dict()
    assert data["best_trial"]["number"] == 1 and data["best_trial"]["elapsed_s"] == pytest.approx(125.0)
    assert data["marks"][-1]["best_quality"] == 0.15


def test_an_accuracy_metric_scores_with_one_minus_it(tmp_path):
    folder = make_folder(tmp_path, direction="max", gates={"min_duration_s": 0.0, "min_quality": 0.25})
    data = score_folder(folder).to_dict()
    best = {100.0: 0.30, 200.0: 0.30, 300.0: 0.30}  # larger is better: 0.30 stays best
    assert data["error_is"] == "1 - eval_error"
    for mark in data["marks"]:
        error = 1 - best[mark["elapsed_s"]]
        assert mark["error"] == pytest.approx(error)
        assert mark["regulated_score_flop_per_s"] == pytest.approx(
            mark["total_flops"] * math.log(1 / error) / mark["elapsed_s"], rel=1e-12)
    assert data["best_trial"]["number"] == 0
    assert next(g for g in data["gates"] if g["name"] == "quality")["passed"] is True


@pytest.mark.parametrize("gates, precision, failing", [
    ({"min_duration_s": 3600.0, "min_quality": 0.12}, "bf16", "duration"),
    ({"min_duration_s": 300.0, "min_quality": 0.05}, "bf16", "quality"),
    ({"min_duration_s": 300.0, "min_quality": 0.12}, "fp8", "precision"),
])
def test_each_gate_fails_alone(tmp_path, gates, precision, failing):
    data = score_folder(make_folder(tmp_path, gates=gates, precision_1=precision)).to_dict()
    verdicts = {g["name"]: g["passed"] for g in data["gates"]}
    assert verdicts == {"duration": failing != "duration", "quality": failing != "quality",
                        "precision": failing != "precision"}
    assert data["valid"] is False
    reason = next(g["reason"] for g in data["gates"] if g["name"] == failing)
    assert {"duration": "3,600 s", "quality": "0.05", "precision": "trial 1"}[failing] in reason


def test_no_precision_measured_passes_with_a_note(tmp_path):
    folder = make_folder(tmp_path)
    for trial in ("trial_0000", "trial_0001"):
        (folder / trial / "measured_0.json").unlink()
    score = score_folder(folder)
    data = score.to_dict()
    assert sum("trial_0001" in w and "0 FLOPs" in w for w in score.warnings) == 1  # finished, yet no file
    assert not any("trial_0002" in w for w in score.warnings)  # killed: no file is expected
    gate = next(g for g in data["gates"] if g["name"] == "precision")
    assert gate["passed"] and "nothing to check" in gate["reason"]
    assert data["trials"]["without_flops"] == 3 and data["marks"][-1]["total_flops"] == 0.0
    assert data["marks"][-1]["regulated_score_flop_per_s"] == 0.0


def test_links_out_of_the_folder_are_skipped_with_a_warning(tmp_path):
    folder = make_folder(tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "result_0.txt").write_text(_line(10, "eval_error", 0.01))
    (folder / "trial_0003").symlink_to(outside)
    (folder / "trial_0004").mkdir()
    (folder / "trial_0004" / "result_0.txt").symlink_to(outside / "result_0.txt")
    score = score_folder(folder)
    assert score.best_trial is not None and score.best_trial.quality == 0.10  # 0.01 never read
    assert any("trial_0003" in w and "link" in w for w in score.warnings)
    assert any("trial_0004" in w and "skipped" in w for w in score.warnings)


# ---- through the command line ---------------------------------------------------------------------


def _report(*args: str):
    return CliRunner().invoke(main, ["report", *args])


def test_report_table_shows_marks_gates_and_the_best_config(tmp_path):
    folder = make_folder(tmp_path)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(main, ["report", str(folder)])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for text in ("Regulated score", "Best quality", "0:03:20", "PASS", "precision", "Error is eval_error",
                 "GFLOP/s", "trial_0002/trial.yaml", "valid: yes"):
        assert text in out, text
    assert f"{(T0_EPOCH + T0_EVAL) / 100 / 1e6:.3g} MFLOP/s" in out  # 768 MFLOP/s at the first mark


def test_report_json_csv_markdown(tmp_path):
    folder = make_folder(tmp_path, gates={"min_duration_s": 3600.0, "min_quality": 0.12})
    data = json.loads(_report(str(folder), "--format", "json").stdout)
    assert data["study"] == "s1" and data["valid"] is False and len(data["marks"]) == 3
    assert {"workload", "metric_key", "direction", "started_unix_s", "duration_s"} <= set(data)
    lines = _report(str(folder), "--format", "csv").stdout.splitlines()
    assert lines[0] == ("elapsed_s,trials,best_quality,error,total_flops,score_flop_per_s,"
                        "regulated_score_flop_per_s")
    assert len(lines) == 4 and lines[1].startswith("100.0,0,0.3,0.3,")
    md = _report(str(folder), "--format", "markdown").stdout
    assert "| Time | Trials |" in md and "| duration | FAIL |" in md


def test_report_plots_write_the_png(tmp_path):
    folder = make_folder(tmp_path)
    result = _report(str(folder), "--plots", str(tmp_path / "plots"))
    png = tmp_path / "plots" / "automl-scores.png"
    assert result.exit_code == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {png}" in result.stderr


def _study(folder: Path) -> dict:
    return json.loads((folder / "study.json").read_text())


@pytest.mark.parametrize("change, named", [
    (lambda d: d.pop("metric_key"), "key 'metric_key'"),
    (lambda d: d.update(mark_every_s="soon"), "key 'mark_every_s'"),
    (lambda d: d.update(gates={"min_quality": 0.1}), "key 'gates.min_duration_s'"),
    (lambda d: d.update(direction="up"), "key 'direction'"),
    (lambda d: d.update(mark_every_s=0), "key 'mark_every_s'"),
    (lambda d: d.update(mark_every_s=1e-3), "key 'mark_every_s'"),  # 350,000 marks
])
def test_a_bad_study_key_is_one_line_naming_it(tmp_path, change, named):
    folder = make_folder(tmp_path)
    data = _study(folder)
    change(data)
    (folder / "study.json").write_text(json.dumps(data))
    result = _report(str(folder))
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "study.json" in result.stderr and named in result.stderr


@pytest.mark.parametrize("content", [b"[1, 2]", b"{\"format\": \"mlhpc-automl-study/1\", \"x\": \"\xff\"}",
                                     b"{not json", b" " * (2 << 20)])
def test_a_study_file_that_is_no_object_is_one_line(tmp_path, content):
    folder = make_folder(tmp_path)
    (folder / "study.json").write_bytes(content)
    result = _report(str(folder), "--format", "json")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "study.json" in result.stderr


def test_a_fifo_study_file_is_refused_not_waited_on(tmp_path):
    folder = make_folder(tmp_path)
    (folder / "study.json").unlink()
    os.mkfifo(folder / "study.json")
    result = _report(str(folder))
    assert result.exit_code == 2 and "study.json" in result.stderr and result.stderr.count("\n") == 1


def test_an_automl_folder_is_reported_alone(tmp_path):
    folder = make_folder(tmp_path)
    mixed = _report(str(folder), str(folder / "trial_0000"))
    assert mixed.exit_code == 2 and "reported alone" in mixed.stderr and mixed.stderr.count("\n") == 1
    packaged = _report(str(folder), "--package", str(tmp_path / "pkg"))
    assert packaged.exit_code == 2 and "--package" in packaged.stderr
    assert not (tmp_path / "pkg").exists()


def test_python_m_mlhpc_report_json(tmp_path):
    folder = make_folder(tmp_path)
    done = subprocess.run([sys.executable, "-m", "mlhpc", "report", str(folder), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["marks"][0]["trials"] == 0
