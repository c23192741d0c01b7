"""mlhpc report: official scores reproduced from the published MLPerf HPC logs, parser edge
cases, per-run phases, compliance equivalence with MLCommons' checker, rendering and plots."""

from __future__ import annotations

import csv
import json
import logging
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.errors import LogFormatError
from mlhpc.report import build_report, parse_log, parse_text, render, summarize_run
from mlhpc.report.cli import report_command
from mlhpc.report.compliance import check_run, ruleset_for
from mlhpc.report.plots import write_plots
from mlhpc.report.score import compute_olympic_average, score_folder

DATA = Path(__file__).parent / "data" / "report"
MINI_RUNS = DATA / "cosmoflow-mini-runs"


@pytest.fixture(scope="session")  # about 40 s: built once, kept while other modules run between
def round_reports(mlperf_results) -> dict[str, object]:
    return {name: build_report([mlperf_results / name]) for name in ("hpc_results_v1.0", "hpc_results_v3.0")}


def test_this_module_runs_in_its_serial_group(request):
    """Under pytest-xdist (``--dist loadgroup``) this module's tests share one worker, so the
    session fixture above is built once, not on every worker (tests/conftest.py's serial groups:
    the group shows in the node id)."""
    if not request.config.getvalue("loadgroup"):
        pytest.skip("not run by pytest-xdist with --dist loadgroup")
    assert request.node.nodeid.endswith("@published-scores"), request.node.nodeid


def _expected_rows(root: Path) -> list[dict[str, str]]:
    with open(root / "expected_scores.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def test_every_official_score_is_reproduced(round_reports, mlperf_results):
    got = {(f.round, f.submitter, f.system, f.kind, f.benchmark): f
           for report in round_reports.values() for f in report.folders}
    rows = _expected_rows(mlperf_results)
    assert len(rows) == 50
    assert len(got) == len(rows), "one scored folder per expected row, pruned_results excluded"
    for row in rows:
        f = got[(row["round"], row["submitter"], row["system"], row["mode"], row["benchmark"])]
        assert f.n_files == int(row["n_files"])
        assert f.scaling_factor == pytest.approx(float(row["scaling_factor"]), rel=1e-12)
        if row["mode"] == "strong":
            assert f.olympic_min == pytest.approx(float(row["olympic_min"]), rel=1e-9), row
        else:
            assert f.models_per_min == pytest.approx(float(row["models_per_min"]), rel=1e-9), row
            assert f.ttta_min == pytest.approx(float(row["ttta_min"]), rel=1e-9), row
            assert f.number_of_models == int(row["number_of_models"])
            assert f.instance_scale == int(row["instance_scale"])


def test_round_table_reuses_cached_verdicts_and_names_every_system(mlperf_results, round_reports,
                                                                   monkeypatch):
    """Re-reporting an unchanged tree takes every compliance verdict from the cache keyed by the
    logs' SHA-256 (the first report of the v3.0 tree runs the official checker on 1,079 logs): the
    checker itself is not called again. (How fast that is belongs to benchmarks, not here.)"""
    from mlhpc.report import compliance

    def _no_second_check(parsed, ruleset):
        raise AssertionError(f"{parsed.path}: checked again instead of read from the cache")

    monkeypatch.setattr(compliance, "_check", _no_second_check)
    report = build_report([mlperf_results / "hpc_results_v3.0"])
    text = render(report, "table")
    for system in ("eos_n64_ngc23.09_pytorch", "perlmutter_128x4", "lonestar6-pytorch"):
        assert system in text
    assert "2.10" in text and "4.627 (59 x 32)" in text  # NVIDIA cosmoflow strong / weak
    assert report.compliance_checked and not report.malformed


def test_rcp_normalization_matches_committed_scaling_json(round_reports):
    """The RCP comparison reproduces the scaling factors the review committee committed."""
    folders = {(f.submitter, f.system, f.benchmark): f for f in round_reports["hpc_results_v3.0"].folders
               if f.kind == "strong"}
    clemson = folders[("Clemson", "18xR750-2xA100-PCIe-80GB", "openfold")]
    lbnl = folders[("HPE+LBNL", "perlmutter_128x4", "oc20")]
    for folder in (clemson, lbnl):
        assert folder.rcp is not None and folder.rcp.passed
        assert folder.rcp.normalization == pytest.approx(folder.scaling_factor, rel=1e-9)
        assert folder.normalized_min == pytest.approx(folder.olympic_min, rel=1e-9)
    assert clemson.rcp.message == "RCP Interpolation" and lbnl.rcp.message == "RCP found"


def test_olympic_average_follows_result_summarizer():
    assert compute_olympic_average([5.0, 1.0, 3.0, 2.0, 4.0], dropped=0) == pytest.approx(3.0)
    # one dropped run counts as the slowest: only the fastest scored run is removed
    assert compute_olympic_average([1.0, 2.0, 3.0, 4.0], dropped=1) == pytest.approx(3.0)
    assert compute_olympic_average([1.0, 2.0], dropped=0) is None


def _log(*records: dict, prefix: str = "") -> str:
    return "".join(f"{prefix}:::MLLOG {json.dumps(r)}\n" for r in records)


def _rec(key, t, value=None, **metadata):
    return {"namespace": "", "time_ms": t, "event_type": "POINT_IN_TIME", "key": key, "value": value,
            "metadata": metadata}


def test_parser_accepts_rank_prefixes_program_output_and_events_after_run_stop(tmp_path):
    text = ("starting the job\n"
            + _log(_rec("submission_benchmark", 0, "deepcam"), prefix="  0: ")
            + "epoch 1 loss 0.3\r\n"
            + _log(_rec("run_start", 1000), _rec("epoch_start", 1000, epoch_num=1),
                   _rec("epoch_stop", 3000, epoch_num=1), _rec("eval_accuracy", 3500, 0.83, epoch_num=1),
                   _rec("run_stop", 4000, status="success"), _rec("epoch_start", 4000, epoch_num=2),
                   _rec("epoch_stop", 9000, epoch_num=2), prefix="12: [host] "))
    path = tmp_path / "result_0.txt"
    path.write_text(text)
    parsed = parse_log(path)
    assert not parsed.malformed
    assert [e.key for e in parsed.events][:3] == ["submission_benchmark", "run_start", "epoch_start"]
    assert parsed.events[0].lineno == 2
    run = summarize_run(parsed)
    assert run.submission.benchmark == "deepcam" and run.timing.status == "success"
    assert run.timing.time_to_train_s == pytest.approx(3.0)
    assert run.training.train_epoch_s == [pytest.approx(2.0)]  # the epoch after run_stop is not timed
    assert run.quality.epochs_to_target == 1 and run.quality.metric_series == [(1.0, 0.83)]


def test_malformed_lines_are_listed_with_file_and_line_never_raised():
    text = _log(_rec("run_start", 0)) + ":::MLLOG {not json\n" + ":::MLLOG [1, 2]\n" + \
        ':::MLLOG {"key": "x"}\n' + ':::MLLOG {"key": "y", "time_ms": "soon"}\n' + _log(_rec("run_stop", 60000))
    parsed = parse_text(text, "runs/result_3.txt")
    assert [m.lineno for m in parsed.malformed] == [2, 3, 4, 5]
    assert all(m.message.startswith(f"runs/result_3.txt:{m.lineno}: ") for m in parsed.malformed)
    run = summarize_run(parsed)
    assert run.timing.time_to_train_s == 60.0 and len(run.malformed) == 4


def test_unreadable_file_raises_log_format_error_naming_it(tmp_path):
    with pytest.raises(LogFormatError, match="missing.txt"):
        parse_log(tmp_path / "missing.txt")
    with pytest.raises(LogFormatError, match="no result_"):
        build_report([tmp_path])


def test_phases_status_resume_and_latency_metadata():
    base = [_rec("init_start", 0), _rec("submission_benchmark", 0, "cosmoflow"), _rec("global_batch_size", 0, 32),
            _rec("train_samples", 0, 1000), _rec("number_of_nodes", 0, 2), _rec("accelerators_per_node", 0, 4),
            _rec("staging_start", 100), _rec("staging_stop", 2100), _rec("init_stop", 3000),
            _rec("run_start", 3000)]
    epochs = []
    for i in range(3):  # 10 s epochs with a 2 s evaluation inside each
        t0 = 3000 + i * 10000
        epochs += [_rec("epoch_start", t0, epoch_num=i + 1), _rec("eval_start", t0 + 8000, epoch_num=i + 1),
                   _rec("eval_stop", t0 + 10000, epoch_num=i + 1), _rec("epoch_stop", t0 + 10000, epoch_num=i + 1),
                   _rec("eval_error", t0 + 10000, 0.3 - 0.1 * i, epoch_num=i + 1)]
    run = summarize_run(parse_text(_log(*base, *epochs, _rec("resume", 33000),
                                        _rec("run_stop", 34000, status="aborted"))))
    assert run.timing.status == "aborted" and run.timing.resumed and run.quality.epochs_to_target is None
    assert run.staging.staging_s == 2.0 and run.staging.init_s == 3.0 and run.timing.time_to_train_s == 31.0
    assert run.training.train_epoch_s == [8.0, 8.0, 8.0] and run.training.eval_s == [2.0, 2.0, 2.0]
    assert run.training.residual_s == pytest.approx(1.0)
    assert run.training.samples_per_s == pytest.approx(1000 / 8.0)
    assert (run.submission.global_batch_size, run.submission.number_of_nodes, run.submission.accelerators_per_node) == (32, 2, 4)
    assert run.quality.target == 0.124 and run.quality.target_direction == "min"
    # no epoch/eval pairs: per-epoch latency metadata is used instead (NVIDIA v3.0 style)
    latency = [_rec("run_start", 0), _rec("epoch_stop", 5000, epoch_num=1, training_epoch_latency=4000.0,
                                          eval_epoch_latency=500.0), _rec("run_stop", 6000, status="success")]
    run = summarize_run(parse_text(_log(*latency)))
    assert run.training.train_epoch_s == [4.0] and run.training.eval_s == [0.5] and run.training.residual_s == pytest.approx(1.5)
    assert summarize_run(parse_text(_log(_rec("run_start", 0), _rec("x", 1, metadata_ok=1)))).timing.status == "incomplete"
    resumed = summarize_run(parse_text(_log(_rec("run_start", 0, None, resumed=True))))
    assert resumed.timing.resumed


def _official_verdict(path: Path, ruleset: str) -> bool:
    from mlperf_logging.compliance_checker import mlp_compliance

    logging.disable(logging.CRITICAL)
    mlp_compliance.enqueued_configs.clear()
    try:
        checker = mlp_compliance.make_checker("hpc", ruleset, True, False)
        return mlp_compliance.main(str(path), f"hpc_{ruleset}/common.yaml", checker)[0]
    except OSError:  # the official checker crashes on an unknown division's rule file
        return False
    finally:
        mlp_compliance.enqueued_configs.clear()
        logging.disable(logging.NOTSET)


def test_compliance_verdicts_equal_the_official_checker(tmp_path, mlperf_results):
    source = mlperf_results / "hpc_results_v3.0/NVIDIA/results/eos_n64_ngc23.09_pytorch/strong/cosmoflow/result_0.txt"
    lines = source.read_text().splitlines(keepends=True)
    variants = {
        "ok": lines,
        "no_run_stop": [l for l in lines if '"run_stop"' not in l],
        "two_run_starts": lines[:30] + [l for l in lines if '"run_start"' in l] + lines[30:],
        "garbled": lines[:5] + [":::MLLOG {broken\n"] + lines[5:],
        "no_target": [l for l in lines if '"eval_error"' not in l],
        "bad_division": [l.replace('"closed"', '"weird"') for l in lines],
    }
    for name, content in variants.items():
        path = tmp_path / f"result_{name}.txt"
        path.write_text("".join(content))
        mine = check_run(parse_log(path), "3.0.0")
        assert mine.ok == _official_verdict(path, "3.0.0"), name
        assert mine.ok == (name in ("ok", "two_run_starts")), name  # identical repeats: a warning only


def test_dropped_runs_count_as_slowest_and_two_make_the_result_invalid(tmp_path, mlperf_results):
    folder = tmp_path / "Org" / "results" / "sys" / "strong" / "deepcam"
    shutil.copytree(mlperf_results / "hpc_results_v3.0/HPE+LBNL/results/perlmutter_512x4/strong/deepcam", folder)
    files = sorted(folder.glob("result_*.txt"))
    full = score_folder(folder, files)
    ttt = sorted(r.facts.timing.time_to_train_min for r in full.runs)
    assert full.olympic_min == pytest.approx(sum(ttt[1:-1]) / 3, rel=1e-12)
    slowest = max(full.runs, key=lambda r: r.facts.timing.time_to_train_s).facts.path
    fastest = min(full.runs, key=lambda r: r.facts.timing.time_to_train_s).facts.path
    # the fastest run loses its run_stop: it is dropped and counts as the slowest
    Path(fastest).write_text("".join(l for l in Path(fastest).read_text().splitlines(True) if "run_stop" not in l))
    one = score_folder(folder, files)
    remaining = sorted(r.facts.timing.time_to_train_min for r in one.runs if r.facts.path != fastest)
    assert list(one.dropped) == [fastest]
    assert one.olympic_min == pytest.approx(sum(remaining[1:]) / 3, rel=1e-12)
    Path(slowest).write_text(Path(slowest).read_text() + ":::MLLOG {oops\n")
    two = score_folder(folder, files)
    assert two.olympic_min is None and any(n.startswith("invalid") for n in two.notes)


def test_openfold_samples_per_s_counts_the_samples_its_epochs_log():
    """OpenFold's ``epoch_num`` counts the samples trained by the epoch's end (the reference
    logs 10240, 20480, ... for blocks of 40 steps of 256): samples/s is the largest count over the
    epochs' training time, not ``train_samples`` x epochs; unknown (None) for a resumed run."""
    base = [_rec("init_start", 0), _rec("submission_benchmark", 0, "openfold"),
            _rec("train_samples", 0, 594595), _rec("init_stop", 1000), _rec("run_start", 1000)]
    epochs = []
    for i in range(2):  # 40 s of training per 10240 samples, then a 5 s evaluation
        t0, samples = 1000 + i * 45000, (i + 1) * 10240
        epochs += [_rec("epoch_start", t0, epoch_num=samples), _rec("epoch_stop", t0 + 40000, epoch_num=samples),
                   _rec("eval_start", t0 + 40000, epoch_num=samples), _rec("eval_stop", t0 + 45000, epoch_num=samples),
                   _rec("eval_accuracy", t0 + 45000, 0.7, epoch_num=samples)]
    run = summarize_run(parse_text(_log(*base, *epochs, _rec("run_stop", 91000, status="aborted"))))
    assert run.training.epoch_unit == "samples" and run.training.train_epoch_s == [40.0, 40.0]
    assert run.training.samples_per_s == pytest.approx(20480 / 80.0)
    resumed = summarize_run(parse_text(_log(*base, _rec("resume", 1000), *epochs,
                                            _rec("run_stop", 91000, status="aborted"))))
    assert resumed.timing.resumed and resumed.training.samples_per_s is None


def test_ruleset_from_the_round_in_the_path():
    assert ruleset_for("x/hpc_results_v1.0/NVIDIA/results/s/strong/deepcam") == "1.0.0"
    assert ruleset_for("x/hpc_results_v3.0/a") == "3.0.0"
    assert ruleset_for("x/hpc_results_v0.7/a") is None  # mlperf_logging has no v0.7 hpc rules
    assert ruleset_for("results/cosmoflow-mini") == "3.0.0"


def test_mini_run_folder_phase_table_json_csv_markdown():
    report = build_report([MINI_RUNS])
    (folder,) = report.folders
    assert folder.kind == "runs" and folder.benchmark == "cosmoflow" and len(folder.runs) >= 3
    for run in folder.runs:
        assert run.facts.timing.time_to_train_s > 0 and run.facts.training.n_epochs >= 1 and run.facts.training.residual_s is not None
        assert run.facts.staging.staging_s is not None and run.facts.quality.target == 0.124
    text = render(report, "table")
    assert "result_0.txt" in text and "residual s" in text
    data = json.loads(render(report, "json"))
    assert data["folders"][0]["runs"][0]["metric_series"]
    rows = list(csv.DictReader(render(report, "csv").splitlines()))
    assert len(rows) == len(folder.runs) and float(rows[0]["time_to_train_s"]) > 0
    markdown = render(report, "markdown")
    assert markdown.count("| result_") == len(folder.runs)


def test_folder_csv_has_the_expected_scores_columns(round_reports):
    rows = list(csv.DictReader(render(round_reports["hpc_results_v1.0"], "csv").splitlines()))
    nvidia = [r for r in rows if r["system"] == "dgxa100_n512_ngc21.09_mxnet"]
    assert nvidia and float(nvidia[0]["models_per_min"]) == pytest.approx(0.7290381594520366, rel=1e-12)


def test_plots_are_written(tmp_path, round_reports):
    for name, report in (("round", round_reports["hpc_results_v3.0"]), ("runs", build_report([MINI_RUNS], compliance=False))):
        paths = write_plots(report, tmp_path / name).written
        assert [p.name for p in paths] == ["report-time-split.png", "report-convergence.png", "report-scaling.png"]
        for path in paths:
            assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_cli_formats_and_errors(tmp_path):
    runner = CliRunner()
    result = runner.invoke(report_command, [str(MINI_RUNS), "--format", "json", "--no-compliance"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["compliance_checked"] is False
    result = runner.invoke(report_command, [str(MINI_RUNS), "--format", "markdown", "--plots", str(tmp_path / "p")])
    assert result.exit_code == 0 and (tmp_path / "p" / "report-time-split.png").is_file()
    # the mini runs stop at max_epochs: no compliant run, no score, so no scaling plot, and why
    assert not (tmp_path / "p" / "report-scaling.png").exists()
    assert "no scaling plot: no strong-scaling result has a score (olympic mean)" in result.stderr
    result = runner.invoke(report_command, [str(tmp_path / "nowhere")])
    assert result.exit_code == 2 and "nowhere" in result.stderr and len(result.stderr.splitlines()) == 1
    result = runner.invoke(report_command, [str(MINI_RUNS), "--org", "x"])
    assert result.exit_code == 2 and "--package" in result.stderr


def test_run_tables_show_a_resumed_runs_total_time_labelled_unscored(tmp_path):
    from mlhpc.report.render import to_markdown, to_text

    folder = tmp_path / "runs"
    folder.mkdir()
    stopped = [_rec("submission_benchmark", 0, "cosmoflow"), _rec("run_start", 1000),
               _rec("run_stop", 41000, status="aborted")]
    resumed = [_rec("submission_benchmark", 0, "cosmoflow"), _rec("run_start", 50000),
               _rec("resume", 50001, {"from_result_file": "result_0.txt", "earlier_attempts_s": 40.0}),
               _rec("run_stop", 80000, status="success")]
    (folder / "result_0.txt").write_text(_log(*stopped))
    (folder / "result_1.txt").write_text(_log(*resumed))
    report = build_report([folder], compliance=False)
    run = report.folders[0].runs[1]
    assert run.facts.timing.time_to_train_s == 30.0 and run.facts.timing.time_to_train_total_s == 70.0
    assert run.to_dict()["time_to_train_total_s"] == 70.0
    for text in (to_text(report, "runs"), to_markdown(report, "runs")):
        assert "yes: 70.00 s all attempts, unscored" in text
        assert text.count("all attempts") == 1  # the stopped attempt is not resumed itself


def test_cli_renders_the_table_once(monkeypatch):
    import importlib

    monkeypatch.setenv("COLUMNS", "100")  # the width of a pipe, whatever the runner's stdout is

    views_module = importlib.import_module("mlhpc.report.views")
    calls = []
    views = views_module._tables
    monkeypatch.setattr(views_module, "_tables", lambda *a, **k: calls.append(1) or views(*a, **k))
    result = CliRunner().invoke(report_command, [str(MINI_RUNS), "--no-compliance"])
    assert result.exit_code == 0, result.output
    assert "time to train s" in result.stdout and len(calls) == 1


def test_quality_targets_come_from_mlperf_logging_rule_files():
    from mlhpc.log.mlperf_adapter import quality_target

    assert quality_target("cosmoflow") == ("eval_error", 0.124, "min")
    assert quality_target("deepcam") == ("eval_accuracy", 0.82, "max")
    assert quality_target("openfold") == ("eval_accuracy", 0.8, "max")
    assert quality_target("oc20")[0] == "eval_error" and quality_target("nosuchbench") is None


def test_concurrent_evaluation_is_overlap_not_subtracted(mlperf_results):
    """HPE+LBNL v3.0 OpenFold evaluates the previous checkpoint while the next epoch trains."""
    log = mlperf_results / "hpc_results_v3.0/HPE+LBNL/results/perlmutter_224x4/strong/openfold/result_1.txt"
    run = summarize_run(parse_log(log))
    assert run.training.concurrent_eval and run.training.eval_overlap_s > 0.8 * run.training.total_eval_s
    assert run.training.total_train_s > 0.85 * run.timing.time_to_train_s  # epochs keep the time they overlapped
    assert 0 <= run.training.residual_s < 0.05 * run.timing.time_to_train_s
    serial = summarize_run(parse_log(MINI_RUNS / "result_0.txt"))
    assert not serial.training.concurrent_eval and serial.training.eval_overlap_s == 0.0
