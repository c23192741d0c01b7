"""The trials of an AutoML search folder (``mlhpc automl``), counted for its score
(`mlhpc.report.automl`): each ``trial_<number>/`` folder's logs, their FLOPs (from the side file
``measured_N.json``), quality values, run_stop and precision, from the files alone; nothing in
the folder is written.

Links: a trial folder that is a symbolic link is skipped with a warning (one out of the folder
would read another tree; one inside it would count a trial twice); a log or side file that is a
link out of the folder is refused by the reader (`mlhpc.data.inputs`) and the log skipped with
a warning. Unreadable log lines are passed over as `mlhpc.log.parse.parse_log` passes them.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import ConfigError, DataError, LogFormatError
from mlhpc.log.parse import parse_log
from mlhpc.log.plausible import implausible, out_of_range
from mlhpc.report.folders import RESULT_RE, natural, sidecars

if TYPE_CHECKING:
    from mlhpc.report.automl_folder import Study

TRIAL_DIR = re.compile(r"trial_[0-9]+")


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
