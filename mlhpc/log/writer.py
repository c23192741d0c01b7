"""The MLLOG writer a run uses (`ComplianceLog`), on top of `mlperf_logging.mllog` (MLPerf HPC
rules, hpc 3.0.0 ruleset), in the log package beside the reader (`mlhpc.log.parse`)
and the per-run summary (`mlhpc.log.summary`) that report and store use.

Only global rank 0 writes. Each run writes a fresh ``result_N.txt``: the file is created with
``O_EXCL | O_NOFOLLOW``, so no run ever overwrites or appends to an existing result, and two
runs started at once into one folder get distinct files. ``result_N.txt`` claims the whole set of
run N (`RUN_FILES`: its summary, measured values, config, environment, checkpoint, resume
claim and power folder ``power/result_N``): a slot N is free only when no file of that set
exists, so a side file left by an earlier run (its log moved or deleted) is never overwritten.
Every line is flushed as it is written, so a crash leaves a readable log.

Keys come from `mlperf_logging.mllog.constants` where a constant exists; the HPC keys without one
are named once, here. The records a run writes around its timed part are the run's
(`mlhpc.run.mllog`).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from mlperf_logging.mllog import constants
from mlperf_logging.mllog.mllog import MLLogger

from mlhpc import runtime
from mlhpc.runtime import Runtime


# HPC keys with no constant in mlperf_logging.mllog.constants.
EVAL_ERROR = "eval_error"
NUMBER_OF_NODES = "number_of_nodes"
ACCELERATORS_PER_NODE = "accelerators_per_node"
GRADIENT_ACCUMULATION_FREQUENCY = "gradient_accumulation_frequency"
DROPOUT = "dropout"
TRACKED_STATS = "tracked_stats"
RESUME = "resume"  # mlhpc: this run continues a stopped one (value: where from, earlier attempts' time)
EMULATED_ACCELERATOR = "emulated_accelerator"  # mlhpc storage mode: what the steps emulate (mlhpc.log.emulated)
EMULATED_COMPUTE = "emulated_compute"  # mlhpc storage mode: an epoch's emulated compute per rank

RESULT_PATTERN = "result_{}.txt"
#: The files of run N, one set: claimed together through ``result_N.txt``, never overwritten.
RUN_FILES = (RESULT_PATTERN, "measured_{}.json", "summary_{}.json", "config_{}.yaml",
             "env_{}.json", "checkpoint_{}.pt", "resumed_{}.json", "power/result_{}")
_counter = itertools.count()


def slot_taken(out_dir: Path, n: int | str) -> bool:
    """Whether any file of run ``n``'s set (`RUN_FILES`) exists in ``out_dir``."""
    return any(os.path.lexists(out_dir / pattern.format(n)) for pattern in RUN_FILES)


def open_next_result(out_dir: Path) -> tuple[Path, IO[str]]:
    """Create ``result_N.txt`` in ``out_dir`` exclusively for the first N whose whole file set
    (`RUN_FILES`) is free (N = 0, 1, ...).

    Returns the path and a line-buffered text handle. Never overwrites or appends.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        if slot_taken(out_dir, n):
            continue
        path = out_dir / RESULT_PATTERN.format(n)
        try:  # O_EXCL: never an existing file, never through a planted link (EEXIST)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        return path, os.fdopen(fd, "w", buffering=1, encoding="utf-8")
    raise AssertionError("unreachable")


class _FlushingHandler(logging.StreamHandler):
    def handleError(self, record: logging.LogRecord) -> None:
        """A record that cannot be written is the run's error, never a traceback printed by
        logging with the line lost: the exception being handled (a full disk, or the run's
        signal handler interrupting the write) goes on to the caller."""
        raise  # noqa: PLE0704 (called by logging inside its except block)

    def emit(self, record: logging.LogRecord) -> None:
        super().emit(record)
        self.flush()
        try:
            os.fsync(self.stream.fileno())
        except (OSError, ValueError):
            pass


@dataclass
class Event:
    """One logged event, as kept in memory (the run's summary is read back from the file)."""

    key: str
    time_ms: int
    value: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)


class ComplianceLog:
    """An MLLOG writer for one run.

    Args:
        path: the result file (already created) or None on ranks that do not write.
        handle: its open text handle.
        instance: instance id for throughput (weak-scaling) runs, added to every event's metadata.
        sync: the barrier of the ranks that share this log (`barrier`); none for one process.
    """

    def __init__(self, path: Path | None, handle: IO[str] | None, instance: int | None = None,
                 sync: Callable[[], None] | None = None):
        self.path = path
        self._sync = sync
        self.events: list[Event] = []
        self._instance = instance
        self._lock = threading.Lock()
        logger = logging.getLogger(f"mlhpc.log.writer.{os.getpid()}.{next(_counter)}")
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler: logging.Handler | None = None
        if handle is not None:
            self._handler = _FlushingHandler(handle)
            logger.addHandler(self._handler)
        else:
            logger.addHandler(logging.NullHandler())
        self._logger = logger
        self._mllogger = MLLogger(logger=logger, default_stack_offset=3,
                                  root_dir=str(Path(__file__).resolve().parents[1]))

    @classmethod
    def create(cls, out_dir: Path, rt: Runtime) -> "ComplianceLog":
        """A log writing ``out_dir/result_N.txt`` on ``rt``'s main rank, nothing elsewhere; its
        records are synchronised over ``rt``'s ranks (`barrier`)."""
        sync = functools.partial(runtime.barrier, rt)
        if not rt.is_main:
            return cls(None, None, rt.instance, sync)
        path, handle = open_next_result(out_dir)
        return cls(path, handle, rt.instance, sync)

    def barrier(self) -> None:
        """Wait for every rank sharing this log (`mlhpc.runtime.barrier`): before a timing record
        so that a once-only key appears once and the slowest rank is measured."""
        if self._sync is not None:
            self._sync()

    def _meta(self, metadata: dict[str, Any] | None) -> dict[str, Any]:
        meta = dict(metadata or {})
        if self._instance is not None:
            meta.setdefault("instance", self._instance)
        return meta

    def _record(self, kind: str, key: str, value: Any, metadata: dict[str, Any] | None) -> None:
        meta = self._meta(metadata)
        now_ms = int(time.time() * 1e3)
        with self._lock:
            self.events.append(Event(key, now_ms, value, meta))
            getattr(self._mllogger, kind)(key=key, value=value, metadata=meta or None,
                                          time_ms=now_ms)

    def event(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        """A POINT_IN_TIME event."""
        self._record("event", key, value, metadata)

    def start(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        """An INTERVAL_START event (``init_start``, ``run_start``, ``epoch_start`` ...)."""
        self._record("start", key, value, metadata)

    def end(self, key: str, value: Any = None, metadata: dict[str, Any] | None = None) -> None:
        """An INTERVAL_END event (``init_stop``, ``run_stop``, ``epoch_stop`` ...)."""
        self._record("end", key, value, metadata)

    def first(self, key: str) -> Event | None:
        """The first event logged with ``key`` in this process (None if none)."""
        return next((e for e in self.events if e.key == key), None)

    def close(self) -> None:
        if self._handler is not None:
            self._handler.close()
            self._logger.removeHandler(self._handler)
            self._handler = None


__all__ = ["ComplianceLog", "Event", "open_next_result", "slot_taken", "RUN_FILES", "constants", "EVAL_ERROR",
           "NUMBER_OF_NODES", "ACCELERATORS_PER_NODE", "GRADIENT_ACCUMULATION_FREQUENCY",
           "DROPOUT", "TRACKED_STATS"]
