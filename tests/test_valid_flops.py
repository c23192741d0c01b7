"""HPC AI500's Valid FLOPS and Valid FLOPS per watt in `mlhpc report` and the store: recomputed by
hand from the log and its side file for an accuracy workload and an error workload (a run that
misses its target is penalised, not dropped), per watt where power was measured, in every
format, for published logs only where the reference count is known, and from a real tiny run."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.errors import ConfigError
from mlhpc.power.sampler import mllog_line
from mlhpc.report import ReportOptions, build_report, run_report
from mlhpc.report.render import render, to_markdown, to_text
from mlhpc.report.validflops import quality_penalty, reference_flops

METRIC = {"cosmoflow": "eval_error", "deepcam": "eval_accuracy", "openfold": "eval_accuracy"}


def _rec(key: str, t: int, value=None, **metadata) -> str:  # type: ignore[no-untyped-def]
    kind = "INTERVAL_START" if key.endswith("_start") else "INTERVAL_END" if key.endswith("_stop") else "POINT_IN_TIME"
    return mllog_line(key, value, t, kind, metadata)


def _log(bench: str, qualities: list[float], status: str = "success", division: str = "open",
         train_samples: int = 64, epoch_ms: int = 2000, sample_epochs: int | None = None) -> str:
    """A run of ``bench``: one epoch and one evaluation per quality, then run_stop. With
    ``sample_epochs`` each epoch_num counts samples (that many per epoch), as OpenFold's do."""
    lines = [_rec("submission_benchmark", 0, bench), _rec("submission_division", 0, division),
             _rec("train_samples", 0, train_samples), _rec("init_start", 0), _rec("init_stop", 900),
             _rec("run_start", 1000)]
    t = 1000
    for i, quality in enumerate(qualities, start=1):
        num = i * sample_epochs if sample_epochs else i
        lines += [_rec("epoch_start", t, epoch_num=num), _rec("epoch_stop", t + epoch_ms, epoch_num=num),
                  _rec("eval_start", t + epoch_ms, epoch_num=num), _rec("eval_stop", t + epoch_ms + 300, epoch_num=num),
                  _rec(METRIC[bench], t + epoch_ms + 300, quality, epoch_num=num)]
        t += epoch_ms + 300
    return "".join(lines + [_rec("run_stop", t + 100, status=status)])


def _run_folder(path: Path, bench: str, qualities: list[float], flops: float, target: float, **kw) -> Path:  # type: ignore[no-untyped-def]
    """An mlhpc-like run folder: result_0.txt, measured_0.json (FLOPs per sample), summary_0.json (target)."""
    path.mkdir(parents=True)
    (path / "result_0.txt").write_text(_log(bench, qualities, **kw))
    (path / "measured_0.json").write_text(json.dumps({"perf": {"train_flops_per_sample": flops}}))
    (path / "summary_0.json").write_text(json.dumps({"target": target}))
    return path


def _by_hand(log: Path, flops_per_sample: float, target: float, rising: bool, n: float = 5.0) -> float:
    """Valid FLOPS read straight off the log's JSON records, as HPC AI500 defines it."""
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in log.read_text().splitlines()]
    at = {r["key"]: r for r in records}
    seconds = (at["run_stop"]["time_ms"] - at["run_start"]["time_ms"]) / 1000
    epochs = sum(r["key"] == "epoch_stop" for r in records)
    achieved = [r["value"] for r in records if r["key"] in ("eval_error", "eval_accuracy")][-1]
    ratio = achieved / target if rising else target / achieved
    return flops_per_sample * at["train_samples"]["value"] * epochs / seconds * min(1.0, ratio) ** n


def _power(folder: Path, watts: float) -> None:
    """power/result_0/node_0.txt: ``watts`` each second over the run."""
    records = [json.loads(line.split(":::MLLOG ", 1)[1]) for line in (folder / "result_0.txt").read_text().splitlines()]
    start, stop = (int(next(r["time_ms"] for r in records if r["key"] == k)) for k in ("run_start", "run_stop"))
    lines = [mllog_line("power_measurement_start", None, start, "INTERVAL_START", {})]
    lines += [mllog_line("power_reading", watts, t, "POINT_IN_TIME", {}) for t in range(start + 1000, stop + 1, 1000)]
    lines.append(mllog_line("power_measurement_stop", None, stop, "INTERVAL_END", {}))
    (folder / "power" / "result_0").mkdir(parents=True)
    (folder / "power" / "result_0" / "node_0.txt").write_text("".join(lines))


def test_valid_flops_by_hand_accuracy_missing_its_target_and_error_reaching_it(tmp_path):
    # DeepCAM-like: IoU rises to 0.70 of a 0.82 target and the run stops short (aborted): penalised
    accuracy = _run_folder(tmp_path / "deepcam", "deepcam", [0.40, 0.62, 0.70], flops=4.0e9, target=0.82,
                           status="aborted")
    # CosmoFlow-like: the error falls to 0.30 under a 0.35 target: FLOPS unpenalised (no bonus)
    error = _run_folder(tmp_path / "cosmo", "cosmoflow", [0.9, 0.5, 0.3], flops=1.5e8, target=0.35)
    # a CosmoFlow run that stops at 0.50 against 0.35: (0.35 / 0.50) ** 5
    short = _run_folder(tmp_path / "cosmo-short", "cosmoflow", [0.9, 0.5], flops=1.5e8, target=0.35, status="aborted")
    _power(accuracy, 250.0)
    report = build_report([accuracy, error, short], compliance=False)
    runs = {Path(f.path).name: f.runs[0] for f in report.folders}
    v = runs["deepcam"].valid_flops
    expected = _by_hand(accuracy / "result_0.txt", 4.0e9, 0.82, rising=True)
    assert v.valid_flops_per_s == pytest.approx(expected, rel=1e-12)
    assert v.penalty == pytest.approx((0.70 / 0.82) ** 5) and v.penalty < 1 and runs["deepcam"].facts.timing.status == "aborted"
    assert v.samples_trained == 3 * 64 and v.flops_per_s == pytest.approx(4.0e9 * 192 / 7.0)
    assert v.valid_flops_per_w == pytest.approx(expected / 250.0, rel=1e-9)  # per watt: power measured
    e = runs["cosmo"].valid_flops
    assert e.valid_flops_per_s == pytest.approx(_by_hand(error / "result_0.txt", 1.5e8, 0.35, rising=False), rel=1e-12)
    assert e.penalty == 1.0 and e.valid_flops_per_s == e.flops_per_s and e.valid_flops_per_w is None
    s = runs["cosmo-short"].valid_flops
    assert s.penalty == pytest.approx((0.35 / 0.50) ** 5)
    assert s.valid_flops_per_s == pytest.approx(_by_hand(short / "result_0.txt", 1.5e8, 0.35, rising=False), rel=1e-12)
    # the folder's figure (one run each) and the exponent, configurable
    assert report.folders[0].valid_flops_per_s == v.valid_flops_per_s
    again = build_report([accuracy], compliance=False, valid_flops_exponent=2.0)
    assert again.folders[0].runs[0].valid_flops.valid_flops_per_s == pytest.approx(
        _by_hand(accuracy / "result_0.txt", 4.0e9, 0.82, rising=True, n=2.0), rel=1e-12)
    with pytest.raises(ConfigError, match="--valid-flops-exponent"):
        run_report([accuracy], ReportOptions(compliance=False, valid_flops_exponent=-1.0))


def test_the_penalty_is_hpc_ai500s_capped_at_one():
    assert quality_penalty(0.41, 0.82, "max") == pytest.approx(0.5 ** 5)
    assert quality_penalty(0.248, 0.124, "min") == pytest.approx(0.5 ** 5)
    assert quality_penalty(0.9, 0.82, "max") == 1.0 and quality_penalty(0.0, 0.124, "min") == 1.0
    assert quality_penalty(0.41, 0.82, "max", exponent=1) == pytest.approx(0.5)
    for bad in ((0.5, 0.0, "max"), (-0.1, 0.8, "max"), (math.nan, 0.8, "max"), (0.5, 0.8, "up")):
        with pytest.raises(ValueError):
            quality_penalty(*bad)


def test_every_format_shows_the_figure_and_its_exponent(tmp_path):
    folder = _run_folder(tmp_path / "deepcam", "deepcam", [0.5, 0.7], flops=4.0e9, target=0.82, status="aborted")
    report = build_report([folder], compliance=False)
    value = report.folders[0].runs[0].valid_flops.valid_flops_per_s
    compact, wide = to_text(report, "runs", width=100, wide=False), to_text(report, "runs")
    cell = f"{value / 1e9:.3g} G"
    assert "valid" in compact and cell in compact and "n=5" in compact  # the note states n
    assert "valid FLOP/s (n=5)" in wide and cell in wide and "valid FLOP/s per W" in wide
    assert max(len(line) for line in compact.splitlines()) <= 100
    row = next(csv.DictReader(render(report, "csv", "runs").splitlines()))
    assert float(row["valid_flops_per_s"]) == value and row["valid_flops_exponent"] == "5.0"
    assert row["flops_source"].startswith("measured_N.json") and row["valid_flops_per_w"] == ""
    folder_row = next(csv.DictReader(render(report, "csv", "folders").splitlines()))
    assert float(folder_row["valid_flops_per_s"]) == value
    data = json.loads(render(report, "json"))["folders"][0]
    assert data["valid_flops_per_s"] == value and data["runs"][0]["valid_flops"]["exponent"] == 5.0
    markdown = to_markdown(report, "runs")
    assert "valid FLOP/s (n=5)" in markdown and cell in markdown and "not an MLPerf score" in markdown


def test_openfold_counts_samples_by_epoch_num(tmp_path):
    folder = _run_folder(tmp_path / "of", "openfold", [0.3, 0.5, 0.6], flops=1e9, target=0.8,
                         train_samples=6, sample_epochs=400, status="aborted")
    v = build_report([folder], compliance=False).folders[0].runs[0].valid_flops
    assert v.samples_trained == 1200  # the last epoch_stop's epoch_num, not 3 x train_samples
    assert v.valid_flops_per_s == pytest.approx(1e9 * 1200 / 7.0 * (0.6 / 0.8) ** 5)


def test_published_logs_use_the_reference_count_closed_division_only(tmp_path):
    """No side file: a closed CosmoFlow log gets mlhpc's reference count; an open one and an
    OC20-like benchmark get none, and the notes say which figure came from where."""
    for name, bench, division in (("closed", "cosmoflow", "closed"), ("open", "cosmoflow", "open")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "result_0.txt").write_text(_log(bench, [0.2, 0.12], division=division, train_samples=1000))
    report = build_report([tmp_path / "closed", tmp_path / "open"], compliance=False)
    closed, open_ = (f.runs[0].valid_flops for f in report.folders)
    per_sample = reference_flops("cosmoflow")[0]
    assert closed.train_flops_per_sample == per_sample and "reference model" in closed.flops_source
    assert closed.valid_flops_per_s == pytest.approx(per_sample * 2000 / 4.7)
    assert open_.valid_flops_per_s is None and "open division" in open_.note
    text = to_text(report, "folders")
    assert "reference model (4 x 128^3 universe) (1 run)" in text and "no Valid FLOPS for 1 run(s): open" in text


def test_a_tiny_cosmoflow_run_reports_valid_flops_from_its_side_file(tmp_path, repo):
    """A real run: `mlhpc report` prints Valid FLOPS made from the log and measured_0.json."""
    from mlhpc.cli import main
    from mlhpc.report.cli import report_command
    from test_run_e2e import TINY

    out = tmp_path / "out"
    run = CliRunner().invoke(main, ["run", str(repo / "configs" / "cosmoflow-mini.yaml"), *TINY,
                                    "--set", "synth.train_samples=16", "--set", "synth.eval_samples=8",
                                    "--set", "train.max_epochs=1", "--set", f"data.path={tmp_path / 'data'}",
                                    "--set", f"output.dir={out}", "--set", "train.target=0.01"])
    assert run.exit_code in (0, 1), run.output  # 1: the target was not reached, the run is penalised
    measured = json.loads((out / "measured_0.json").read_text())["perf"]["train_flops_per_sample"]
    summary = json.loads((out / "summary_0.json").read_text())
    achieved = summary["metric_series"][-1][1]
    expected = (measured * summary["train_samples"] * summary["n_epochs"] / summary["time_to_train_s"]
                * min(1.0, 0.01 / achieved) ** 5)
    shown = CliRunner().invoke(report_command, [str(out), "--no-compliance", "--format", "json"])
    assert shown.exit_code == 0, shown.output
    v = json.loads(shown.output)["folders"][0]["runs"][0]["valid_flops"]
    assert v["valid_flops_per_s"] == pytest.approx(expected, rel=1e-9) and v["flops_source"].startswith("measured")
    table = CliRunner().invoke(report_command, [str(out), "--no-compliance"], env={"COLUMNS": "100"})
    assert f"{expected / 1e6:.3g} M" in table.output or f"{expected:.3g}" in table.output, table.output
    assert "Valid FLOPS (HPC AI500, n=5)" in " ".join(table.output.split())


def test_the_store_keeps_the_figure(tmp_path):
    from sqlalchemy import text

    from mlhpc.store import schema
    from mlhpc.store.engine import open_store
    from mlhpc.store.ingest import ingest_paths

    folder = _run_folder(tmp_path / "deepcam", "deepcam", [0.5, 0.7], flops=4.0e9, target=0.82, status="aborted")
    _power(folder, 100.0)
    store = open_store(f"sqlite:///{tmp_path / 'results.db'}")
    try:
        assert ingest_paths(store, [folder]).added
        with store.engine.connect() as conn:
            row = conn.execute(text("select valid_flops_per_s, valid_flops_per_w, valid_flops_exponent from runs")).one()
            versions = [v for (v,) in conn.execute(text("select version from schema_version order by version"))]
    finally:
        store.close()
    v = build_report([folder], compliance=False).folders[0].runs[0].valid_flops
    assert versions == [schema.SCHEMA_VERSION] and schema.SCHEMA_VERSION >= 4
    assert row == (pytest.approx(v.valid_flops_per_s), pytest.approx(v.valid_flops_per_w), 5.0)


@pytest.mark.slow
@pytest.mark.parametrize("bench, config, x_shape, y_shape", [
    ("cosmoflow", "cosmoflow.yaml", (1, 4, 128, 128, 128), (1, 4)),
    ("deepcam", "deepcam.yaml", (1, 16, 768, 1152), (1, 768, 1152)),
])
def test_the_reference_counts_are_recounted(repo, bench, config, x_shape, y_shape):
    """The reference table holds what mlhpc's own counter gives for the reference model and size."""
    import torch

    from mlhpc import config as cfg
    from mlhpc.run.step import count_flops_on_meta
    from mlhpc.workload import get

    conf, workload = cfg.load(repo / "configs" / config, ()), get(bench)
    y = torch.zeros(y_shape) if bench == "cosmoflow" else torch.zeros(y_shape, dtype=torch.long)
    counted = count_flops_on_meta(workload.build_model(conf.model), torch.zeros(x_shape), workload.build_loss(conf), y)
    assert counted.train_flops == reference_flops(bench)[0]
