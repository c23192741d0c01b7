"""``train.emulate_accelerator`` (``mlhpc run --emulate-accelerator``): what storage mode
(`mlhpc.run.emulate`) emulates, as the config holds it: an accelerator's name, whose published
rate the run looks up for its workload, or a time per sample.

Only the value's form is checked here, at load; whether the name is known for the config's
workload is checked when the run starts (`mlhpc.run.emulate.emulation`), where the known names
are listed.
"""

from __future__ import annotations

import math
import re
from typing import Optional

#: A time per sample's units, in seconds.
TIME_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
_NAME = re.compile(r"[a-z][a-z0-9._-]{0,63}")
_TIME = re.compile(r"([+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:e[+-]?[0-9]+)?)(s|ms|us)")


def time_per_sample_s(value: str) -> float | None:
    """The time per sample ``value`` gives, in seconds (``12.5ms``, ``0.02s``, ``800us``: one
    emulated accelerator's compute for one sample), or None when ``value`` is an accelerator's
    name (a letter, then letters, digits, ``.``, ``_`` or ``-``; case ignored).

    Raises:
        ValueError: neither a name nor a time, or a time that is not a finite number > 0.
    """
    text = value.strip().lower()
    if _NAME.fullmatch(text):
        return None
    found = _TIME.fullmatch(text)
    if found is None:
        raise ValueError(f"{value!r} is neither an accelerator's name (such as h100) nor a time per "
                         "sample (such as 12.5ms, 0.02s or 800us)")
    seconds = float(found[1]) * TIME_UNITS_S[found[2]]
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{value!r}: a time per sample must be greater than 0")
    return seconds


def checked(value: Optional[str]) -> Optional[str]:
    """``value`` when its form is a name or a time > 0 (`time_per_sample_s`); None stays None."""
    if value is not None:
        time_per_sample_s(value)
    return value
