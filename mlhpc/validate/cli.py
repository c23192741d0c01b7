"""``mlhpc validate``: does this machine compute CONFIG's model correctly? Deep500's levels
(docs/validate.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from mlhpc.errors import one_line_errors
from mlhpc.text import cell, console, echo, styled

SET_HELP = "Override a config value, e.g. --set train.global_batch_size=8 (repeatable)."


@click.command("validate", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("config_path", type=click.Path(path_type=Path))
@click.option("--level", "level_text", default="0,1,2,3", show_default=True,
              help="Levels to run: 0 operators, 1 network, 2 training, 3 distributed.")
@click.option("--device", default=None,
              help="auto, cpu or cuda (default: the config's train.device).")
@click.option("--precision", default=None,
              help="fp32, bf16 or fp16 (default: the run's: bf16 when train.amp is on CUDA).")
@click.option("--steps", type=int, default=3, show_default=True,
              help="Optimizer steps of level 2.")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help="A table per level for people, JSON for scripts.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@one_line_errors()
def validate_command(config_path: Path, level_text: str, device: str | None,
                     precision: str | None, steps: int, fmt: str, overrides: tuple[str, ...]) -> None:
    """Check that this machine computes CONFIG's model correctly, against float64 on the CPU:
    0 every operator (forward; backward against a numerical Jacobian), 1 the network (outputs,
    loss, every gradient), 2 a few training steps (and their rerun), 3 two data-parallel ranks.

    Exit status: 0 every check passed, 1 a check failed (its row names the operator, tensor or
    step), 2 bad input (one line)."""
    from mlhpc import config as cfg
    from mlhpc.validate.command import parse_levels, validate

    levels = parse_levels(level_text)
    config = cfg.load(config_path, overrides)
    found = validate(config, levels, device=device, precision=precision, steps=steps)
    if not found.reports:  # rank 0 prints every rank's rows
        pass
    elif fmt == "json":
        echo(json.dumps(found.to_dict(), indent=2))
    else:
        _print_tables(found)
    sys.exit(0 if found.passed else 1)


def _print_tables(found: Any) -> None:
    from rich.table import Table

    from mlhpc.validate.command import LEVEL_NAMES

    out = console()
    ranks = len({c.rank for c in found.checks}) > 1
    for level in found.levels:
        rows = [c for c in found.checks if c.level == level]
        notes = {c.note for c in rows}
        shared = notes.pop() if len(notes) == 1 else None  # one note for the level: its caption
        seconds = found.seconds.get(level, 0.0)
        table = Table(title=f"level {level}, {LEVEL_NAMES[level]}: {found.workload} on "
                            f"{found.device} {found.precision} ({seconds:.1f} s)", caption=shared)
        columns = (["rank"] if ranks else []) + ["check", "metric", "error", "tolerance", "pass"]
        for column in columns + ([] if shared is not None else ["note"]):
            table.add_column(column, overflow="fold")
        for c in rows:
            verdict = {True: styled("pass", "green"), False: styled("FAIL", "bold red"),
                       None: cell("-")}[c.passed]
            table.add_row(*([cell(c.rank)] if ranks else []), cell(c.name), cell(c.metric),
                          cell(_number(c.error)), cell(_number(c.tolerance)), verdict,
                          *([] if shared is not None else [cell(c.note)]))
        out.print(table)
    failed = [c for c in found.checks if c.passed is False]
    echo(f"mlhpc validate: {len(found.checks) - len(failed)} of {len(found.checks)} checks "
         f"passed or informational; {len(failed)} failed"
         + (f" (first: level {failed[0].level}, {failed[0].name})" if failed else ""))


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"
