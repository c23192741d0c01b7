"""What `mlhpc run` shows (part of the command line, which alone prints): its progress and its
end-of-run table.

`RunProgress` receives the events `mlhpc.run.command.run` reports (start, synthesis, step, epoch,
warning) and prints one line each: through rich on a terminal, plain and flushed when stdout is
a file (a Slurm log), at the same cadence (a ``step N/M`` line every ``train.log_every_steps``).
`print_summary` prints the `mlhpc.run.result` figures read back from the run's log.
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO, Any

from mlhpc.text import console, echo, joined, styled

#: The longest a log file (not a terminal) goes without a synthesis line, in seconds.
LOG_INTERVAL_S = 5.0


def size_text(n_bytes: float) -> str:
    """``n_bytes`` for people: ``"4.83 GB"``, ``"12.4 MB"``, ``"56 kB"`` (powers of 1000)."""
    if n_bytes >= 1e9:
        return f"{n_bytes / 1e9:.2f} GB"
    if n_bytes >= 1e6:
        return f"{n_bytes / 1e6:.1f} MB"
    return f"{n_bytes / 1e3:.0f} kB"


def rate_text(bytes_per_s: float) -> str:
    """A data rate for people: ``"1.23 GB/s"``, ``"45.6 MB/s"``, ``"38 kB/s"`` (powers of 1000)."""
    if bytes_per_s >= 1e9:
        return f"{bytes_per_s / 1e9:.2f} GB/s"
    return f"{bytes_per_s / 1e6:.1f} MB/s" if bytes_per_s >= 1e6 else f"{bytes_per_s / 1e3:.0f} kB/s"


class SynthLines:
    """The synthesis events of `mlhpc.data.embedded.SynthWatch` for people: before the first
    sample, one line with the samples, the estimated bytes and the folder (and, for a gigabyte
    or more, that it writes gigabytes); then a rich bar on a terminal, or in a log file a
    ``synth N/M samples, bytes, elapsed, left`` line every `LOG_INTERVAL_S` seconds or tenth of
    the samples, whichever comes first, and one at the end. ``note``, if given, is printed
    before the first line."""

    def __init__(self, stream: IO[str], note: str | None = None) -> None:
        self.stream, self.note = stream, note
        self.tty = stream.isatty()
        self.bar: Any = None
        self.task: Any = None
        self.last_line = 0.0
        self.last_done = 0

    def __call__(self, event: dict[str, Any]) -> None:
        if event["kind"] == "synth_plan":
            self.plan(event)
        elif event["kind"] == "synth_progress":
            self.progress(event)
        elif event["kind"] == "synth_done":
            self.close()
            for line in self.summary(event):
                self._print(line)

    def plan(self, event: dict[str, Any]) -> None:
        size = (f"about {size_text(event['bytes'])}" if event.get("bytes") is not None
                else "size known once written")
        if self.note:  # said once writing starts, never before an error
            self._print(self.note)
        what = f"{event['samples']} samples" if event.get("samples") is not None else "the dataset"
        self._print(f"writing {what} ({size}) into {event['path']}")
        if (event.get("bytes") or 0) >= 1e9:
            self._print(f"note: this writes {size_text(event['bytes'])}; check that the file "
                        "system holds it (interrupted, it resumes where it stopped)")
        self.last_line = time.monotonic()
        if self.tty:
            from rich.progress import Progress

            self.bar = Progress(transient=True, console=console(file=self.stream))
            self.bar.start()
            self.task = self.bar.add_task("synthesising", total=event["samples"] or None)

    def progress(self, event: dict[str, Any]) -> None:
        done, total = event.get("done"), event.get("samples")
        if self.bar is not None:
            counts = f" {done}/{total} samples," if total is not None else ""
            self.bar.update(self.task, completed=done or 0,
                            description=f"synthesising{counts} {size_text(event['bytes'])}")
            return
        now = time.monotonic()
        tenth = max(1, -(-(total or 0) // 10))
        final = total is not None and done == total and self.last_done != total
        if not (final or now - self.last_line >= LOG_INTERVAL_S
                or (done is not None and done - self.last_done >= tenth)):
            return
        self.last_line, self.last_done = now, done or 0
        self._print(self.line(event))

    @staticmethod
    def line(event: dict[str, Any]) -> str:
        """``  synth 12/80 samples, 0.72 GB of about 4.83 GB, 36 s, 0.02 GB/s, about 204 s
        left``; of several ranks, ``  rank 1/4: synth ...`` with this rank's own bytes."""
        ranks = event.get("ranks") or 1
        head = f"  rank {event['rank']}/{ranks}: synth" if ranks > 1 else "  synth"
        parts = [f"{head} {event['done']}/{event['samples']} samples"] if event.get("samples") \
            else [head]
        planned = event.get("planned_bytes")
        written = event["rank_bytes"] if ranks > 1 and event.get("rank_bytes") is not None else event["bytes"]
        if planned or written >= 1000:
            parts.append(size_text(written) + (f" of about {size_text(planned)}"
                                               if planned else " written"))
        else:  # a workload that computes samples before it writes them: say so, not "0 kB"
            parts.append("no data on disk yet")
        parts.append(f"{event['elapsed_s']:.0f} s")
        if written >= 1000 and event["elapsed_s"] > 0:  # a rate of data on disk, never "0 kB/s"
            parts.append(rate_text(written / event["elapsed_s"]))
        if event.get("eta_s") is not None:
            parts.append(f"about {event['eta_s']:.0f} s left")
        return ", ".join(parts)

    @staticmethod
    def summary(event: dict[str, Any]) -> list[str]:
        """The end of a synthesis (``synth_done``): files, bytes, seconds and GB/s in all, then
        each rank's GB/s (of more than 8 ranks: the slowest, median and fastest)."""
        lines = [f"synthesised {event['files']} files, {size_text(event['bytes'])} in "
                 f"{event['elapsed_s']:.1f} s: {rate_text(event['bytes'] / max(event['elapsed_s'], 1e-9))} in all"]
        ranks = event["ranks"]
        in_bytes = all(f.get("bytes") is not None for f in ranks)  # else samples: no estimate
        rates = sorted(((f["bytes"] if in_bytes else f["samples"] or 0) / max(f["elapsed_s"], 1e-9),
                        f["rank"]) for f in ranks)
        if len(ranks) > 1:
            shown = rates if len(rates) <= 8 else [rates[0], rates[len(rates) // 2], rates[-1]]
            label = "per rank" if len(rates) <= 8 else "per rank (slowest, median, fastest)"
            lines.append(f"  {label}: " + ", ".join(
                f"rank {r} {rate_text(v) if in_bytes else f'{v:.1f} samples/s'}" for v, r in shown))
        return lines

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None

    def _print(self, line: str) -> None:
        echo(line, file=self.stream)


def where_line(name: str, key: str, event: dict[str, Any]) -> str:
    """``data: /abs/path``, saying when the config's value (``key``) was relative and so was
    resolved against the current folder (not the config file's)."""
    field = "data" if name == "data" else "output"
    given = event[f"{field}_given"]
    line = f"{name}: {event[field]}"
    if not given.startswith("/"):
        line += f" ({key} {given} is relative: resolved against the current folder {event['cwd']})"
    return line


class RunProgress:
    """Progress for `mlhpc run`: a rich live line on a terminal, plain lines otherwise (Slurm)."""

    def __init__(self) -> None:
        self.console = console(stderr=False)
        self.tty = sys.stdout.isatty()
        self.synth = SynthLines(sys.stdout)

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "where":
            for name, key in (("data", "data.path"), ("results", "output.dir")):
                self._line(where_line(name, key, event))
        elif kind == "start":
            self._line(f"mlhpc run {event['workload']}: logging to "  # whole, never wrapped
                       f"{os.path.abspath(event['result_file'])}")
        elif kind == "epoch":
            reached = "  target reached" if event["reached"] else ""
            if event.get("instance") is not None:
                reached += f"  [instance {event['instance']}]"
            line = (f"epoch {event['epoch']:>3}/{event['max_epochs']}  {event['metric_key']} "
                    f"{event['metric']:.4f} (target {event['target']})  loss {event['train_loss']:.4f}  "
                    f"{event['samples_per_s']:.1f} samples/s  epoch {event['epoch_s']:.1f} s  "
                    f"eval {event['eval_s']:.1f} s{reached}")
            self._line(line)
        elif kind == "warning":
            self.console.print(joined(styled("warning:", "yellow"), " ", event["message"]))
        elif kind == "note":  # one whole line: a path in it is never wrapped
            self._line(event["message"])
        elif kind == "step":  # every train.log_every_steps, on a terminal and in a log file
            self._line(f"  step {event['step']}/{event['steps']} (epoch {event['epoch']}) "
                       f"loss {event['loss']:.4f}")
        elif kind == "synthesis":
            counts = event.get("samples") or {}
            size = (", ".join(f"{n} {k.removesuffix('_samples')}" for k, n in counts.items())
                    + " samples" if counts else "its synth section's samples")
            self._line(f"synthesising the embedded {event['workload']} dataset ({size}) into "
                       f"{event['path']} (folder {event['state']}); made once, reused by later runs")
        elif kind in ("synth_plan", "synth_progress"):
            self.synth(event)
        elif kind == "synthesised":
            self.synth.close()
            self._line(f"synthesised {event['path']} in {event['seconds']:.1f} s")

    def _line(self, line: str) -> None:
        """One line: through rich on a terminal, plain and flushed in a log file (Slurm)."""
        if self.tty:
            self.console.print(line, highlight=False)
        else:
            echo(line, file=sys.stdout)


class DataProgress:
    """Progress of `data check | convert | prepare`, on stderr (stdout keeps the result, JSON
    included): a rich bar on a terminal, otherwise a plain line per tenth of the files (a Slurm
    log)."""

    def __init__(self) -> None:
        self.tty = sys.stderr.isatty()
        self.bar: Any = None
        self.task: Any = None
        self.step = 1

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "start":
            files = event["files"]
            skipped = event.get("skipped", 0)
            if skipped:
                echo(f"{event['what']}: {skipped} of {files} files already done (resumed)", file=sys.stderr)
            self.step = max(1, files // 10)
            if self.tty:
                from rich.progress import Progress

                self.bar = Progress(transient=True, console=console(stderr=True))
                self.bar.start()
                self.task = self.bar.add_task(event["what"], total=files, completed=skipped)
        elif kind == "file":
            if self.bar is not None:
                self.bar.update(self.task, completed=event["done"])
            elif event["done"] % self.step == 0 or event["done"] == event["files"]:
                gb = event.get("bytes_read")
                read = f", {gb / 1e9:.3f} GB read" if gb is not None else ""
                echo(f"{event['done']}/{event['files']} files{read}", file=sys.stderr)
        elif kind == "done":
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


def _unit(s: dict) -> str:
    """What ``epoch_num`` counts in this run's log: "epochs", or "samples" where the rules count
    the benchmark's epochs in training samples (OpenFold)."""
    return "samples" if s.get("epoch_unit") == "samples" else "epochs"


def _epochs(s: dict[str, Any]) -> str:
    """Epochs to the target when reached, else the last epoch run (a summary's figures)."""
    done = s.get("epochs_to_target")
    done = done if done is not None else (s.get("last_epoch") or s.get("n_epochs") or 0)
    return f"{done:g}"


def _known(value: float | None, form: str, scale: float = 1.0) -> str:
    """``value * scale`` in ``form``, or "unknown" where the log gave no figure (a resumed
    OpenFold run counts no samples trained): never a 0 the run did not measure."""
    return "unknown" if value is None else form.format(value * scale)


def print_summary(summary: dict[str, Any]) -> None:
    """The end-of-run table: `mlhpc.run.result` figures, read back from the run's log."""
    from rich.table import Table

    s, perf = summary, summary.get("perf", {})
    table = Table(title=f"{s['workload']}: {s['status']}" + (f" ({s['reason']})" if s.get("reason") else ""),
                  show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right")
    sign = "<=" if s.get("target_direction") == "min" else ">="
    rows = [
        ("time to train (run_stop - run_start)", _secs(s.get("time_to_train_s"))),
        *([("time to train, all attempts (resumed: not a scored run)",
            f"{_secs(s.get('time_to_train_total_s'))} ({_secs(s.get('earlier_attempts_s'))} before "
            "the resume)")] if s.get("resumed") else []),
        ("staging", _staging_text(s)),
        *_staging_rows(s),
        ("init", _secs(s.get("init_s"))),
        ("data synthesis (before init)", _secs(s.get("synthesis_s"))),
        ((f"{_unit(s)} to target ({s['metric_key']} {sign} {s['target']})" if s["status"] == "success"
          else f"{_unit(s)} run (target not reached)"), _epochs(s)),
        (f"final {s['metric_key']}", f"{s['metric_series'][-1][1]:.4f}" if s.get("metric_series") else "n/a"),
        ("mean epoch time", _secs(s.get("mean_epoch_s"))),
        ("training throughput", _known(s.get("samples_per_s"), "{:.1f} samples/s")),
        *([("accelerator utilization (storage mode)", _au_text(s["emulation"]))] if s.get("emulation") else []),
        ("evaluation time (total)", _secs(s.get("total_eval_s"))),
        ("residual (time to train - epochs - evals)", _secs(s.get("residual_s"))),
        ("training FLOPs per sample (FlopCounterMode)",
         f"{perf.get('train_flops_per_sample', 0) / 1e9:.3f} GFLOP"),
        ("achieved FLOP/s (MFU)", "none (storage mode: the steps compute nothing)" if s.get("emulation") else
         _known(perf.get("achieved_flop_per_s"), "{:.2f} GFLOP/s", 1e-9)
         + (f" ({100 * perf['mfu']:.1f}% of {perf.get('peak_source', '?')})" if perf.get("mfu") is not None else "")),
        ("global batch size / ranks / nodes",
         f"{s.get('global_batch_size')} / {s.get('world_size')} / {s.get('num_nodes')}"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    out = console()
    out.print(table)
    for name, value in _path_lines(s):  # whole lines: a path is never cut or wrapped by the table
        echo(f"{name}: {value}", file=sys.stdout)
    if s.get("departs_from_reference"):
        out.print("departs from the reference: " + "; ".join(s["departs_from_reference"]),
                      highlight=False)


def _au_text(e: dict[str, Any]) -> str:
    """A storage-mode run's AU, its minimum and whether it was met (`mlhpc.log.emulated`)."""
    minimum = e.get("min_accelerator_utilization") or 0.0
    return (f"{100 * e['accelerator_utilization']:.1f}% on emulated {e.get('accelerator')} "
            f"(minimum {100 * minimum:.0f}%: {'met' if e.get('meets_minimum') else 'NOT met'})")


def _path_lines(s: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary's paths: the result log, where the run resumed from and its checkpoint. (The
    staged copy's place and size are said when the run ends: `mlhpc.data.stage.copies.release`.)"""
    return [("result log", str(s["path"]))] + [
        (name, s[key]) for name, key in (("resumed from", "resumed_from"), ("checkpoint", "checkpoint")) if s.get(key)]


def _staging_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Where staging sat and, on several nodes, its per-node figures (`StagingResult.node_summary`)."""
    staged = s.get("staging") or {}
    nodes = staged.get("nodes_summary") or {}
    rows = [("staging placement", "inside the run (after run_start)" if s.get("staging_in_run")
             else "initialisation (before run_start)")] if staged else []
    if nodes.get("nodes", 0) > 1 and not nodes.get("aggregate_gb_per_s"):
        rows.append((f"staging per node ({nodes['nodes']} nodes)",
                     "not staged: every node's copy already in place (nothing copied)"))
    elif nodes.get("nodes", 0) > 1:
        per_node = ", ".join(f"{b / 1e6:.1f} MB @ {g:.2f} GB/s" for b, g in
                             zip(nodes["node_staged_bytes"], nodes["node_gb_per_s"]))
        rows.append((f"staging per node ({nodes['nodes']} nodes, shard {'node' if staged.get('shard') else 'none'})",
                     f"slowest {nodes['slowest_node_s']:.2f} s, mean {nodes['mean_node_s']:.2f} s, "
                     f"aggregate {nodes['aggregate_gb_per_s']:.2f} GB/s; {per_node}"))
    return rows


def _staging_text(s: dict[str, Any]) -> str:
    """Staging seconds and the bytes the nodes hold; ``not staged`` where the data were read in
    place (no staging records)."""
    if not s.get("staging"):
        return "not staged (read in place)"
    return f"{_secs(s.get('staging_s'))} ({(s.get('staged_bytes') or 0) / 1e6:.1f} MB held)"


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def print_staging(staged: dict[str, Any]) -> None:
    """`mlhpc stage`'s table: what each node holds, what was copied, how fast (``staged``:
    `mlhpc.data.stage.StagingResult.to_dict`)."""
    from rich.table import Table

    table = Table(title=f"staged {staged['source']} -> {staged['dest']}", show_header=False)
    table.add_column("quantity")
    table.add_column("value", justify="right", overflow="fold")
    gb = staged["copied_bytes"] / 1e9
    rows = [("files held (all nodes)", f"{staged['staged_files']:,} ({staged['staged_bytes'] / 1e9:.3f} GB)"),
            ("copied this time", f"{staged['copied_files']:,} files, {gb:.3f} GB"),
            ("already in place (verified)", f"{staged['skipped_files']:,} files"),
            ("pruned (not in the plan)", f"{staged['pruned_files']:,} files"),
            ("time (slowest rank)", f"{staged['elapsed_s']:.2f} s"),
            ("aggregate copy bandwidth", f"{staged['gb_per_s']:.2f} GB/s" if staged["copied_files"]
             else "nothing copied"),
            ("shard", "per node" if staged.get("shard") else "none: every node holds everything"),
            ("converted to", staged.get("to", "none")),
            ("manifest", str(staged["manifest"]))]
    if staged.get("offline"):
        rows.append(("source", "not reachable: the complete verified copy was used"))
    for name, value in rows:
        table.add_row(name, value)
    console().print(table)
