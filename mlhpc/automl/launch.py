"""``mlhpc automl`` as library calls: prepare a search, start its workers on this node, finish it.

    prepare(config): the search space checked, the results folder made, the dataset made once
      (synthesised where missing, before the clock starts, as a download would be), the study
      created in its storage, ``study.json`` written: the time budget starts
    -> workers: K processes ``mlhpc automl CONFIG --worker`` here (`mlhpc.automl.worker`), or
       one per node or GPU as Slurm job steps (``mlhpc submit CONFIG --automl``)
    -> finish(config): trials whose worker is gone marked failed, the end written into
       ``study.json``; `mlhpc.report.automl` scores the folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from mlhpc.automl.space import check_space, given_values
from mlhpc.automl.study import (
    STUDY_FILE,
    StudyFile,
    create_study,
    describe,
    fail_stale_trials,
    load_study,
    open_storage,
    read_study_file,
    storage_spec,
    write_study_file,
)
from mlhpc.config import Config
from mlhpc.data.trees import make_private_dir
from mlhpc.errors import ConfigError, OutputError
from mlhpc.workload import get as get_workload


def prepare(config: Config, on_progress: Callable[[dict[str, Any]], None]) -> StudyFile:
    """Everything before the search's clock starts; returns the study's descriptor.

    Raises:
        ConfigError: no or a bad ``automl`` section, a folder that already holds a search, a
            storage that cannot be opened or already holds the study.
        DataError, OutputError: the dataset cannot be made, the folder cannot be written.
    """
    from mlhpc import runtime
    from mlhpc.data.ready import ensure_data

    check_space(config)
    folder = Path(config.output.dir)
    make_private_dir(folder, OutputError, "AutoML search")
    if os.path.lexists(folder / STUDY_FILE):
        raise ConfigError(f"output.dir {folder}: already holds a search ({STUDY_FILE}); choose another "
                          "output.dir, or add workers with mlhpc automl CONFIG --worker")
    workload = get_workload(config.workload)
    open_storage(storage_spec(config))  # a storage that cannot be opened is refused before any data are made
    ensure_data(config, workload, runtime.detect(runtime.single_process_env(), "cpu"), on_progress)
    study = create_study(config, workload.metric.direction)
    seed = given_values(config, config.automl.space) if config.automl.seed_trial else None  # type: ignore[union-attr]
    if seed is not None:
        study.enqueue_trial(seed)  # trial 0 trains the config as given: AIPerf's seed network
    started = describe(config, time.time())  # the budget starts here
    write_study_file(folder, started, exclusive=True)
    return started


def start_workers(config_path: Path, overrides: tuple[str, ...], workers: int, threads: int) -> list[int]:
    """Run ``workers`` processes ``mlhpc automl CONFIG --worker`` here, each trial at ``threads``
    threads, until they end; SIGTERM and SIGINT are passed on to them. Returns their exit
    statuses."""
    command = [sys.executable, "-m", "mlhpc", "automl", str(config_path), "--worker",
               *(part for o in overrides for part in ("--set", o)),
               "--set", f"automl.trial_threads={threads}"]
    procs = [subprocess.Popen(command, stdin=subprocess.DEVNULL) for _ in range(workers)]

    def forward(signum: int, _frame: Any) -> None:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    before = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        return [proc.wait() for proc in procs]
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def finish(config: Config) -> StudyFile:
    """The search ended: running trials whose worker is gone marked failed, ``ended_unix_s``
    written into ``study.json``. Returns the descriptor.

    Raises:
        ConfigError: no search in ``output.dir``; the storage cannot be opened.
    """
    assert config.automl is not None
    folder = Path(config.output.dir)
    study_file = read_study_file(folder)
    study = load_study(study_file, storage_spec(config))
    fail_stale_trials(study, config.automl.heartbeat_s)
    ended = replace(study_file, ended_unix_s=_end_of(folder, study_file))
    write_study_file(folder, ended)
    return ended


def _end_of(folder: Path, study: StudyFile) -> float:
    """When the search ended: now, if before its deadline (it was stopped); else the last write
    of a trial's log after the deadline (a stopped trial's run_stop), so that a late --finish
    adds no marks."""
    now = time.time()
    if now <= study.deadline_unix_s:
        return now
    last = max((log.lstat().st_mtime for log in folder.glob("trial_*/result_*.txt")), default=0.0)
    return min(now, max(study.deadline_unix_s, last))


def default_threads(workers: int) -> int:
    """Torch threads per trial when ``workers`` share this node's cores."""
    from mlhpc.runtime import usable_cpus

    return max(1, usable_cpus() // max(workers, 1))
