"""The parallel drivers of mlhpc's data work: a function over many jobs, in threads or processes.

`run_all` drives the data layer. Conversion and checking are CPU-bound in Python (inflate,
decode, validate): they run in processes (``kind="process"``, forked). Staging copies are
I/O-bound and hash with a library that releases the GIL: they run in threads (``kind="thread"``).
Results come back in completion order; the first failure cancels what has not started, lets the
jobs in flight finish (each writes through `mlhpc.data.files` and cleans up after itself) and is
raised.

`map_in_order` drives workload code (synthesis): results in the jobs' order, and leaving early
terminates the workers at once, since a synthesis chunk can run for minutes and its half-made
files lie in a hidden folder the next attempt clears.

Either way workers ignore SIGINT: Ctrl-C is the parent's to act on. The workers are forked (or
spawned) with SIGINT and SIGTERM blocked (`_signals_held`), not ignored: a Ctrl-C that arrives
while the pool starts waits, pending, until the parent unblocks it (then it is handled there,
the command's one line and exit 130) and until each worker has set it aside (then the worker
drops it); neither lost in the parent nor a traceback in a half-started worker.
"""

from __future__ import annotations

import multiprocessing
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import (
    Executor,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
)
from typing import Any, Literal

from mlhpc.data.statefiles import record_into, recording_folder

PoolKind = Literal["thread", "process"]


#: Signals held back while workers are started (`_signals_held`).
_HELD = frozenset({signal.SIGINT, signal.SIGTERM})


@contextmanager
def _signals_held() -> Iterator[None]:
    """Within the block this thread holds SIGINT and SIGTERM pending (``pthread_sigmask``):
    processes forked or spawned in it, and threads started in it, begin with them blocked (a
    child keeps its parent's mask across fork and exec); on leaving, what arrived meanwhile is
    delivered here and handled as usual (a KeyboardInterrupt, the run's `Stop`)."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _ignore_interrupt() -> None:
    """Worker start-up: Ctrl-C goes to the whole foreground process group, but only the parent
    acts on it (cancels what has not started, says so once); a worker finishes its job quietly
    instead of printing its own traceback. The worker began with SIGINT and SIGTERM blocked
    (`_signals_held`): SIGINT is ignored first (a pending one is dropped), then both unblocked
    (a pending SIGTERM ends the worker, as it would have)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)


def _executor(workers: int, kind: PoolKind) -> Executor:
    if kind == "process":
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                                   initializer=_ignore_interrupt)
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="mlhpc-data")


def run_all(fn: Callable[..., Any], jobs: list[tuple[Any, ...]], workers: int,
            kind: PoolKind = "process") -> Iterator[Any]:
    """``fn(*job)`` for every job, yielded in completion order, with ``workers`` threads or
    processes (``workers <= 1``: in this thread, in order).

    Raises:
        whatever ``fn`` raises first; the jobs not yet started are cancelled.
    """
    if workers <= 1:
        for job in jobs:
            yield fn(*job)
        return
    with _executor(workers, kind) as pool:
        with _signals_held():  # the workers (and the pool's threads) start in here
            futures = [pool.submit(fn, *job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise


def _start_worker(initializer: Callable[..., None] | None, initargs: tuple[Any, ...],
                  recorded: str | None = None) -> None:
    _ignore_interrupt()
    record_into(recorded)  # the parent's writers record what they make: so do its workers
    if initializer is not None:
        initializer(*initargs)


def map_in_order(fn: Callable[[Any], Any], jobs: list[Any], workers: int, *,
                 start: Literal["fork", "spawn"] = "fork",
                 initializer: Callable[..., None] | None = None,
                 initargs: tuple[Any, ...] = ()) -> Iterator[Any]:
    """``fn(job)`` for every job, yielded in the jobs' order: here when ``workers <= 1`` or
    there are fewer than 2 jobs, else in ``workers`` processes started by ``start`` ("spawn"
    where the parent may hold torch or OpenMP threads that a fork would copy half-started),
    jobs sent in chunks of about an eighth of each worker's share. ``initializer(*initargs)``
    runs once in each process (here too, when there are no workers). Workers ignore SIGINT
    (`_ignore_interrupt`): Ctrl-C is the parent's to act on.

    This is the process pool of all workload code (synthesis, preparation), as `run_all` is of
    the data layer's. Raises whatever ``fn`` raises first (in the jobs' order); leaving early
    (that error, or an interruption) terminates the workers at once.
    """
    if workers <= 1 or len(jobs) < 2:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, jobs)
        return
    chunk = max(1, len(jobs) // (8 * workers))
    context = multiprocessing.get_context(start)
    # multiprocessing's Pool, not concurrent.futures: leaving the block terminates the workers,
    # so an interruption (Ctrl-C, or SIGTERM turned into an exception by the run) ends the
    # command now instead of after the chunks in flight (minutes of synthesis).
    with _signals_held():  # workers and the pool's threads begin with the signals blocked
        pool = context.Pool(workers, initializer=_start_worker,
                            initargs=(initializer, initargs, recording_folder()))
    with pool:
        yield from pool.imap(fn, jobs, chunksize=chunk)
