"""mlhpc report's scoring as values: each step returns what it computes and changes nothing it
is given; the folder's kind is decided once; the ruleset comes from `mlhpc.rules`; only the
side files mlhpc writes per run (``summary_N.json``, ...) are read."""

from __future__ import annotations

import shutil
from dataclasses import FrozenInstanceError
from pathlib import Path

import pytest

from mlhpc import rules
from mlhpc.errors import ConfigError
from mlhpc.log.facts import RunSummary, Submission
from mlhpc.report import compliance
from mlhpc.report.compliance import FolderCheck, folder_check, ruleset_for, run_check
from mlhpc.report.energy import RunPower, folder_energy, run_power
from mlhpc.report.folders import Layout, layout_of, read_log, run_target, sidecars
from mlhpc.report.reported import ReportedRun, report_run
from mlhpc.report.score import FolderResult, folder_kind, judge, score_folder, score_strong, score_weak
from mlhpc.report.validflops import ValidFlops, folder_valid_flops, run_valid_flops

MINI_RUNS = Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs"


@pytest.fixture
def runs_folder(tmp_path) -> Path:
    folder = tmp_path / "runs"
    shutil.copytree(MINI_RUNS, folder)
    return folder


def test_the_steps_return_new_values_and_change_nothing_they_are_given(runs_folder):
    logs = [read_log(path, own=True) for path in sorted(runs_folder.glob("result_*.txt"))]
    before = [log.facts.to_dict() for log in logs]
    checks = [run_check(log.parsed, FolderCheck(True, rules.ruleset().version)) for log in logs]
    runs = [report_run(log.facts, log.path, log.parsed.events, check, 5.0) for log, check in zip(logs, checks)]
    verdicts = judge(logs, runs, checks, weak_layout=False)
    assert [log.facts.to_dict() for log in logs] == before  # the runs read are not touched
    assert all(log.facts.to_dict()["compliant"] is None for log in logs)
    assert all(isinstance(run.compliant, bool) for run in verdicts.runs)  # the verdicts are on the new runs
    assert [run.facts for run in verdicts.runs] == [log.facts for log in logs]  # the facts held as read
    assert [c.run for c in verdicts.counted] == [r for r in verdicts.runs if r.facts.path not in verdicts.dropped]
    run, path, events = logs[0].facts, logs[0].path, logs[0].parsed.events
    power = run_power(path, events)
    assert isinstance(power, RunPower) and isinstance(run_valid_flops(run, power.mean_power_w, path, events), ValidFlops)
    with pytest.raises(FrozenInstanceError):
        run.timing.status = "success"  # type: ignore[misc]
    assert [log.facts.to_dict() for log in logs] == before
    first = score_folder(runs_folder, sorted(runs_folder.glob("result_*.txt")))
    again = score_folder(runs_folder, sorted(runs_folder.glob("result_*.txt")))
    assert first.to_dict() == again.to_dict() and first.kind == "runs"


def test_the_folder_kind_is_decided_once_from_the_layout_and_the_instances():
    own, weak = Layout("runs"), layout_of(Path("r/Org/results/sys/weak/deepcam"))
    assert weak == Layout("weak", "r", "Org", "sys", "deepcam")
    one = [RunSummary("a", Submission(instance_id=None)), RunSummary("b", Submission(instance_id=None))]
    two = [RunSummary("a", Submission(instance_id=0)), RunSummary("b", Submission(instance_id=1))]
    assert folder_kind(own, one) == "runs" and folder_kind(own, two) == "weak"
    assert folder_kind(Layout("strong"), two) == "strong" and folder_kind(weak, one) == "weak"
    v07 = layout_of(Path("hpc_results_v0.7/Org/results/sys/deepcam"))
    assert v07.v07 and v07.scaling == "strong" and v07.round == "hpc_results_v0.7"


def test_scores_energy_and_valid_flops_are_values():
    assert score_strong([5.0, 1.0, 3.0, 2.0, 4.0], 0, 1, 2.0).olympic_min == pytest.approx(6.0)
    assert score_strong([5.0, 1.0, 3.0, 2.0, 4.0], 0, 1, 2.0).raw_olympic_min == pytest.approx(3.0)
    assert score_strong([1.0, 2.0], 2, 1, 1.0).notes == ("invalid: 2 runs dropped (at most 1 allowed)",)
    weak = score_weak([(0.0, 60_000.0), (30_000.0, 120_000.0)], 4, 2, {"number_of_nodes": 4})
    assert (weak.ttta_min, weak.models_per_min, weak.number_of_models) == (2.0, 1.0, 2)
    assert weak.notes == ("warning: 2 models x 4 nodes each (instance scale as logged) exceed the 4 nodes "
                          "of the system description",)
    assert score_weak([], None, 1, {}).notes == ("not enough converging weak-scaling runs: 0 < 1",)
    runs = [ReportedRun(RunSummary(path), RunPower(energy_to_train_j=joules))
            for path, joules in (("a", 10.0), ("b", 30.0), ("c", 20.0))]
    power = [run.power for run in runs]
    counted = [(power[0], 0.0, 1.0), (power[1], 0.0, 3.0), (power[2], 0.0, 2.0)]
    assert folder_energy(counted, power, "strong", 0, 1, 1.5).energy_j == pytest.approx(30.0)
    assert folder_energy(counted, power, "weak", 0, 1, 1.5).energy_j == pytest.approx(25.0)
    assert folder_valid_flops(runs, "strong", None) == (None, None)


def test_the_ruleset_comes_from_the_rules():
    assert compliance.DEFAULT_RULESET == rules.ruleset().version == rules.CURRENT
    assert compliance.supported_rulesets() == ("1.0.0", "2.0.0", "3.0.0")  # mlperf-logging 4.1 ships these
    assert FolderResult(path="x", kind="runs").ruleset == rules.ruleset().version
    assert ruleset_for("results/cosmoflow-mini") == rules.ruleset().version
    with pytest.raises(ConfigError, match=r"--ruleset 0.7.0: expected one of 1.0.0, 2.0.0, 3.0.0"):
        ruleset_for("x", "0.7.0")
    v07 = folder_check(Path("hpc_results_v0.7/Org/results/sys/deepcam"), "hpc_results_v0.7", True, None, True)
    assert v07.ruleset is None and v07.note.startswith("not checked: no ruleset for round v0.7 in mlperf-logging ")


def test_only_the_side_files_of_the_run_are_read(runs_folder):
    log = runs_folder / "result_0.txt"
    assert sidecars(log, "summary", ".json") == [runs_folder / "summary_0.json"]
    assert run_target(log) == 0.124
    (runs_folder / "summary_0.json").rename(runs_folder / "summary.json")  # no folder-wide file is read
    (runs_folder / "env_0.json").rename(runs_folder / "env.json")
    assert sidecars(log, "summary", ".json") == [] and run_target(log) is None
    assert sidecars(log, "env", ".json") == []
