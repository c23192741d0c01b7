"""The one range check of every figure mlhpc reads from a log or derives and stores: a number
from outside (a log value, a power reading, a time to train, an energy) is plausible or refused
with a reason, never stored as a success.

- `log_value_problem`: numbers in a log record (`mlhpc.log.parse`): an integer beyond 64 bits
  (a 30-digit integer) makes the record malformed, with the reason. ``NaN``, ``Infinity`` (and
  ``1e999``) are read as ``mlp_parser`` reads them; a figure made from one is refused by
  `implausible`.
- `implausible`: a derived figure against `BOUNDS` (time to train, durations, energy, watts,
  FLOPs per sample):
  not finite, negative, or beyond any machine's reach.
"""

from __future__ import annotations

import math
from typing import Any

#: ``name: (lowest, highest, unit)`` of each figure: a year of time to train; a 1 GW system for
#: that year in joules; 10 MW drawn by one node or meter; a duration as long as a time to train;
#: an exaFLOP of training work per sample (a side file's FLOPs per sample).
BOUNDS: dict[str, tuple[float, float, str]] = {
    "time_to_train_s": (0.0, 366 * 86400.0, "s"),
    "duration_s": (0.0, 366 * 86400.0, "s"),
    "energy_j": (0.0, 1e9 * 366 * 86400.0, "J"),
    "power_w": (0.0, 1e7, "W"),
    "flops_per_sample": (0.0, 1e18, "FLOP"),
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
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{name} {value!r} is not a number"
    if not math.isfinite(value):
        return f"{name} {value} is not a finite number"
    if value < low:
        return f"{name} {value:g} {unit} is negative" if low == 0 else f"{name} {value:g} {unit} is below {low:g}"
    if value > high:
        return f"{name} {value:g} {unit} is beyond {high:g} {unit}, implausible"
    return None


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
