"""PNG figures of a `Report` (matplotlib, Agg backend; nothing is shown on screen).

- ``report-time-split.png``: where the time went, per run (mlhpc run folders) or per result
  folder (mean over its scored runs): staging (before run_start), training epochs, evaluation,
  and the residual (time to train - epochs - evaluations).
- ``report-convergence.png``: the quality metric against epoch, one panel per benchmark, with
  the target as a dashed line.
- ``report-scaling.png``: time to train (olympic mean) against accelerators per model across
  systems, log-log, one colour per benchmark.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from mlhpc.errors import ConfigError  # noqa: E402
from mlhpc.report.runs import RunSummary  # noqa: E402
from mlhpc.report.score import FolderResult, Report  # noqa: E402

PHASES = ("staging", "training epochs", "evaluation", "residual")
PHASE_COLORS = ("#8c8c8c", "#1f77b4", "#ff7f0e", "#d62728")


def _label(f: FolderResult) -> str:
    if f.kind == "runs":
        return f"{f.system or Path(f.path).name} {f.benchmark or ''}".strip()
    return f"{f.submitter}/{f.system} {f.benchmark}"


def _phases_min(runs: list[RunSummary]) -> tuple[float, float, float, float, float] | None:
    """Mean minutes of staging, training epochs, evaluation outside the epochs, residual, and
    evaluation concurrent with the epochs (drawn over them, not added)."""
    usable = [r for r in runs if r.time_to_train_s is not None and r.residual_s is not None]
    if not usable:
        return None
    n = len(usable)
    # Staging inside the timed region (rules before v3.0) is carved out of the residual.
    inside = [(r.staging_s or 0.0) if r.staging_in_run else 0.0 for r in usable]
    return (sum((r.staging_s or 0.0) for r in usable) / n / 60,
            sum(r.total_train_s for r in usable) / n / 60,
            sum(r.total_eval_s - r.eval_overlap_s for r in usable) / n / 60,
            sum(r.residual_s - s for r, s in zip(usable, inside)) / n / 60,  # type: ignore[operator]
            sum(r.eval_overlap_s for r in usable) / n / 60)


def time_split_figure(report: Report) -> Figure:
    """Stacked bars of staging / epochs / evaluation / residual: minutes (seconds for runs under
    5 minutes) on the left, shares of the total on the right. Evaluation that ran concurrently
    with training (detected from the timestamps, `RunSummary.eval_overlap_s`) is drawn hatched
    over the epochs it overlapped, never subtracted from them."""
    labels: list[str] = []
    values: list[tuple[float, ...]] = []
    for f in report.folders:
        if f.kind == "runs":
            for r in f.runs:
                split = _phases_min([r])
                if split:
                    labels.append(f"{Path(r.path).name} ({r.status})")
                    values.append(split)
        elif f.kind == "strong":
            split = _phases_min([r for r in f.runs if r.path not in f.dropped])
            if split:
                labels.append(_label(f))
                values.append(split)
    height = 1.9 + 0.35 * max(len(labels), 1)
    fig, (ax, share) = plt.subplots(1, 2, figsize=(13, height), layout="constrained", sharey=True,
                                    gridspec_kw={"width_ratios": [3, 2]})
    if not values:
        ax.text(0.5, 0.5, "no run with run_start, run_stop and epochs", ha="center", va="center")
        ax.set_axis_off()
        share.set_axis_off()
        return fig
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


def convergence_figure(report: Report) -> Figure:
    """Quality metric vs epoch (samples for OpenFold), one panel per benchmark, target dashed."""
    by_bench: dict[str, list[FolderResult]] = {}
    for f in report.folders:
        if f.kind in ("strong", "runs") and any(r.metric_series for r in f.runs):
            by_bench.setdefault(f.benchmark or "?", []).append(f)
    n = max(len(by_bench), 1)
    ncols = min(n, 2)
    nrows = (n + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(6.5 * ncols, 4.5 * nrows), layout="constrained",
                             squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(by_bench):]:
        ax.set_axis_off()
    if not by_bench:
        flat[0].text(0.5, 0.5, "no quality-metric records", ha="center", va="center")
        return fig
    cmap = plt.get_cmap("tab10")
    for ax, (bench, folders) in zip(flat, sorted(by_bench.items())):
        target = None
        metric, unit = None, "epoch"
        line = 0
        for i, f in enumerate(folders):
            for j, r in enumerate(f.runs):
                if not r.metric_series:
                    continue
                # one colour per result folder; per run where runs are shown one by one
                color = cmap((line if f.kind == "runs" else i) % 10)
                line += 1
                xs, ys = zip(*r.metric_series)
                ax.plot(xs, ys, color=color, alpha=0.8, lw=1.2, marker="." if f.kind == "runs" else None,
                        label=(_label(f) if f.kind != "runs" else Path(r.path).name) if j == 0 or f.kind == "runs" else None)
                target = r.target if r.target is not None else target
                metric = metric or r.metric_key
                unit = "samples" if r.epoch_unit == "samples" else "epoch"
        if target is not None:
            ax.axhline(target, color="black", ls="--", lw=1, label=f"target {target:g}")
        ax.set_title(bench)
        ax.set_xlabel(unit)
        ax.set_ylabel(metric or "metric")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
    return fig


def scaling_figure(report: Report) -> Figure:
    """Olympic-mean time to train vs accelerators per model (log-log), one colour per benchmark."""
    points: dict[tuple[str, str], list[tuple[int, float]]] = {}
    for f in report.folders:
        if f.kind in ("strong", "runs") and f.olympic_min is not None and f.accelerators:
            round_ = (f.round or "").replace("hpc_results_", "")
            # CPU-only systems (accelerators_per_node 0) count nodes, and are labelled so;
            # the division is part of the series: open and closed results are never joined
            tag = " ".join(x for x in (round_, f.division or "", "CPU nodes" if f.cpu_only else "") if x)
            points.setdefault((f.benchmark or "?", tag), []).append((f.accelerators, f.olympic_min))
    fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    if not points:
        ax.text(0.5, 0.5, "no scored result with a node count", ha="center", va="center")
        ax.set_axis_off()
        return fig
    benches = sorted({b for b, _ in points})
    rounds = sorted({r for _, r in points})
    cmap = plt.get_cmap("tab10")
    for (bench, round_), pts in sorted(points.items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "osD^v"[rounds.index(round_) % 5],
                color=cmap(benches.index(bench) % 10), label=f"{bench} {round_}".strip(), ms=7, alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("accelerators per model (number_of_nodes x accelerators_per_node; nodes for CPU-only systems)")
    ax.set_ylabel("time to train, olympic mean (minutes)")
    ax.set_title("Time to train across systems (strong scaling)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)
    return fig


def write_plots(report: Report, out_dir: Path | str, prefix: str = "report-") -> list[Path]:
    """Write the three figures as ``<out_dir>/<prefix>{time-split,convergence,scaling}.png``.

    Returns the paths written (150 dpi PNGs).

    Raises:
        ConfigError: ``out_dir`` cannot be created or written.
    """
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--plots {out}: cannot create folder ({exc.strerror})") from None
    written = []
    for name, make in (("time-split", time_split_figure), ("convergence", convergence_figure),
                       ("scaling", scaling_figure)):
        fig = make(report)
        path = out / f"{prefix}{name}.png"
        try:
            fig.savefig(path, dpi=150)
        except OSError as exc:
            raise ConfigError(f"--plots {path}: cannot write ({exc.strerror})") from None
        finally:
            plt.close(fig)
        written.append(path)
    return written
