"""``mlhpc automl``: AIPerf's benchmark, an AutoML search scored in FLOPS (docs/automl.md)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import click

from mlhpc.errors import one_line_errors
from mlhpc.text import echo

SET_HELP = "Override a config value, e.g. --set automl.budget_s=600 (repeatable)."


@click.command("automl", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("config_path", type=click.Path(path_type=Path))
@click.option("--workers", type=click.IntRange(1, 4096), default=1, show_default=True,
              help="Workers on this node, each running one trial at a time (the node's cores shared).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--prepare", "step", flag_value="prepare",
              help="Only prepare the search (data, study, study.json: the clock starts); for job scripts.")
@click.option("--worker", "step", flag_value="worker",
              help="Only be one worker of a prepared search (a Slurm job step per node or GPU).")
@click.option("--finish", "step", flag_value="finish",
              help="Only close a search whose workers have ended (stale trials failed, end time written).")
@click.option("--knobs", is_flag=True, help="List the knobs CONFIG's workload may search, and exit.")
@one_line_errors()
def automl_command(config_path: Path, workers: int, overrides: tuple[str, ...], step: str | None,
                   knobs: bool) -> None:
    """Search CONFIG's `automl.space` with Optuna (TPE, a pruner on each trial's evaluations) for
    `automl.budget_s` seconds, every trial an ordinary `mlhpc run` in OUTPUT/trial_N; then score
    the search as AIPerf does (FLOPs / time, and x ln(1/Error), at every `automl.mark_every_s`).

    Exit status: 0 the search ran and passed its validity gates, 1 a gate failed, 2 bad input,
    128 + N a signal N stopped it. `mlhpc report OUTPUT` shows the score again."""
    from mlhpc import config as cfg

    config = cfg.load(config_path, overrides)
    if knobs:
        _print_knobs(config.workload)
        return
    if step == "worker":
        sys.exit(_worker(config))
    from mlhpc.automl import launch

    if step in (None, "prepare"):
        study = launch.prepare(config, _progress)
        echo(f"mlhpc: search {study.study_name} prepared in {config.output.dir} ({study.storage}); "
             f"budget {study.budget_s:g} s, a mark every {study.mark_every_s:g} s", err=True)
        if step == "prepare":
            return
        threads = config.automl.trial_threads or launch.default_threads(workers)  # type: ignore[union-attr]
        statuses = launch.start_workers(config_path, overrides, workers, threads)
        echo(f"mlhpc: workers ended with {', '.join(map(str, statuses))}", err=True)
    launch.finish(config)
    sys.exit(_score(Path(config.output.dir)))


def _print_knobs(workload: str) -> None:
    from mlhpc.automl.space import knobs_of

    for knob in knobs_of(workload).values():
        echo(f"{knob.key:<32} {knob.kind:<15} {knob.meaning}")


class _Signals:
    """The first SIGTERM or SIGINT a worker gets: its trial is stopped and the worker ends."""

    def __init__(self) -> None:
        self.name: str | None = None
        for s in (signal.SIGTERM, signal.SIGINT):
            signal.signal(s, self._got)

    def _got(self, signum: int, _frame: Any) -> None:
        self.name = self.name or signal.Signals(signum).name


def _worker(config: Any) -> int:
    """One worker until the budget ends; 0, or 128 + N after signal N."""
    from mlhpc.automl.worker import work, worker_name

    signals = _Signals()
    me = worker_name()
    result = work(config, lambda: signals.name, lambda event: _say(me, event))
    if result.signal is not None:
        return 128 + int(signal.Signals[result.signal])
    return 0


def _say(worker: str, event: dict[str, Any]) -> None:
    """One line per trial event, naming the worker."""
    kind, number = event["kind"], event.get("trial")
    if kind == "trial":
        values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in event["values"].items())
        echo(f"[{worker}] trial {number}: {values} -> {event['folder']}")
    elif kind == "told":
        value = event.get("value")
        shown = f"best {value:.4g}" if isinstance(value, float) else event.get("why", "no evaluation")
        stopped = f", stopped: {event['stopped']}" if event.get("stopped") else ""
        echo(f"[{worker}] trial {number} {event['state']}: {shown} "
             f"({event.get('evaluations', 0)} evaluations{stopped})")
    elif kind == "stale":
        echo(f"[{worker}] trial {number} FAIL: its worker stopped beating")


def _progress(event: dict[str, Any]) -> None:
    if event.get("kind") in ("synthesis", "synthesised"):
        echo(f"mlhpc: {event['kind']} {event.get('path', '')}", err=True)


def _score(folder: Path) -> int:
    """The search's score as ``mlhpc report FOLDER`` prints it (`mlhpc.report.automl_render`);
    0 when its gates passed, else 1."""
    from mlhpc.report.automl import score_folder
    from mlhpc.report.automl_render import automl_report
    from mlhpc.text import console

    outcome = automl_report(score_folder(folder), "table", None)
    for line in outcome.score.warnings:
        echo(f"warning: {line}", err=True)
    console().print(outcome.output)
    return 0 if outcome.score.valid else 1
