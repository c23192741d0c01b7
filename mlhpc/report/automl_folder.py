"""Reading an AutoML search folder (``mlhpc automl``) for its score (`mlhpc.report.automl`):
``study.json`` checked (`read_study`), then each trial's logs counted
(`mlhpc.report.automl_trials.read_trials`): `read_search` reads both, from the files alone;
nothing in the folder is written.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc.data.inputs import read_input
from mlhpc.errors import ConfigError
from mlhpc.log.parse import cap_field
from mlhpc.log.plausible import BOUNDS, out_of_range
from mlhpc.report.automl_trials import TrialLog, read_trials

STUDY_FILE = "study.json"
STUDY_FORMAT = "mlhpc-automl-study/1"
#: study.json is a short record; anything larger is not one.
STUDY_FILE_BYTES = 1 << 20
#: The longest budget, mark or required duration read (s): a year, as a time to train is bounded
#: (`mlhpc.log.plausible.BOUNDS`).
MAX_SPAN_S = BOUNDS["duration_s"][1]


@dataclass(frozen=True)
class Study:
    """``study.json``: the search's name, workload, metric (``metric_key``, ``direction``
    ``"min"``/``"max"``, ``target``), its clock (``started_unix_s``, ``ended_unix_s`` or None,
    ``budget_s``, ``mark_every_s``, seconds), the gates (``min_duration_s``, ``min_quality``),
    where its Optuna storage is (``storage``, password masked), its config file and the
    ``study.json`` read (``path``)."""

    study_name: str
    workload: str
    metric_key: str
    direction: str
    target: float
    started_unix_s: float
    ended_unix_s: float | None
    budget_s: float
    mark_every_s: float
    min_duration_s: float
    min_quality: float
    storage: str
    config: str
    path: Path | None = None

    @property
    def error_is(self) -> str:
        """What Error is: ``"1 - eval_accuracy"`` (direction max) or ``"eval_error"`` (min)."""
        return f"1 - {self.metric_key}" if self.direction == "max" else self.metric_key


# ---- study.json ---------------------------------------------------------------------------------


def study_path(path: Path | str) -> Path | None:
    """``path/study.json`` when ``path`` is a folder holding one (any kind of file: a bad one is
    refused by `read_study`, not taken for another report), or ``path`` itself when it is named
    ``study.json``; else None."""
    path = Path(path)
    if path.name == STUDY_FILE and os.path.lexists(path) and not path.is_dir():
        return path
    candidate = path / STUDY_FILE
    return candidate if path.is_dir() and os.path.lexists(candidate) else None


def automl_folder(paths: list[Path]) -> Path | None:
    """The AutoML folder among the report's ``paths`` (None: none is one).

    Raises:
        ConfigError: an AutoML folder given with other paths (one per report).
    """
    found = [p for p in paths if study_path(p) is not None]
    if not found:
        return None
    if len(paths) > 1:
        raise ConfigError(f"{found[0]}: an AutoML folder (holding {STUDY_FILE}) is reported alone; "
                          "give it as the only path")
    study = study_path(found[0])
    return study.parent if study is not None else None


def _field(data: dict[str, Any], key: str, path: Path, kind: str, low: float = -math.inf,
           high: float = math.inf) -> Any:
    """``data[key]`` checked as ``kind`` (``str``, ``number``, ``number?``: a number or null),
    a number from ``low`` to ``high``."""
    name = key.split(".")[-1]
    if name not in data:
        if kind == "number?":
            return None
        raise ConfigError("missing", path=path, key=key)
    value = data[name]
    if kind == "str":
        if not isinstance(value, str) or not value:
            raise ConfigError(f"expected a non-empty string, got {type(value).__name__}", path=path, key=key)
        return cap_field(value)
    if value is None and kind == "number?":
        return None
    problem = out_of_range(value, low, high)
    if problem is not None:
        raise ConfigError(f"expected a finite number: {problem}", path=path, key=key)
    return float(value)


def read_study(folder: Path | str) -> Study:
    """``folder/study.json`` read and checked (format ``mlhpc-automl-study/1``).

    Raises:
        ConfigError: one line naming the file (and key): missing, a link out of ``folder``, not a
            regular file (a FIFO is refused, never waited on), over `STUDY_FILE_BYTES`, not
            UTF-8, not JSON, not an object, a key missing or of the wrong type, a direction
            other than min/max, an end before the start, ``mark_every_s`` not positive.
    """
    path = Path(folder) / STUDY_FILE
    raw = read_input(path, STUDY_FILE_BYTES, root=folder, what="AutoML study file", error=ConfigError)
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"not UTF-8 (byte {exc.start})", path=path) from None
    except ValueError as exc:
        raise ConfigError(f"not JSON ({str(exc)[:120]})", path=path) from None
    except RecursionError:
        raise ConfigError("not JSON (nested too deeply)", path=path) from None
    if not isinstance(data, dict):
        raise ConfigError(f"expected a JSON object, got {type(data).__name__}", path=path)
    if data.get("format") != STUDY_FORMAT:
        raise ConfigError(f"expected {STUDY_FORMAT!r}", path=path, key="format")
    gates = data.get("gates")
    if not isinstance(gates, dict):
        raise ConfigError("expected an object {min_duration_s, min_quality}", path=path, key="gates")
    if data.get("direction") not in ("min", "max"):
        raise ConfigError("expected 'min' or 'max'", path=path, key="direction")
    study = Study(
        **{k: _field(data, k, path, "str") for k in ("study_name", "workload", "metric_key", "storage", "config")},
        direction=data["direction"], target=_field(data, "target", path, "number"),
        started_unix_s=_field(data, "started_unix_s", path, "number", 0.0),
        ended_unix_s=_field(data, "ended_unix_s", path, "number?", 0.0),
        budget_s=_field(data, "budget_s", path, "number", 0.0, MAX_SPAN_S),
        mark_every_s=_field(data, "mark_every_s", path, "number", 0.0, MAX_SPAN_S),
        min_duration_s=_field(gates, "gates.min_duration_s", path, "number", 0.0, MAX_SPAN_S),
        min_quality=_field(gates, "gates.min_quality", path, "number"), path=path)
    if study.mark_every_s <= 0:
        raise ConfigError("expected a time mark above 0 s", path=path, key="mark_every_s")
    if study.ended_unix_s is not None and study.ended_unix_s < study.started_unix_s:
        raise ConfigError(f"{study.ended_unix_s:g} is before started_unix_s {study.started_unix_s:g}",
                          path=path, key="ended_unix_s")
    return study


@dataclass(frozen=True)
class Search:
    """An AutoML folder as read (`read_search`): its study, the trial logs that could be read,
    how many trial folders there were and how many counted no FLOPs, and one line per log or
    trial folder skipped (``warnings``)."""

    folder: Path
    study: Study
    logs: tuple[TrialLog, ...]
    trials_total: int
    trials_without_flops: int
    warnings: tuple[str, ...]


def read_search(folder: Path | str) -> Search:
    """The AutoML folder ``folder`` read whole: ``study.json`` (`read_study`), then every trial
    folder's logs (`read_trials`).

    Raises:
        ConfigError: ``study.json`` is refused (`read_study`) or the folder cannot be listed.
    """
    folder, warnings = Path(folder), []
    study = read_study(folder)
    logs, total, without = read_trials(folder, study, warnings)
    return Search(folder, study, tuple(logs), total, without, tuple(warnings))
