"""The search's shared state: an Optuna study in Optuna's own storage (a journal file on a shared
file system, or an RDB URL), and the study's descriptor ``study.json`` in the search's folder.

The storage is the only state workers share: a worker opens it, asks for a trial, runs it and
tells the result (Optuna's ask-and-tell interface), so adding a worker adds trials, not
coordination. ``study.json`` says what the score needs and the storage does not hold: when the
time budget started, the marks, the gates, the metric and its direction.

A worker keeps a heartbeat on its running trial (the trial's user attribute
``heartbeat_unix_s``, every ``automl.heartbeat_s``); `fail_stale_trials` marks a running trial
failed when its heartbeat is older than `STALE_BEATS` beats (its worker was killed), as Optuna's
RDB heartbeat does (``optuna.storages.fail_stale_trials``), for both storages.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlhpc.config import Config
from mlhpc.data.files import reason, write_text_atomic
from mlhpc.data.statefiles import open_state_file
from mlhpc.errors import ConfigError, OutputError
from mlhpc.report.automl_folder import STUDY_FILE, STUDY_FORMAT, read_study
from mlhpc.text import show_url
from mlhpc.workload import get as get_workload

if TYPE_CHECKING:  # pragma: no cover
    import optuna

#: A running trial whose heartbeat is this many beats old is failed.
STALE_BEATS = 4
JOURNAL_NAME = "study.journal"


@dataclass(frozen=True)
class StudyFile:
    """``study.json``: what scoring the search needs (`mlhpc.report.automl`).

    Attributes:
        study_name: the Optuna study's name; storage: the storage as shown to people (a
            password masked); config: the config file the search started from.
        metric_key / direction / target: the workload's quality metric (``min``: an error).
        started_unix_s: the budget clock's start; ended_unix_s: when the search ended (None
            while it runs, or when workers ran without ``mlhpc automl``'s launcher).
        budget_s / mark_every_s: the time budget and the score's marks.
        gates: ``{"min_duration_s": s, "min_quality": q}``.
    """

    study_name: str
    workload: str
    metric_key: str
    direction: str
    target: float
    started_unix_s: float
    budget_s: float
    mark_every_s: float
    gates: dict[str, float]
    storage: str
    config: str
    ended_unix_s: float | None = None
    format: str = STUDY_FORMAT

    @property
    def deadline_unix_s(self) -> float:
        return self.started_unix_s + self.budget_s


def storage_spec(config: Config) -> str:
    """``automl.storage``, or the journal file ``<output.dir>/study.journal``."""
    assert config.automl is not None
    return config.automl.storage or str(Path(config.output.dir) / JOURNAL_NAME)


def study_name(config: Config) -> str:
    """``automl.study_name``, or the name of the search's folder (``output.dir``)."""
    assert config.automl is not None
    return config.automl.study_name or Path(config.output.dir).resolve().name


def open_storage(spec: str) -> "optuna.storages.BaseStorage":
    """Optuna's storage ``spec``: an RDB URL (``scheme://...``) or a journal file path (created
    ``0600`` where missing; a link is refused, never written through).

    Raises:
        ConfigError: it cannot be opened (naming ``automl.storage`` and the cause; a URL's
            password masked).
    """
    import optuna
    from optuna.storages.journal import JournalFileBackend

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # mlhpc says what it does itself
    try:
        if "://" in spec:
            return optuna.storages.RDBStorage(spec)
        path = Path(spec)
        if path.is_symlink():
            raise ConfigError(f"automl.storage {spec}: a symbolic link; give the journal file itself")
        if path.exists() and not path.is_file():
            raise ConfigError(f"automl.storage {spec}: not a regular file; a journal is a file")
        os.close(open_state_file(path, os.O_WRONLY, what="Optuna journal", error=ConfigError))  # 0600, no link
        return optuna.storages.JournalStorage(JournalFileBackend(str(path)))
    except ConfigError:
        raise
    except OSError as exc:
        raise ConfigError(f"automl.storage {show_url(spec)}: cannot be opened ({reason(exc)})") from None
    except Exception as exc:  # noqa: BLE001 - SQLAlchemy and Optuna raise their own families
        raise ConfigError(f"automl.storage {show_url(spec)}: cannot be opened "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def describe(config: Config, started_unix_s: float) -> StudyFile:
    """The descriptor of ``config``'s search, its budget starting at ``started_unix_s``."""
    automl, metric = config.automl, get_workload(config.workload).metric
    assert automl is not None
    target = metric.target if config.train.target is None else config.train.target
    return StudyFile(
        study_name=study_name(config), workload=config.workload, metric_key=metric.key,
        direction=metric.direction, target=target, started_unix_s=started_unix_s,
        budget_s=automl.budget_s, mark_every_s=automl.mark_every_s,
        gates={"min_duration_s": automl.min_duration_s,
               "min_quality": target if automl.min_quality is None else automl.min_quality},
        storage=show_url(storage_spec(config)), config=config.source)


def write_study_file(folder: Path, study: StudyFile, exclusive: bool = False) -> Path:
    """``folder/study.json`` (atomic; ``exclusive``: refused when one is there)."""
    import json

    path = Path(folder) / STUDY_FILE
    try:
        write_text_atomic(path, json.dumps(asdict(study), indent=2) + "\n", exclusive=exclusive)
    except FileExistsError:
        raise ConfigError(f"output.dir {folder}: already holds a search ({STUDY_FILE}); choose "
                          "another output.dir, or add workers with mlhpc automl CONFIG --worker") from None
    except OSError as exc:
        raise OutputError(f"output.dir {folder}: cannot write {STUDY_FILE} ({reason(exc)})") from None
    return path


def read_study_file(folder: Path) -> StudyFile:
    """``folder/study.json``, read and checked by the report's reader
    (`mlhpc.report.automl_folder.read_study`: a regular file inside ``folder``, every key typed
    and in range).

    Raises:
        ConfigError: missing (run ``mlhpc automl CONFIG --prepare`` first) or refused (naming
            the file and the key).
    """
    path = Path(folder) / STUDY_FILE
    if not os.path.lexists(path):
        raise ConfigError(f"{path}: no search here; start one with mlhpc automl CONFIG (or --prepare)")
    study = read_study(folder)
    return StudyFile(
        study_name=study.study_name, workload=study.workload, metric_key=study.metric_key,
        direction=study.direction, target=study.target, started_unix_s=study.started_unix_s,
        budget_s=study.budget_s, mark_every_s=study.mark_every_s,
        gates={"min_duration_s": study.min_duration_s, "min_quality": study.min_quality},
        storage=study.storage, config=study.config, ended_unix_s=study.ended_unix_s)


def load_study(study: StudyFile, spec: str, sampler: Any = None, pruner: Any = None) -> "optuna.Study":
    """The study ``study`` names, in storage ``spec``.

    Raises:
        ConfigError: the storage cannot be opened, or holds no such study.
    """
    import optuna

    storage = open_storage(spec)
    try:
        return optuna.load_study(study_name=study.study_name, storage=storage, sampler=sampler, pruner=pruner)
    except KeyError:
        raise ConfigError(f"automl.storage {show_url(spec)}: holds no study {study.study_name!r}") from None


def create_study(config: Config, direction: str) -> "optuna.Study":
    """A new study for ``config`` in its storage (``direction``: ``min`` or ``max``).

    Raises:
        ConfigError: the storage cannot be opened, or already holds a study of that name.
    """
    import optuna

    storage = open_storage(storage_spec(config))
    name = study_name(config)
    try:
        return optuna.create_study(study_name=name, storage=storage,
                                   direction="minimize" if direction == "min" else "maximize")
    except optuna.exceptions.DuplicatedStudyError:
        raise ConfigError(f"automl.study_name {name!r}: the storage {show_url(storage_spec(config))} "
                          "already holds a study of that name; choose another") from None


def _worker_gone(worker: Any) -> bool:
    """The worker ``host:pid`` ran on this host and its process is gone."""
    import socket

    host, _, pid = str(worker).rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, another user's
        return False
    return False


def fail_stale_trials(study: "optuna.Study", heartbeat_s: float) -> list[int]:
    """Mark failed every running trial whose worker was killed: its worker's process on this
    host is gone, or its heartbeat (its start, before the first beat) is older than
    `STALE_BEATS` x ``heartbeat_s``. Returns their numbers."""
    import optuna

    now, failed = time.time(), []
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        beat = trial.user_attrs.get("heartbeat_unix_s")
        if beat is None and trial.datetime_start is not None:
            beat = trial.datetime_start.timestamp()
        stale = isinstance(beat, (int, float)) and now - beat > STALE_BEATS * heartbeat_s
        if stale or _worker_gone(trial.user_attrs.get("worker")):
            try:
                study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
                failed.append(trial.number)
            except (RuntimeError, ValueError):  # another worker failed it first
                continue
    return failed
