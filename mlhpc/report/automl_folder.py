"""Reading an AutoML search folder (``mlhpc automl``) for its score (`mlhpc.report.automl`):
``study.json`` checked (`read_study`) and each trial's logs counted (`read_trials`), from the
files alone; nothing in the folder is written.

Links: a trial folder that is a symbolic link is skipped with a warning (one out of the folder
would read another tree; one inside it would count a trial twice); a log or side file that is a
link out of the folder is refused by the reader (`mlhpc.data.inputs`) and the log skipped with
a warning. Unreadable log lines are passed over as `mlhpc.log.parse.parse_log` passes them.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from mlhpc.data.inputs import read_input, read_text_input
from mlhpc.errors import ConfigError, DataError, LogFormatError
from mlhpc.log.parse import cap_field, parse_log
from mlhpc.log.plausible import BOUNDS, implausible, out_of_range
from mlhpc.report.folders import RESULT_RE, natural, sidecars

STUDY_FILE = "study.json"
STUDY_FORMAT = "mlhpc-automl-study/1"
#: study.json is a short record; anything larger is not one.
STUDY_FILE_BYTES = 1 << 20
TRIAL_DIR = re.compile(r"trial_[0-9]+")
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


@dataclass(frozen=True)
class TrialLog:
    """What one trial's log counts: ``flops`` and ``qualities`` as ``(seconds since the start,
    FLOP or metric value)``, ``stop_s`` (its run_stop, None when killed), the ``precision``
    measured, and ``no_flops`` (why it counts no FLOPs; None when it does)."""

    trial: int
    folder: Path
    log: Path
    flops: tuple[tuple[float, float], ...]
    qualities: tuple[tuple[float, float], ...]
    stop_s: float | None
    last_s: float | None
    precision: str | None
    no_flops: str | None


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


# ---- trials -------------------------------------------------------------------------------------


def trial_folders(folder: Path, warnings: list[str]) -> list[tuple[int, Path]]:
    """``(number, path)`` of every ``trial_<number>`` folder of ``folder``, by number; a link is
    skipped with a line in ``warnings``.

    Raises:
        ConfigError: ``folder`` cannot be listed.
    """
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise ConfigError(f"cannot list the AutoML folder ({exc.strerror})", path=folder) from None
    found = []
    for entry in entries:
        if not TRIAL_DIR.fullmatch(entry.name):
            continue
        if entry.is_symlink():
            warnings.append(f"{entry.path}: a symbolic link; trial skipped (links are not followed)")
        elif entry.is_dir(follow_symlinks=False):
            found.append((int(entry.name[len("trial_"):]), Path(entry.path)))
    return sorted(found, key=lambda item: (item[0], item[1].name))


def _side_object(path: Path, root: Path, kind: str) -> dict[str, Any]:
    """The mapping in a run's side file (``json`` or ``yaml``), read inside ``root``.

    Raises:
        DataError: refused by the reader, unreadable or not a mapping (the message names it)."""
    text = read_text_input(path, root=root, what=f"run's {kind} side file")
    try:
        data = json.loads(text) if kind == "json" else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError):
        raise DataError(f"not readable {kind.upper()}", path=path) from None
    if not isinstance(data, dict):
        raise DataError(f"not a {kind.upper()} object", path=path)
    return data


def _per_sample(log: Path, root: Path) -> tuple[float, float, str | None]:
    """``(training, forward FLOPs per sample, precision)`` from ``measured_N.json`` beside ``log``.

    Raises:
        DataError: none there, refused, or without plausible FLOPs (the message says which)."""
    found = sidecars(log, "measured", ".json")
    if not found:
        raise DataError("no measured side file (killed before run_stop?); counted as 0 FLOPs", path=log)
    perf = _side_object(found[0], root, "json").get("perf")
    perf = perf if isinstance(perf, dict) else {}
    values = []
    for key in ("train_flops_per_sample", "forward_flops_per_sample"):
        value = perf.get(key)
        problem = implausible("flops_per_sample", value) if value is not None else "missing"
        if problem:
            raise DataError(f"perf.{key} {problem}; counted as 0 FLOPs", path=found[0])
        values.append(float(value))
    precision = perf.get("precision")
    return values[0], values[1], str(precision)[:40] if precision is not None else None


def _epoch_samples(log: Path, root: Path, logged: Any) -> float:
    """Samples one epoch trains: ``eval_every_steps`` x ``global_batch_size`` of the run's
    ``config_N.yaml`` when it sets them, else the log's ``train_samples`` (``logged``).

    Raises:
        DataError: neither gives a count."""
    found = sidecars(log, "config", ".yaml")
    train = _side_object(found[0], root, "yaml").get("train") if found else None
    train = train if isinstance(train, dict) else {}
    every, batch = train.get("eval_every_steps"), train.get("global_batch_size")
    if every is not None and out_of_range(every, 1) is None and out_of_range(batch, 1) is None:
        return float(every) * float(batch)
    if out_of_range(logged, 0.0) is None:
        return float(logged)
    raise DataError("no samples per epoch (config_N.yaml train.eval_every_steps x "
                    "global_batch_size, or the log's train_samples); counted as 0 FLOPs", path=log)


def _value(events: list[Any], key: str) -> Any:
    return next((e.value for e in events if e.key == key), None)


def read_trial_log(number: int, log: Path, root: Path, study: Study) -> TrialLog:
    """One trial log counted (`TrialLog`): its FLOPs events, quality values, run_stop, precision.

    Raises:
        LogFormatError: the log is refused by `mlhpc.log.parse.parse_log` (a link out of ``root``,
            not a regular file, too large).
    """
    events = parse_log(log, root=root).events
    start = study.started_unix_s
    qualities = tuple((e.time_ms / 1000 - start, float(e.value)) for e in events
                      if e.key == study.metric_key and out_of_range(e.value) is None)
    stop = next((e.time_ms / 1000 - start for e in events if e.key == "run_stop"), None)
    last = max((e.time_ms / 1000 - start for e in events), default=None)
    base = TrialLog(number, log.parent, log, (), qualities, stop, last, None, None)
    try:
        train, forward, precision = _per_sample(log, root)
        base = replace(base, precision=precision)
        per_epoch = train * _epoch_samples(log, root, _value(events, "train_samples"))
        evaluated = _value(events, "eval_samples")
        if out_of_range(evaluated, 0.0) is not None:
            raise DataError("no eval_samples in the log; counted as 0 FLOPs", path=log)
    except DataError as exc:
        return replace(base, no_flops=str(exc))
    flops = tuple((e.time_ms / 1000 - start, per_epoch if e.key == "epoch_stop" else forward * evaluated)
                  for e in events if e.key in ("epoch_stop", "eval_stop"))
    return replace(base, flops=flops)


def read_trials(folder: Path, study: Study, warnings: list[str]) -> tuple[list[TrialLog], int, int]:
    """``(logs, trials, trials without FLOPs)`` of every trial folder; a refused log is skipped
    and a log counting no FLOPs noted, each with a line in ``warnings``."""
    logs: list[TrialLog] = []
    trials = trial_folders(folder, warnings)
    without = 0
    for number, trial in trials:
        try:
            names = sorted((p for p in trial.iterdir() if RESULT_RE.match(p.name)), key=natural)
        except OSError as exc:
            warnings.append(f"{trial}: cannot list ({exc.strerror}); trial skipped")
            continue
        counted = []
        for log in names:
            try:
                counted.append(read_trial_log(number, log, folder, study))
            except LogFormatError as exc:
                warnings.append(f"{exc}; log skipped")
        for item in counted:
            if item.no_flops and item.stop_s is not None:  # a killed trial's missing file is expected
                warnings.append(item.no_flops)
        without += not counted or any(item.no_flops for item in counted)
        logs += counted
    return logs, len(trials), without
