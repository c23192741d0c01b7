"""mlhpc report for people: the compact table fits 100 columns with every figure whole and
``--wide`` shows every column; each plotted series names its folder and benchmark; a plot with
nothing to show is not written and the command says why; a run that staged nothing says "not
staged"; no power readings read "no power counter" in the human formats, energy shown as "-"."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.power.sampler import mllog_line
from mlhpc.report import ReportOptions, build_report, run_report
from mlhpc.report.cli import report_command
from mlhpc.report.plots import convergence_figure, folder_labels, scaling_figure, time_split_figure, write_plots
from mlhpc.report.render import render, to_markdown, to_text

BENCH_METRIC = {"cosmoflow": "eval_error", "deepcam": "eval_accuracy"}


def _rec(key: str, t: int, value=None, **metadata) -> str:  # type: ignore[no-untyped-def]
    kind = "INTERVAL_START" if key.endswith("_start") else "INTERVAL_END" if key.endswith("_stop") else "POINT_IN_TIME"
    return mllog_line(key, value, t, kind, metadata)


def _run_log(bench: str, seconds: float, nodes: int | None = 2, staging: list[str] | None = None,
             resumed: bool = False) -> str:
    """A run of ``bench``: submission keys, optional node count, staging records, three epochs
    with an evaluation each, run_stop success after ``seconds``."""
    head = [_rec("submission_benchmark", 0, bench), _rec("submission_division", 0, "open"),
            _rec("submission_platform", 0, "testbox"), _rec("init_start", 0)]
    head += [_rec("number_of_nodes", 0, nodes), _rec("accelerators_per_node", 0, 4)] if nodes else []
    head += staging if staging is not None else [_rec("staging_start", 10), _rec("staging_stop", 510)]
    head += [_rec("init_stop", 1000), _rec("run_start", 1000)]
    head += [_rec("resume", 1001, None, from_result_file="result_0.txt", earlier_attempts_s=5.0)] if resumed else []
    step = int(seconds * 1000 / 3)
    for i in range(3):
        t = 1000 + i * step
        head += [_rec("epoch_start", t, epoch_num=i + 1), _rec("epoch_stop", t + step - 100, epoch_num=i + 1),
                 _rec("eval_start", t + step - 100, epoch_num=i + 1), _rec("eval_stop", t + step, epoch_num=i + 1),
                 _rec(BENCH_METRIC[bench], t + step, 0.5 + 0.1 * i, epoch_num=i + 1)]
    return "".join(head + [_rec("run_stop", 1000 + 3 * step, status="success")])


def _folder(path: Path, bench: str, runs: int = 3, **kw) -> Path:  # type: ignore[no-untyped-def]
    path.mkdir(parents=True)
    for i in range(runs):
        (path / f"result_{i}.txt").write_text(_run_log(bench, 100_000.0 + 1234.5678 * i, **kw))
    return path


def _assert_fits(text: str, width: int = 100) -> None:
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width, max(lines, key=len)
    assert "\u2026" not in text  # no ellipsis anywhere


# ---- the table -----------------------------------------------------------------------------------

def test_compact_table_of_the_published_round_fits_100_columns_with_every_time_whole(mlperf_results):
    report = build_report([mlperf_results / "hpc_results_v3.0"], compliance=False)
    folders = to_text(report, "folders", width=100, wide=False)
    _assert_fits(folders)
    scored = [f for f in report.folders if f.kind == "strong" and f.olympic_min is not None]
    assert len(scored) >= 10
    for f in scored:
        assert f"{f.olympic_min:.2f}" in folders, f.path
    runs = to_text(report, "runs", width=100, wide=False)
    _assert_fits(runs)
    times = [r.facts.timing.time_to_train_s for f in report.folders for r in f.runs if r.facts.timing.time_to_train_s]
    assert len(times) > 100
    for seconds in times:
        assert f"{seconds:,.2f}" in runs
    wide = to_text(report, "runs")  # every column, as wide as it needs
    assert max(len(line) for line in wide.splitlines()) > 100 and "mean power W" in wide and "init s" in wide


def test_cli_table_fits_100_columns_by_default_and_wide_shows_every_column(tmp_path):
    folder = _folder(tmp_path / "cosmo-runs", "cosmoflow", resumed=False)
    runner = CliRunner()
    out = runner.invoke(report_command, [str(folder), "--no-compliance"], env={"COLUMNS": None})
    assert out.exit_code == 0, out.output
    _assert_fits(out.stdout)
    for run in build_report([folder], compliance=False).folders[0].runs:
        assert f"{run.facts.timing.time_to_train_s:,.2f}" in out.stdout  # e.g. 101,234.57, never 101,2…
    assert "mean power W" not in out.stdout
    narrow = runner.invoke(report_command, [str(folder), "--no-compliance"], env={"COLUMNS": "90"})
    _assert_fits(narrow.stdout, 90)
    wide = runner.invoke(report_command, [str(folder), "--no-compliance", "--wide"], env={"COLUMNS": None})
    assert wide.exit_code == 0, wide.output
    assert max(len(line) for line in wide.stdout.splitlines()) > 100
    for header in ("mean power W", "energy per node kJ", "init s", "residual s", "epochs to target"):
        assert header in wide.stdout


# ---- plots ---------------------------------------------------------------------------------------

def _two_benchmarks(tmp_path: Path):  # type: ignore[no-untyped-def]
    cosmo = _folder(tmp_path / "a" / "runs", "cosmoflow")
    deep = _folder(tmp_path / "b" / "runs", "deepcam", nodes=4)
    return build_report([cosmo, deep], compliance=False)


def test_every_plotted_series_names_its_folder_and_benchmark(tmp_path):
    import matplotlib.pyplot as plt

    report = _two_benchmarks(tmp_path)
    assert folder_labels(report) == {str(tmp_path / "a" / "runs"): "a/runs", str(tmp_path / "b" / "runs"): "b/runs"}
    fig = time_split_figure(report)
    bars = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(bars) == 6
    assert sum("a/runs cosmoflow result_" in b for b in bars) == 3
    assert sum("b/runs deepcam result_" in b for b in bars) == 3
    plt.close(fig)
    fig = convergence_figure(report)
    lines = [line.get_label() for ax in fig.axes for line in ax.get_lines() if not line.get_label().startswith(("_", "target"))]
    assert len(lines) == 6 and all(("a/runs cosmoflow" in x) != ("b/runs deepcam" in x) for x in lines)
    plt.close(fig)
    fig = scaling_figure(report)
    ax = fig.axes[0]
    points = sorted(t.get_text() for t in ax.texts)
    assert points == ["a/runs cosmoflow", "b/runs deepcam"]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(x.startswith("cosmoflow") for x in legend) and any(x.startswith("deepcam") for x in legend)
    plt.close(fig)


def test_a_plot_with_nothing_to_show_is_not_written_and_the_command_says_why(tmp_path):
    folder = _folder(tmp_path / "no-nodes", "cosmoflow", nodes=None)
    report = build_report([folder], compliance=False)
    assert scaling_figure(report) is None and time_split_figure(report) is not None
    files = write_plots(report, tmp_path / "plots")
    assert [p.name for p in files.written] == ["report-time-split.png", "report-convergence.png"]
    assert files.skipped == ["no scaling plot: no scored result carries a node count"]
    out = CliRunner().invoke(report_command, [str(folder), "--no-compliance", "--format", "csv",
                                              "--plots", str(tmp_path / "cli")])
    assert out.exit_code == 0, out.output
    assert "no scaling plot: no scored result carries a node count" in out.stderr.splitlines()
    assert not (tmp_path / "cli" / "report-scaling.png").exists()
    assert (tmp_path / "cli" / "report-time-split.png").is_file()


# ---- staging -------------------------------------------------------------------------------------

def test_a_run_that_staged_nothing_shows_not_staged_never_zero_bandwidth(tmp_path):
    in_place = {"placement": "init", "staging_duration": 0.2, "staged_bytes": 4_000_000, "nodes": 2,
                "slowest_node_s": 0.2, "mean_node_s": 0.15, "node_gb_per_s": [0.0, 0.0],
                "aggregate_gb_per_s": 0.0, "node_staged_bytes": [2_000_000, 2_000_000]}
    copied = {**in_place, "node_gb_per_s": [1.5, 1.25], "aggregate_gb_per_s": 2.75}
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "result_0.txt").write_text(_run_log("cosmoflow", 60.0, staging=[
        _rec("staging_start", 10), _rec("staging_stop", 510, **copied)]))
    (folder / "result_1.txt").write_text(_run_log("cosmoflow", 60.0, staging=[], resumed=True))
    (folder / "result_2.txt").write_text(_run_log("cosmoflow", 60.0, resumed=True, staging=[
        _rec("staging_start", 10), _rec("staging_stop", 210, **in_place)]))
    report = build_report([folder], compliance=False)
    wide = to_text(report, "runs")
    rows = {line.split()[1]: line for line in wide.splitlines() if "result_" in line}
    assert "2.75 GB/s" in rows["result_0.txt"]  # a real copy keeps its bandwidth
    assert "not staged" in rows["result_1.txt"] and "not staged" in rows["result_2.txt"]
    assert "GB/s" not in rows["result_1.txt"] + rows["result_2.txt"] and "0.00 GB/s" not in wide
    compact = to_text(report, "runs", width=100, wide=False)
    assert compact.count("not staged") == 2 and "GB/s" not in compact
    assert to_markdown(report, "runs").count("not staged") == 2


# ---- power ---------------------------------------------------------------------------------------

def test_no_power_counter_is_one_note_in_table_csv_and_markdown_with_energy_dashes(tmp_path):
    folder = _folder(tmp_path / "runs", "cosmoflow")
    report = build_report([folder], compliance=False)
    for text in (to_text(report, "runs"), to_text(report, "runs", width=100, wide=False),
                 to_text(report, "folders"), to_markdown(report, "runs")):
        assert text.count("no power counter") == 1 and "no power readings (power" not in text
    wide = to_text(report, "runs")
    header = next(line for line in wide.splitlines() if "time to train s" in line)
    cells = [c.strip() for c in next(line for line in wide.splitlines() if "result_0.txt" in line).split("\u2502")]
    names = [c.strip() for c in header.split("\u2503")]
    assert cells[names.index("energy kJ")] == "-" and cells[names.index("energy per node kJ")] == "-"
    rows = list(csv.DictReader(render(report, "csv", "runs").splitlines()))
    assert all(r["power_note"].startswith("no power counter") and r["energy_to_train_j"] == "" for r in rows)
    folder_rows = list(csv.DictReader(render(report, "csv", "folders").splitlines()))
    assert "no power counter" in folder_rows[0]["notes"]
    assert "no power counter" in json.loads(render(report, "json"))["folders"][0]["runs"][0]["power_note"]


def _power_files(folder: Path, watts_per_node: list[float]) -> None:
    """power/result_N/node_K.txt for each log: a constant reading each second over its run."""
    from mlhpc.log.parse import parse_log
    from mlhpc.log.summary import official_start_stop

    for log in sorted(folder.glob("result_*.txt")):
        start, stop = (int(t) for t in official_start_stop(parse_log(log).events))
        for node, watts in enumerate(watts_per_node):
            lines = [mllog_line("power_measurement_start", None, start, "INTERVAL_START", {})]
            lines += [mllog_line("power_reading", watts, t, "POINT_IN_TIME", {})
                      for t in range(start + 1000, stop + 1, 1000)]
            lines.append(mllog_line("power_measurement_stop", None, stop, "INTERVAL_END", {}))
            target = folder / "power" / log.stem / f"node_{node}.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines))


def test_energy_per_node_in_the_wide_table_and_markdown(tmp_path):
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "result_0.txt").write_text(_run_log("cosmoflow", 90.0))
    _power_files(folder, [100.0, 300.0])
    report = build_report([folder], compliance=False)
    run = report.folders[0].runs[0]
    assert run.power.node_energy_j == {"node_0": pytest.approx(9000.0), "node_1": pytest.approx(27000.0)}
    for text in (to_text(report, "runs"), to_markdown(report, "runs")):
        assert "node_0 9.000, node_1 27.000" in text and "energy per node kJ" in text
        assert "no power counter" not in text
    compact = to_text(report, "runs", width=100, wide=False)
    _assert_fits(compact)
    assert "36.000" in compact and "energy" in compact  # energy to train where measured
    outcome = run_report([folder], ReportOptions(compliance=False, level="runs"))
    assert outcome.plots == [] and outcome.plots_skipped == []
