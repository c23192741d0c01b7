"""`mlhpc report` against MLCommons' own tools, run as a reviewer runs them.

mlperf_logging's ``rcp_checker`` and ``package_checker`` command lines run on scratch copies of
published result folders (tests/data/mlperf-hpc-results) and of edge cases made from them
(two runs not converged, a batch below the smallest RCP, open division, resumed logs); the report
must give the same verdicts, messages and factors. The official scores of every result are
checked in tests/test_report.py (expected_scores.csv, result_summarizer 4.1.68).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.report import build_report, render
from mlhpc.report.cli import report_command
from mlhpc.report.score import score_folder

V3 = "hpc_results_v3.0"
PUBLISHED = {
    "factor": "NVIDIA/results/eos_n260_ngc23.09_pytorch/strong/openfold",  # converges faster: 1.0722
    "fail": "HPE+LBNL/results/perlmutter_224x4/strong/openfold",  # RCP Interpolation, FAILED
    "smaller": "TACC/results/lonestar6-pytorch/strong/openfold",  # batch 96 below the smallest RCP
    "interp": "Clemson/results/18xR750-2xA100-PCIe-80GB/strong/deepcam",
}
DEEPCAM = "HPE+LBNL/results/perlmutter_512x4/strong/deepcam"


def official_rcp(folder: Path, ruleset: str = "3.0.0") -> tuple[bool, str]:
    """``python -m mlperf_logging.rcp_checker`` on ``folder``: (passed, its message)."""
    log = folder.parent / f"rcp_checker-{folder.name}.log"
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.rcp_checker", str(folder), "--rcp_usage", "hpc",
                           "--rcp_version", ruleset, "--log_output", str(log)],
                          capture_output=True, text=True, timeout=120, cwd=folder.parent)
    final = [line for line in log.read_text().splitlines() if "RCP test" in line][-1]
    message = re.sub(r"^(INFO|ERROR) - ", "", final).split(", RCP test")[0]
    return proc.returncode == 0, message


def _copy(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def _edit(folder: Path, edit) -> None:  # type: ignore[no-untyped-def]
    for log in sorted(folder.glob("result_*.txt")):
        log.write_text(edit(log.name, log.read_text()))


def _tree(tmp_path: Path, name: str) -> Path:
    """A result folder in the MLCommons layout under ``tmp_path`` (round v3.0)."""
    return tmp_path / V3 / "Made" / "results" / name / "strong"


def test_rcp_verdicts_equal_rcp_checker_on_published_folders(mlperf_results, tmp_path):
    for case, rel in PUBLISHED.items():
        folder = _copy(mlperf_results / V3 / rel, _tree(tmp_path, case) / rel.rsplit("/", 1)[-1])
        passed, message = official_rcp(folder)
        mine = score_folder(folder, sorted(folder.glob("result_*.txt")))
        assert (mine.rcp.passed, mine.rcp.message) == (passed, message), case
    # the figures the issue quotes, from the checker itself
    factor = score_folder(mlperf_results / V3 / PUBLISHED["factor"],
                          sorted((mlperf_results / V3 / PUBLISHED["factor"]).glob("result_*.txt")))
    assert factor.olympic_min == pytest.approx(7.51, abs=0.005)  # published: no scaling.json
    assert factor.rcp.normalization == pytest.approx(1.0722, abs=1e-4)
    assert factor.normalized_min == pytest.approx(8.05, abs=0.005)


def test_two_runs_not_converged_fail_as_in_rcp_checker(mlperf_results, tmp_path):
    folder = _copy(mlperf_results / V3 / DEEPCAM, _tree(tmp_path, "aborted") / "deepcam")
    aborted = {"result_1.txt", "result_2.txt"}
    _edit(folder, lambda name, text: text.replace('"status": "success"', '"status": "aborted"')
          if name in aborted else text)
    passed, message = official_rcp(folder)
    assert (passed, message) == (False, "Insufficient convergence")
    mine = score_folder(folder, sorted(folder.glob("result_*.txt")))
    assert (mine.rcp.passed, mine.rcp.message) == (passed, message)
    assert mine.rcp.mean_epochs is None and mine.normalized_min is None
    row = next(r for r in __import__("csv").DictReader(render(build_report([folder]), "csv").splitlines()))
    assert row["rcp_pass"] == "False" and row["rcp_message"] == "Insufficient convergence"


def test_batch_below_the_smallest_rcp_as_in_rcp_checker(mlperf_results, tmp_path):
    folder = _copy(mlperf_results / V3 / DEEPCAM, _tree(tmp_path, "small") / "deepcam")
    _edit(folder, lambda _, text: re.sub(r'("key": "global_batch_size", "value": )\d+', r"\g<1>8", text))
    passed, message = official_rcp(folder)
    assert message.startswith(("Missing RCP", "RCP not found but slower convergence"))
    mine = score_folder(folder, sorted(folder.glob("result_*.txt")))
    assert (mine.rcp.passed, mine.rcp.message) == (passed, message)
    assert mine.rcp.global_batch_size == 8


def test_open_division_gets_no_rcp_verdict_as_in_the_official_tools(mlperf_results, tmp_path):
    folder = _copy(mlperf_results / V3 / DEEPCAM, _tree(tmp_path, "open") / "deepcam")
    _edit(folder, lambda _, text: text.replace('"value": "closed"', '"value": "open"'))
    mine = score_folder(folder, sorted(folder.glob("result_*.txt")))
    assert mine.division == "open" and mine.rcp.passed is None and "open division" in mine.rcp.message
    assert mine.normalized_min is None and mine.olympic_min is not None
    text = render(build_report([folder]), "table")
    assert "open" in text and "RCP -" in text


def test_resumed_log_is_kept_apart_and_refused_by_package(mlperf_results, tmp_path):
    folder = _copy(mlperf_results / V3 / DEEPCAM, _tree(tmp_path, "resumed") / "deepcam")
    log = folder / "result_3.txt"
    log.write_text(log.read_text() + ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                   '"key": "resume", "value": null, "metadata": {}}\n')
    mine = score_folder(folder, sorted(folder.glob("result_*.txt")))
    assert mine.resumed == [str(log)] and str(log) not in mine.dropped
    assert any("resumed" in note for note in mine.notes)
    runs = _copy(folder, tmp_path / "runs")
    result = CliRunner().invoke(report_command, [str(runs), "--package", str(tmp_path / "pkg")])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1 and "resumed" in result.stderr


def test_package_fails_when_the_official_checker_fails(mlperf_results, tmp_path):
    """HPE+LBNL's closed OpenFold logs fail the RCP check: packaged without bypass, the package is
    rejected (exit 1, one line); with --rcp-bypass it is accepted, and the output says which."""
    source = mlperf_results / V3 / PUBLISHED["fail"]
    runs = tmp_path / "runs"
    runs.mkdir()
    for i, log in enumerate(sorted(source.glob("result_*.txt"))):
        shutil.copyfile(log, runs / f"result_{i}.txt")
    runner = CliRunner()
    out = runner.invoke(report_command, [str(runs), "--format", "csv", "--package", str(tmp_path / "a"),
                                         "--org", "HPE+LBNL", "--system", "perlmutter"])
    assert out.exit_code == 1, out.output
    (line,) = [l for l in out.stderr.splitlines() if "package_checker" in l]
    assert "without RCP bypass" in line and "RCP Test Failed" in line
    assert "differs from the logs' submission_platform" in out.stderr
    out = runner.invoke(report_command, [str(runs), "--format", "csv", "--package", str(tmp_path / "b"),
                                         "--rcp-bypass"])
    assert "package_checker (with --rcp-bypass)" in out.stderr
    assert (tmp_path / "b" / "HPE+LBNL" / "benchmarks" / "openfold").is_dir()


def test_v07_layout_is_one_row_per_result_folder_not_checked(mlperf_results, tmp_path):
    """Round v0.7 has no strong/weak level. Made from v1.0 logs (full folders; the shipped v0.7 logs are one run each):
    two system folders whose logs name the same platform stay two rows, scored, 'not checked'."""
    source = mlperf_results / "hpc_results_v1.0" / "CSCS" / "results"
    root = tmp_path / "hpc_results_v0.7" / "CSCS" / "results"
    systems = sorted(p.name for p in source.iterdir() if (p / "strong" / "deepcam").is_dir())[:2]
    for system in systems:
        shutil.copytree(source / system / "strong" / "deepcam", root / system / "deepcam")
    report = build_report([tmp_path / "hpc_results_v0.7"])
    assert sorted(f.system for f in report.folders) == systems
    for f in report.folders:
        assert f.round == "hpc_results_v0.7" and f.kind == "strong" and f.ruleset is None
        assert f.olympic_min is not None and not f.dropped
        assert f.ruleset_note.startswith("not checked: no ruleset for round v0.7 in mlperf-logging ")
        assert f.rcp.passed is None
        assert all(r.compliant is None for r in f.runs)
    data = json.loads(render(report, "json"))
    assert len(data["folders"]) == 2
    assert "invalid" not in render(report, "table")


V07_PUBLISHED = Path(__file__).parent / "data" / "mlperf-hpc-results" / "hpc_results_v0.7"


def _raw_time_to_train_min(log: Path) -> float:
    """(run_stop - run_start) / 60000 from the raw MLLOG lines, independent of mlhpc's parser."""
    stamps = {}
    for line in log.read_text().splitlines():
        m = re.match(r':::MLLOG \{.*"time_ms": (\d+), .*"key": "(run_start|run_stop)"', line)
        if m:
            stamps[m.group(2)] = int(m.group(1))
    return (stamps["run_stop"] - stamps["run_start"]) / 60000


def test_v07_published_logs_one_row_per_result_folder(tmp_path):
    """Real v0.7 logs (CSCS daint n128 and n256, one published run each, see
    tests/data/mlperf-hpc-results/README.md): both logs say platform "Piz Daint GPU", yet they
    stay two rows keyed on their folders; compliance 'not checked', no RCP; each run's time to
    train equals the raw run_start/run_stop lines; one run is too few for an olympic mean."""
    root = tmp_path / "hpc_results_v0.7"
    shutil.copytree(V07_PUBLISHED, root)
    logs = sorted(root.glob("CSCS/results/*/cosmoflow/result_*.txt"))
    assert len(logs) == 2
    assert all('"key": "submission_platform", "value": "Piz Daint GPU"' in p.read_text() for p in logs)
    report = build_report([root])
    by_system = {f.system: f for f in report.folders}
    assert sorted(by_system) == ["daint_gpu_n128_tf2.2.0", "daint_gpu_n256_tf2.2.0"]
    for f in report.folders:
        assert f.round == "hpc_results_v0.7" and f.kind == "strong" and f.ruleset is None
        assert f.submitter == "CSCS" and f.benchmark == "cosmoflow" and f.division == "closed"
        assert f.ruleset_note.startswith("not checked: no ruleset for round v0.7 in mlperf-logging ")
        assert f.rcp.passed is None and f.rcp.normalization == 1.0
        assert all(r.compliant is None for r in f.runs) and not f.dropped
        (run,) = f.runs
        assert run.facts.submission.platform == "Piz Daint GPU"
        assert run.facts.timing.time_to_train_min == pytest.approx(_raw_time_to_train_min(Path(run.facts.path)), abs=1e-9)
        assert f.olympic_min is None and any("no olympic mean: 1 scored runs" in n for n in f.notes)
    assert by_system["daint_gpu_n128_tf2.2.0"].runs[0].facts.submission.global_batch_size == 256
    assert by_system["daint_gpu_n256_tf2.2.0"].runs[0].facts.submission.global_batch_size == 512
    assert by_system["daint_gpu_n128_tf2.2.0"].runs[0].facts.timing.time_to_train_min == pytest.approx(400.7682833, abs=1e-6)
    assert by_system["daint_gpu_n256_tf2.2.0"].runs[0].facts.timing.time_to_train_min == pytest.approx(291.6679167, abs=1e-6)
    data = json.loads(render(report, "json"))
    assert len(data["folders"]) == 2
    assert "invalid" not in render(report, "table")


def test_fifo_and_device_are_named_never_opened(tmp_path):
    import os

    fifo_dir = tmp_path / "runs"
    fifo_dir.mkdir()
    os.mkfifo(fifo_dir / "result_0.txt")
    runner = CliRunner()
    result = runner.invoke(report_command, [str(fifo_dir)])
    assert result.exit_code == 2 and "FIFO" in result.stderr and len(result.stderr.splitlines()) == 1
    result = runner.invoke(report_command, ["/dev/zero"])
    assert result.exit_code == 2 and "character device" in result.stderr and "no such" not in result.stderr


def test_package_onto_an_unwritable_place_is_one_line(tmp_path, mlperf_results):
    runs = tmp_path / "runs"
    shutil.copytree(mlperf_results / V3 / DEEPCAM, runs)
    result = CliRunner().invoke(report_command, [str(runs), "--package", "/proc/mlhpc-package"])
    assert result.exit_code == 2 and len(result.stderr.splitlines()) == 1
    assert "/proc/mlhpc-package: cannot create the --package destination" in result.stderr


RCP_COLUMN = {"RCP found": "Fail", "RCP Interpolation": "Interp. Fail", "Cannot find any RCPs": "No RCP"}


def _summarizer_rcp(passed: bool | None, message: str) -> str | None:
    """The RCP column result_summarizer derives from rcp_checker's verdict and message."""
    if passed is None:
        return None
    if passed:
        return "Pass"
    return RCP_COLUMN.get(message, "Missing" if "Missing" in message else "Unknown state")


@pytest.mark.parametrize("submitter", ["TACC", "Clemson"])
def test_scores_and_rcp_columns_equal_result_summarizer(mlperf_results, tmp_path, submitter):
    """``python -m mlperf_logging.result_summarizer SUBMITTER hpc 3.0.0`` on a scratch copy (it
    writes scaling.json): time to train, GBS, samples to converge, RCP and factor per result."""
    import csv

    scratch = _copy(mlperf_results / V3 / submitter, tmp_path / V3 / submitter)
    report = build_report([scratch])  # before the summarizer writes into the copy
    subprocess.run([sys.executable, "-m", "mlperf_logging.result_summarizer", f"{submitter}/", "hpc", "3.0.0",
                    "--quiet", "-csv", str(tmp_path / "out.csv")], cwd=scratch.parent, capture_output=True,
                   text=True, timeout=300, check=True)
    rows = list(csv.DictReader((tmp_path / "out_detailed.csv").open()))
    compared = 0
    for f in report.folders:
        if f.kind != "strong":
            continue
        desc_name = f.system_desc.get("system_name")
        (row,) = [r for r in rows if r["system"] == desc_name]
        b = f.benchmark
        assert float(row[f"{b}:time_to_train"]) == pytest.approx(f.olympic_min, rel=1e-12)
        assert row[f"{b}:RCP"] == _summarizer_rcp(f.rcp.passed, f.rcp.message)
        assert float(row[f"{b}:rcp_scaling_factor"]) == pytest.approx(f.rcp.normalization, rel=1e-12)
        assert float(row[f"{b}:GBS"]) == f.rcp.global_batch_size
        assert float(row[f"{b}:samples_to_converge"]) == pytest.approx(f.rcp.mean_epochs, rel=1e-12)
        compared += 1
    assert compared == {"TACC": 1, "Clemson": 2}[submitter]
