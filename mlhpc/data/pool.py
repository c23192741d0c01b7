"""The one parallel driver of the data layer: a function over many jobs, in threads or processes.

Conversion and checking are CPU-bound in Python (inflate, decode, validate): they run in
processes (``kind="process"``, forked so the workload's tools need not pickle). Staging copies
are I/O-bound and hash with a library that releases the GIL: they run in threads
(``kind="thread"``). Either way results come back in completion order, and the first failure
cancels what has not started and is raised.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import (
    Executor,
    ProcessPoolExecutor,
    ThreadPoolExecutor,
    as_completed,
)
from typing import Any, Callable, Iterator, Literal

PoolKind = Literal["thread", "process"]


def _executor(workers: int, kind: PoolKind) -> Executor:
    if kind == "process":
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"))
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
        futures = [pool.submit(fn, *job) for job in jobs]
        try:
            for future in as_completed(futures):
                yield future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
