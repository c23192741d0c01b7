"""PNG figures of a `Report` (matplotlib, Agg backend; nothing is shown on screen).

- ``report-time-split.png``: where the time went, per run (mlhpc run folders) or per result
  folder (mean over its scored runs): staging (before run_start), training epochs, evaluation,
  and the residual (time to train - epochs - evaluations).
- ``report-convergence.png``: the quality metric against epoch, one panel per benchmark, with
  the target as a dashed line.
- ``report-scaling.png``: time to train (olympic mean) against accelerators per model across
  systems, log-log, one colour per benchmark.

Every bar, line and point names its folder (the run folder, or submitter/system) and its
benchmark. A figure with nothing to show is not written; `write_plots` says why instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from mlhpc.data.files import atomic_output, reason
from mlhpc.errors import ConfigError
from mlhpc.log.facts import RunSummary
from mlhpc.report.reported import ReportedRun
from mlhpc.report.score import FolderResult, Report
from mlhpc.text import file_name, plot_text

PHASES = ("staging", "training epochs", "evaluation", "residual")
PHASE_COLORS = ("#8c8c8c", "#1f77b4", "#ff7f0e", "#d62728")


def folder_labels(report: Report) -> dict[str, str]:
    """``{folder path: label}``: ``submitter/system`` for a published result; for an mlhpc run
    folder its name, with as many parent folders as it takes to tell it from the others."""
    runs = [Path(f.path) for f in report.folders if f.kind == "runs"]
    labels = {f.path: f"{f.submitter}/{f.system}" for f in report.folders if f.kind != "runs"}
    for path in runs:
        for depth in range(1, len(path.parts) + 1):
            tail = path.parts[-depth:]
            if sum(p.parts[-depth:] == tail for p in runs) == 1 or depth == len(path.parts):
                labels[str(path)] = "/".join(tail)
                break
    return labels


def _label(f: FolderResult, labels: dict[str, str]) -> str:
    """A result folder's series: its folder (or submitter/system) and its benchmark."""
    return f"{labels.get(f.path, f.path)} {f.benchmark or '?'}"


def _run_label(f: FolderResult, r: ReportedRun, labels: dict[str, str]) -> str:
    """One run's series: folder, benchmark and log (``result_N.txt``)."""
    return f"{_label(f, labels)} {Path(r.facts.path).name}"


def _phases_min(runs: list[RunSummary]) -> tuple[float, float, float, float, float] | None:
    """Mean minutes of staging, training epochs, evaluation outside the epochs, residual, and
    evaluation concurrent with the epochs (drawn over them, not added)."""
    usable = [r for r in runs if r.timing.time_to_train_s is not None and r.training.residual_s is not None]
    if not usable:
        return None
    n = len(usable)
    # Staging inside the timed region (rules before v3.0) is carved out of the residual.
    inside = [(r.staging.staging_s or 0.0) if r.staging.staging_in_run else 0.0 for r in usable]
    trained = [r.training for r in usable]
    return (sum((r.staging.staging_s or 0.0) for r in usable) / n / 60,
            sum(t.total_train_s for t in trained) / n / 60,
            sum(t.total_eval_s - t.eval_overlap_s for t in trained) / n / 60,
            sum(t.residual_s - s for t, s in zip(trained, inside)) / n / 60,  # type: ignore[operator]
            sum(t.eval_overlap_s for t in trained) / n / 60)


def time_split_figure(report: Report) -> Figure | None:
    """Stacked bars of staging / epochs / evaluation / residual: minutes (seconds for runs under
    5 minutes) on the left, shares of the total on the right. Evaluation that ran concurrently
    with training (detected from the timestamps, `mlhpc.log.facts.Training.eval_overlap_s`) is drawn hatched
    over the epochs it overlapped, never subtracted from them. Each bar is named by its folder
    (`folder_labels`), benchmark and, for a run, its log. None: no run to show."""
    labels: list[str] = []
    values: list[tuple[float, ...]] = []
    names = folder_labels(report)
    for f in report.folders:
        if f.kind == "runs":
            for r in f.runs:
                split = _phases_min([r.facts])
                if split:
                    labels.append(f"{_run_label(f, r, names)} ({r.facts.timing.status})")
                    values.append(split)
        elif f.kind == "strong":
            split = _phases_min([r.facts for r in f.runs if r.facts.path not in f.dropped])
            if split:
                labels.append(_label(f, names))
                values.append(split)
    if not values:
        return None
    fig, (ax, share) = plt.subplots(1, 2, figsize=(13, 1.9 + 0.35 * len(labels)), layout="constrained",
                                    sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    rows = list(range(len(values)))
    unit = "minutes"
    if max(sum(max(x, 0.0) for x in v[:4]) for v in values) < 5.0:  # short runs read better in seconds
        values = [tuple(60.0 * x for x in v) for v in values]  # type: ignore[misc]
        unit = "seconds"
    totals = [sum(max(x, 0.0) for x in v[:4]) or 1.0 for v in values]
    left = [0.0] * len(values)
    left_pct = [0.0] * len(values)
    for i, (phase, color) in enumerate(zip(PHASES, PHASE_COLORS)):
        widths = [max(v[i], 0.0) for v in values]
        pct = [100.0 * w / t for w, t in zip(widths, totals)]
        ax.barh(rows, widths, left=left, color=color, label=phase)
        share.barh(rows, pct, left=left_pct, color=color)
        if i == 1 and any(v[4] > 0 for v in values):  # concurrent evaluation, over the epochs
            overlap = [min(max(v[4], 0.0), w) for v, w in zip(values, widths)]
            kw = dict(height=0.35, color="none", edgecolor=PHASE_COLORS[2], hatch="////", lw=0)
            ax.barh(rows, overlap, left=left, label="evaluation concurrent with training", **kw)
            share.barh(rows, [100.0 * o / t for o, t in zip(overlap, totals)], left=left_pct, **kw)
        left = [a + b for a, b in zip(left, widths)]
        left_pct = [a + b for a, b in zip(left_pct, pct)]
    ax.set_yticks(rows, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(unit)
    share.set_xlabel("share of staging + time to train (%)")
    share.set_xlim(0, 100)
    mean_note = "" if all(f.kind == "runs" for f in report.folders) else " (mean over each result's scored runs)"
    fig.suptitle("Where the time went: staging, training epochs, evaluation, residual" + mean_note)
    # below the bars, never over them
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", ncols=5, fontsize=8)
    for axis in (ax, share):
        axis.grid(axis="x", alpha=0.3)
    return fig


def convergence_figure(report: Report) -> Figure | None:
    """Quality metric vs epoch (samples for OpenFold), one panel per benchmark, target dashed;
    each line named by its folder (`folder_labels`), benchmark and, for a run, its log. None:
    no quality-metric records."""
    by_bench: dict[str, list[FolderResult]] = {}
    for f in report.folders:
        if f.kind in ("strong", "runs") and any(r.facts.quality.metric_series for r in f.runs):
            by_bench.setdefault(f.benchmark or "?", []).append(f)
    if not by_bench:
        return None
    names = folder_labels(report)
    n = len(by_bench)
    ncols = min(n, 2)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), layout="constrained",
                             squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(by_bench):]:
        ax.set_axis_off()
    cmap = plt.get_cmap("tab10")
    for ax, (bench, folders) in zip(flat, sorted(by_bench.items())):
        target = None
        metric, unit = None, "epoch"
        line = 0
        for i, f in enumerate(folders):
            for j, run in enumerate(f.runs):
                r = run.facts.quality
                if not r.metric_series:
                    continue
                # one colour per result folder; per run where runs are shown one by one
                color = cmap((line if f.kind == "runs" else i) % 10)
                line += 1
                xs, ys = zip(*r.metric_series)
                ax.plot(xs, ys, color=color, alpha=0.8, lw=1.2, marker="." if f.kind == "runs" else None,
                        label=(_label(f, names) if f.kind != "runs" else _run_label(f, run, names))
                        if j == 0 or f.kind == "runs" else None)
                target = r.target if r.target is not None else target
                metric = metric or r.metric_key
                unit = "samples" if run.facts.training.epoch_unit == "samples" else "epoch"
        if target is not None:
            ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target:g}")
        ax.set_title(bench)
        ax.set_xlabel(unit)
        ax.set_ylabel(metric or "metric")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    return fig


def scaling_figure(report: Report) -> Figure | None:
    """Olympic-mean time to train vs accelerators per model (log-log), one colour per benchmark;
    each point is labelled with its folder (`folder_labels`), each series with its benchmark
    (and round, division). None: no scored result carries a node count."""
    names = folder_labels(report)
    points: dict[tuple[str, str], list[tuple[int, float, str]]] = {}
    for f in report.folders:
        if f.kind in ("strong", "runs") and f.olympic_min is not None and f.accelerators:
            round_ = (f.round or "").replace("hpc_results_", "")
            # CPU-only systems (accelerators_per_node 0) count nodes, and are labelled so;
            # the division is part of the series: open and closed results are never joined
            tag = " ".join(x for x in (round_, f.division or "", "CPU nodes" if f.cpu_only else "") if x)
            points.setdefault((f.benchmark or "?", tag), []).append(
                (f.accelerators, f.olympic_min, names.get(f.path, f.path)))
    if not points:
        return None
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    benches = sorted({b for b, _ in points})
    rounds = sorted({r for _, r in points})
    cmap = plt.get_cmap("tab10")
    for (bench, round_), pts in sorted(points.items()):
        color = cmap(benches.index(bench) % 10)
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "osD^v"[rounds.index(round_) % 5],
                color=color, label=f"{bench} {round_}".strip(), ms=7, alpha=0.8)
        for x, y, name in pts:
            ax.annotate(f"{name} {bench}", (x, y), xytext=(4, 3), textcoords="offset points", fontsize=5,
                        color=color)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("accelerators per model (number_of_nodes x accelerators_per_node; nodes for CPU-only systems)")
    ax.set_ylabel("time to train, olympic mean (minutes)")
    ax.set_title("Time to train across systems (strong scaling)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def _scaling_why(report: Report) -> str:
    scored = [f for f in report.folders if f.kind in ("strong", "runs") and f.olympic_min is not None]
    if not scored:
        return "no strong-scaling result has a score (olympic mean)"
    return "no scored result carries a node count"


#: ``(file name, figure, why it is not written when the figure is None)``.
FIGURES = (("time-split", time_split_figure, lambda _: "no run has run_start, run_stop and epochs"),
           ("convergence", convergence_figure, lambda _: "no run logs a quality metric (eval records)"),
           ("scaling", scaling_figure, _scaling_why))


@dataclass
class PlotFiles:
    """What `write_plots` did: the PNGs written, and one line per figure left out saying why
    (``no scaling plot: no scored result carries a node count``)."""

    written: list[Path] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def write_plots(report: Report, out_dir: Path | str, prefix: str = "report-") -> PlotFiles:
    """Write the figures as ``<out_dir>/<prefix>{time-split,convergence,scaling}.png`` (150 dpi),
    each only where it has something to show: a figure with nothing in it is not written, and
    `PlotFiles.skipped` says why instead.

    Raises:
        ConfigError: ``out_dir`` cannot be created or a PNG cannot be written.
    """
    out = plots_folder(out_dir)
    files = PlotFiles()
    for name, make, why in FIGURES:
        with plot_text():  # names drawn as written, never read as mathtext
            fig = make(report)
            if fig is None:
                files.skipped.append(f"no {name} plot: {why(report)}")
                continue
            path = out / file_name(f"{prefix}{name}.png")
            save_png(fig, path)
        files.written.append(path)
    return files


def plots_folder(out_dir: Path | str) -> Path:
    """``--plots`` folder ``out_dir``, created where missing.

    Raises:
        ConfigError: it cannot be created.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plots {out}: cannot create folder ({exc.strerror})") from None
    return out


def save_png(fig: Figure, path: Path) -> None:
    """``fig`` as a 150 dpi PNG at ``path`` (atomic, mode 0644), then closed.

    Raises:
        ConfigError: it cannot be written.
    """
    try:
        with atomic_output(path, 0o644) as tmp:
            fig.savefig(tmp, dpi=150, format="png")
    except OSError as exc:
        raise ConfigError(f"--plots {path}: cannot write ({reason(exc)})") from None
    finally:
        plt.close(fig)
