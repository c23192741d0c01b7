"""What `mlhpc run` shows (part of the command line, which alone prints): its progress and its
end-of-run table.

`RunProgress` receives the events `mlhpc.train.run` reports (start, synthesis, step, epoch,
warning) and prints one line each: through rich on a terminal, plain and flushed when stdout is
a file (a Slurm log), at the same cadence (a ``step N/M`` line every ``train.log_every_steps``).
`print_summary` prints the `mlhpc.results` figures read back from the run's log.
"""

from __future__ import annotations

import sys
from typing import Any


class RunProgress:
    """Progress for `mlhpc run`: a rich live line on a terminal, plain lines otherwise (Slurm)."""

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(stderr=False)
        self.tty = sys.stdout.isatty()

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event["kind"]
        if kind == "start":
            self.console.print(f"[bold]mlhpc run[/bold] {event['workload']}: logging to "
                               f"{event['result_file']}", highlight=False)
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
            self.console.print(f"[yellow]warning:[/yellow] {event['message']}", highlight=False)
        elif kind == "step":  # every train.log_every_steps, on a terminal and in a log file
            self._line(f"  step {event['step']}/{event['steps']} (epoch {event['epoch']}) "
                       f"loss {event['loss']:.4f}")
        elif kind == "synthesis":
            counts = event.get("samples") or {}
            size = (", ".join(f"{n} {k.removesuffix('_samples')}" for k, n in counts.items())
                    + " samples" if counts else "its synth section's samples")
            self._line(f"synthesising the embedded {event['workload']} dataset ({size}) into "
                       f"{event['path']} (folder {event['state']}); made once, reused by later runs")
        elif kind == "synthesised":
            self._line(f"synthesised {event['path']} in {event['seconds']:.1f} s")

    def _line(self, line: str) -> None:
        """One line: through rich on a terminal, plain and flushed in a log file (Slurm)."""
        if self.tty:
            self.console.print(line, highlight=False)
        else:
            print(line, flush=True)


def print_summary(summary: dict[str, Any]) -> None:
    """The end-of-run table: `mlhpc.results` figures, read back from the run's log."""
    from rich.console import Console
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
        ("staging", f"{_secs(s.get('staging_s'))} ({(s.get('staged_bytes') or 0) / 1e6:.1f} MB)"),
        *_staging_rows(s),
        ("init", _secs(s.get("init_s"))),
        ("data synthesis (before init)", _secs(s.get("synthesis_s"))),
        ((f"epochs to target ({s['metric_key']} {sign} {s['target']})" if s["status"] == "success"
          else "epochs run (target not reached)"), f"{s['epochs']}"),
        (f"final {s['metric_key']}", "n/a" if s.get("metric_value") is None else f"{s['metric_value']:.4f}"),
        ("mean epoch time", _secs(s.get("mean_epoch_s"))),
        ("training throughput", f"{s.get('samples_per_s') or 0:.1f} samples/s"),
        ("evaluation time (total)", _secs(s.get("total_eval_s"))),
        ("residual (time to train - epochs - evals)", _secs(s.get("residual_s"))),
        ("training FLOPs per sample (FlopCounterMode)",
         f"{perf.get('train_flops_per_sample', 0) / 1e9:.3f} GFLOP"),
        ("achieved FLOP/s (MFU)", f"{perf.get('achieved_flop_per_s', 0) / 1e9:.2f} GFLOP/s "
         f"({100 * (perf.get('mfu') or 0):.1f}% of {perf.get('peak_source', '?')})"),
        ("global batch size / ranks / nodes",
         f"{s.get('global_batch_size')} / {s.get('world_size')} / {s.get('num_nodes')}"),
        ("result log", str(s["path"])),
        *([("resumed from", s["resumed_from"])] if s.get("resumed_from") else []),
        *([("checkpoint", s["checkpoint"])] if s.get("checkpoint") else []),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console = Console()
    console.print(table)
    if s.get("departs_from_reference"):
        console.print("departs from the reference: " + "; ".join(s["departs_from_reference"]),
                      highlight=False)


def _staging_rows(s: dict[str, Any]) -> list[tuple[str, str]]:
    """Where staging sat and, on several nodes, its per-node figures (`StagingResult.node_summary`)."""
    staged = s.get("staging") or {}
    nodes = staged.get("nodes_summary") or {}
    rows = [("staging placement", "inside the run (after run_start)" if s.get("staging_in_run")
             else "initialisation (before run_start)")] if staged else []
    if nodes.get("nodes", 0) > 1:
        per_node = ", ".join(f"{b / 1e6:.1f} MB @ {g:.2f} GB/s" for b, g in
                             zip(nodes["node_staged_bytes"], nodes["node_gb_per_s"]))
        rows.append((f"staging per node ({nodes['nodes']} nodes, shard {'node' if staged.get('shard') else 'none'})",
                     f"slowest {nodes['slowest_node_s']:.2f} s, mean {nodes['mean_node_s']:.2f} s, "
                     f"aggregate {nodes['aggregate_gb_per_s']:.2f} GB/s; {per_node}"))
    return rows


def _secs(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"
