"""Time to train and parallel efficiency against node count, own runs beside published ones.

Runs of one benchmark that succeeded are grouped into series: own runs by system name (mini runs,
whose config departs from the reference, apart and marked), published runs by submitter and round (MLCommons names a system per size, e.g. ``..._n128_...``). MLPerf's
weak-scaling folders (many concurrent models, a throughput score) are left out: their time to
train is not one model's. At each node count the time to train is the olympic mean of the runs
(MLCommons' rule) when there are at least 3, else their mean, said in the ``how`` column.

Parallel efficiency is relative to the series' smallest node count n0:

- strong scaling (the same global problem on more nodes): E(n) = T(n0) n0 / (T(n) n);
- weak scaling (the problem grows with the nodes, e.g. a fixed local batch): E(n) = T(n0) / T(n).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.report.score import compute_olympic_average

MODES = ("strong", "weak")


@dataclass
class Point:
    """One node count of a series: times to train (s) and the batch sizes seen."""

    nodes: int
    times_s: list[float] = field(default_factory=list)
    batch_sizes: set[int] = field(default_factory=set)
    efficiency: float | None = None

    @property
    def time_s(self) -> float:
        if len(self.times_s) >= 3:
            return compute_olympic_average(self.times_s, 0)  # type: ignore[return-value]
        return statistics.fmean(self.times_s)

    @property
    def how(self) -> str:
        return "olympic mean" if len(self.times_s) >= 3 else "mean"


@dataclass
class Series:
    label: str
    source: str
    points: dict[int, Point] = field(default_factory=dict)


def _label(row: dict[str, Any]) -> str:
    """The series a row belongs to; an own run whose config departs from the reference (a mini
    config: smaller model and data, one CPU) is its own series, marked ``mini``, never pooled or
    shown unmarked beside full-size runs."""
    if row["source"] == "own":
        mini = ", mini: departs from the reference" if row.get("departs_from_reference") else ""
        return f"{row['system'] or '?'} (own{mini})"
    return f"{row['submitter'] or '?'} {row['round'] or ''} (published)".replace("  ", " ")


def build_series(rows: list[dict[str, Any]], mode: str = "strong") -> list[Series]:
    """Rows of `mlhpc.store.queries.select_runs` -> series with efficiencies (see the module).

    Raises:
        ValueError: an unknown ``mode``.
    """
    if mode not in MODES:
        raise ValueError(f"scaling mode {mode!r}: one of {', '.join(MODES)}")
    series: dict[str, Series] = {}
    for row in rows:
        if row["status"] != "success" or row["time_to_train_s"] is None or not row["nodes"] \
                or row["scaling"] == "weak":
            continue
        s = series.setdefault(_label(row), Series(_label(row), row["source"]))
        point = s.points.setdefault(int(row["nodes"]), Point(int(row["nodes"])))
        point.times_s.append(float(row["time_to_train_s"]))
        if row["global_batch_size"]:
            point.batch_sizes.add(int(row["global_batch_size"]))
    for s in series.values():
        base = s.points[min(s.points)]
        for point in s.points.values():
            ratio = base.time_s / point.time_s
            point.efficiency = ratio * base.nodes / point.nodes if mode == "strong" else ratio
    return sorted(series.values(), key=lambda s: (s.source != "own", s.label))


def table_rows(series: list[Series]) -> list[dict[str, Any]]:
    """One dict per point: series, source, nodes, runs, time_to_train_min, how, efficiency,
    global_batch_size."""
    return [{"series": s.label, "source": s.source, "nodes": p.nodes, "runs": len(p.times_s),
             "time_to_train_min": p.time_s / 60.0, "how": p.how, "efficiency": p.efficiency,
             "global_batch_size": ",".join(str(b) for b in sorted(p.batch_sizes)) or None}
            for s in series for p in (s.points[n] for n in sorted(s.points))]


#: One colour and one marker per series, in order (matplotlib's tab10, then ten more that stay
#: apart from them; markers that stay apart in print): series i gets colour i mod 20 and marker
#: i mod 11, so no two of the first 11 series share either, no two of the first 20 share a
#: colour, and no two of the first 220 share both.
COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink",
           "tab:gray", "tab:olive", "tab:cyan", "black", "gold", "navy", "lime", "magenta", "sienna",
           "darkslategray", "crimson", "teal", "indigo")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h", "*")


def series_style(index: int, source: str) -> dict[str, Any]:
    """matplotlib line keywords of the ``index``-th series: own runs solid with filled markers,
    published ones dashed with hollow markers (white face), both in the series' own colour."""
    colour = COLOURS[index % len(COLOURS)]
    own = source == "own"
    return {"color": colour, "marker": MARKERS[index % len(MARKERS)], "markersize": 7,
            "linestyle": "-" if own else "--", "linewidth": 2.0 if own else 1.2,
            "markerfacecolor": colour if own else "white", "markeredgecolor": colour,
            "markeredgewidth": 1.5}


def figure(series: list[Series], title: str, mode: str = "strong") -> Any:
    """The scaling figure (a matplotlib ``Figure``, Agg backend): time to train (min, log-log)
    and parallel efficiency (dimensionless) against nodes, one line per series styled by
    `series_style`, one legend below the panels naming each series "(own)" or "(published)"."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(11, 4.5))
    for i, s in enumerate(series):
        nodes = sorted(s.points)
        style = series_style(i, s.source)
        ax_t.plot(nodes, [s.points[n].time_s / 60.0 for n in nodes], label=s.label, **style)
        ax_e.plot(nodes, [s.points[n].efficiency for n in nodes], label=s.label, **style)
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("nodes (count, log2 scale)")
        ax.grid(True, which="both", alpha=0.3)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time to train (min, log scale)")
    ax_e.set_ylabel(f"{mode}-scaling efficiency (ratio, 1 = ideal)")
    ax_e.axhline(1.0, color="grey", linewidth=0.8)
    handles, labels = ax_t.get_legend_handles_labels()
    rows = (len(labels) + 2) // 3
    legend_in = 0.2 * (rows + 1) + 0.25  # the legend's rows and its title, inches
    fig.set_size_inches(11, 4.5 + legend_in)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize="small", frameon=False,
               title="solid, filled: own runs; dashed, hollow: published (MLCommons)",
               title_fontsize="small")
    fig.suptitle(title)
    fig.tight_layout(rect=(0, legend_in / (4.5 + legend_in), 1, 1))
    return fig


def plot(series: list[Series], path: Path, title: str, mode: str = "strong") -> Path:
    """Draw `figure` into ``path`` (PNG, 110 dpi).

    Raises:
        OutputError: ``path`` names no file or cannot be one (`mlhpc.data.outputs.output_file`).
        OSError: the file cannot be written.
    """
    import matplotlib.pyplot as plt

    from mlhpc.data.files import atomic_output
    from mlhpc.data.outputs import output_file
    from mlhpc.text import plot_text

    path = output_file(path, "--plot")  # the name asked for, used as given or refused
    with plot_text():  # names drawn as written, never read as mathtext
        fig = figure(series, title, mode)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_output(path, 0o644) as tmp:
                fig.savefig(tmp, dpi=110, format="png")
        finally:
            plt.close(fig)
    return path
