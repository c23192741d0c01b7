"""The range check of every figure mlhpc reads from a log or derives and stores: a number
from outside (a log value, a power reading, a time to train, an energy) is plausible or refused
with a reason, never stored as a success.

- `log_value_problem`: numbers in a log record (`mlhpc.log.parse`): an integer beyond 64 bits
  (a 30-digit integer) makes the record malformed, with the reason. ``NaN``, ``Infinity`` (and
  ``1e999``) are read as ``mlp_parser`` reads them; a figure made from one is refused by
  `implausible`.
- `implausible`: a derived figure against `BOUNDS` (time to train, durations, energy, watts,
  FLOPs per sample):
  not finite, negative, or beyond any machine's reach.
- `out_of_range` (and `checked_number`, which raises): any number read from a file (a
  references file, a log's value, a resume record, a store's row, a side file) before any
  arithmetic: a number (never a bool or a string), finite, within the bounds its reader names;
  `implausible` is it with a figure's `BOUNDS`.
"""

from __future__ import annotations

import math
from typing import Any

from mlhpc.errors import MlhpcError
from mlhpc.text import clip

#: ``name: (lowest, highest, unit)`` of each figure: a year of time to train; a 1 GW system for
#: that year in joules; 10 MW drawn by one node or meter; a duration as long as a time to train;
#: an exaFLOP of training work per sample (a side file's FLOPs per sample).
BOUNDS: dict[str, tuple[float, float, str]] = {
    "time_to_train_s": (0.0, 366 * 86400.0, "s"),
    "duration_s": (0.0, 366 * 86400.0, "s"),
    "energy_j": (0.0, 1e9 * 366 * 86400.0, "J"),
    "power_w": (0.0, 1e7, "W"),
    "flops_per_sample": (0.0, 1e18, "FLOP"),
    "samples_per_s": (0.0, 1e15, "samples/s"),
}
#: The largest integer a log value may hold (a signed 64-bit integer, as the store keeps it).
MAX_INT = (1 << 63) - 1


def implausible(name: str, value: Any) -> str | None:
    """Why ``value`` is not a plausible ``name`` (a key of `BOUNDS`), in words for a message, or
    None when it is. ``None`` (not measured) is plausible.

    Raises:
        KeyError: ``name`` has no bounds (a bug: every figure checked is listed).
    """
    low, high, unit = BOUNDS[name]
    if value is None:
        return None
    problem = out_of_range(value, low, high, unit)
    if problem is None:
        return None
    return f"{name} {problem}" + (", implausible" if " is beyond " in problem else "")


def out_of_range(value: Any, low: float = -math.inf, high: float = math.inf, unit: str = "",
                 above_low: bool = False) -> str | None:
    """Why ``value``, read from a file, is not a finite number from ``low`` to ``high`` (above
    ``low`` with ``above_low``), in words that follow its name in a message; None when it is.

    A bool, a string or a container is not a number; NaN and +-Infinity are not finite; an
    integer beyond 64 bits (`MAX_INT`) is out of range (``float()`` of it overflows).
    """
    unit = f" {unit}" if unit else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{clip(repr(value), 40)} is not a number"
    if isinstance(value, int) and not -MAX_INT - 1 <= value <= MAX_INT:
        return f"{clip(value, 40)} is beyond the 64 bits a value may hold"
    if not math.isfinite(value):
        return f"{value} is not a finite number"
    if value < low or (above_low and value == low):
        if low == 0:
            return f"{value:g}{unit} is {'not positive' if above_low else 'negative'}"
        return f"{value:g}{unit} is {'not above' if above_low else 'below'} {low:g}{unit}"
    if value > high:
        return f"{value:g}{unit} is beyond {high:g}{unit}"
    return None


def checked_number(value: Any, where: str, error: type[MlhpcError],
                   bounds: tuple[float, float] = (-math.inf, math.inf), unit: str = "",
                   above_low: bool = False) -> float:
    """``value`` as a float when `out_of_range` finds nothing wrong with it (``bounds``:
    ``(low, high)``).

    Args:
        where: where and what the value is (``"refs.yaml: sys.bench.figure value"``), the
            start of the message (the reason follows it: ``"... value inf is not a finite number"``).
        error: the error to raise (the caller's family: ConfigError, StoreError, ...).

    Raises:
        ``error``: ``"{where} {why}"``, one line.
    """
    problem = out_of_range(value, bounds[0], bounds[1], unit, above_low)
    if problem is not None:
        raise error(f"{where} {problem}")
    return float(value)


def log_value_problem(value: Any, depth: int = 0) -> str | None:
    """Why a decoded log value (a record's ``value`` or ``metadata``) is refused, or None: an
    integer beyond 64 bits (a 30-digit integer), anywhere in its first two levels. ``NaN`` and
    ``Infinity`` are kept, as ``mlp_parser`` keeps them (published logs hold ``"eval_loss":
    NaN``); a figure made from one is refused by `implausible`."""
    if type(value) is int:
        return None if -MAX_INT <= value <= MAX_INT else \
            f"integer of {len(str(abs(value)))} digits, beyond the 64 bits a log value may hold"
    if depth < 2 and isinstance(value, (list, dict)):
        for item in list(value.values() if isinstance(value, dict) else value)[:256]:
            if problem := log_value_problem(item, depth + 1):
                return problem
    return None
