"""The report's figures are one set: for a run folder, the wide terminal table, Markdown, CSV and
JSON show the figures the table of figures (`mlhpc.report.figures.FIGURES`) selects for the
wide view, under the same names, with the same values."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from mlhpc.power.sampler import mllog_line
from mlhpc.report import build_report
from mlhpc.report.figures import CSV, FIGURES, TABLES, WIDE, Frame, Row
from mlhpc.report.views import selected
from mlhpc.report.render import csv_cell, render, to_markdown, to_text

MINI_RUNS = Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs"


def _measured_run_folder(tmp_path: Path) -> Path:
    """The mini run folder with power readings on two nodes and FLOPs per sample for each run,
    so energy, energy per node, mean power and Valid FLOPS (per watt) have values."""
    folder = tmp_path / "cosmoflow-mini-runs"
    shutil.copytree(MINI_RUNS, folder)
    for n, log in enumerate(sorted(folder.glob("result_*.txt"))):
        records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()
                   if ":::MLLOG " in line]
        start, stop = (int(next(r["time_ms"] for r in records if r["key"] == k)) for k in ("run_start", "run_stop"))
        for node, watts in ((0, 300.0 + n), (1, 250.0)):
            lines = [mllog_line("power_measurement_start", None, start, "INTERVAL_START", {})]
            lines += [mllog_line("power_reading", watts, t, "POINT_IN_TIME", {}) for t in range(start, stop + 1, 250)]
            lines.append(mllog_line("power_measurement_stop", None, stop, "INTERVAL_END", {}))
            (folder / "power" / log.stem).mkdir(parents=True, exist_ok=True)
            (folder / "power" / log.stem / f"node_{node}.txt").write_text("".join(lines))
        (folder / f"measured_{log.stem.split('_')[1]}.json").write_text(
            json.dumps({"perf": {"train_flops_per_sample": 2.5e9}}))
    return folder


def _cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip().strip(bar).split(bar)]


def _terminal_table(text: str) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the one rich table in ``text`` (heavy bars head it, light ones its rows)."""
    lines = text.splitlines()
    header = next(_cells(line, "┃") for line in lines if line.startswith("┃"))
    return header, [_cells(line, "│") for line in lines if line.startswith("│")]


def _markdown_table(text: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return _cells(lines[0], "|"), [_cells(line, "|") for line in lines[1:]]


def test_wide_table_markdown_csv_and_json_show_the_same_figures_with_the_same_values(tmp_path):
    report = build_report([_measured_run_folder(tmp_path)])
    (folder,) = report.folders
    frame = Frame(report, (folder,), WIDE)
    figures = selected("run", frame)
    assert [f.name for f in figures][:4] == ["file", "status", "compliant", "time_to_train_s"]
    # every figure the wide view shows is one CSV column and one JSON key: one set
    assert all(CSV in f.views and f.json is not None for f in figures), [
        f.name for f in figures if CSV not in f.views or f.json is None]
    headings = [f.heading(frame) for f in figures]
    terminal, markdown = _terminal_table(to_text(report, "runs")), _markdown_table(to_markdown(report, "runs"))
    assert terminal[0] == markdown[0] == headings
    csv_rows = list(csv.DictReader(render(report, "csv", "runs").splitlines()))
    json_runs = json.loads(render(report, "json"))["folders"][0]["runs"]
    assert len(terminal[1]) == len(markdown[1]) == len(csv_rows) == len(json_runs) == len(folder.runs) == 3
    assert folder.runs[0].power.energy_to_train_j and folder.runs[0].valid_flops.valid_flops_per_w  # measured
    for run, shown, written, csv_row, json_run in zip(folder.runs, terminal[1], markdown[1], csv_rows, json_runs):
        row = Row(frame, folder, run)
        for figure, in_table, in_markdown in zip(figures, shown, written):
            value = figure.json(json_run)  # the JSON's value, read where the table of figures says
            assert csv_row[figure.name] == str(csv_cell(value)), figure.name
            assert in_table == in_markdown == figure.text(row, value), figure.name


def test_every_figure_has_a_unique_name_per_level_and_a_heading_where_a_table_shows_it():
    for level in ("run", "folder"):
        names = [f.name for f in FIGURES if f.level == level]
        assert len(names) == len(set(names)), level
    tabled = [f for f in FIGURES if f.views & TABLES]
    assert all(f.label for f in tabled) and all(f.column for f in tabled)
    # a run's CSV columns follow the table of figures, which the CSV header shows
    report = build_report([MINI_RUNS])
    header = render(report, "csv", "runs").splitlines()[0].split(",")
    assert header == [f.name for f in FIGURES if f.level == "run" and CSV in f.views]
