"""The one process pool of workload code (`mlhpc.data.pool.map_in_order`): results in the jobs'
order, the first failure raised, and leaving early ends the workers at once rather than after
the jobs in flight (a long synthesis chunk would otherwise hold Ctrl-C or SIGTERM for minutes)."""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from mlhpc.data.pool import map_in_order


def _square(x: int) -> int:
    return x * x


def _fail_first_else_sleep(x: int) -> int:
    if x == 0:
        raise ValueError("job 0 is bad")
    time.sleep(120)
    return x


def _pid(_: int) -> int:
    time.sleep(0.05)
    return os.getpid()


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_the_jobs_order(workers):
    assert list(map_in_order(_square, list(range(40)), workers)) == [x * x for x in range(40)]


def test_jobs_run_in_other_processes():
    assert os.getpid() not in set(map_in_order(_pid, list(range(8)), 2))


@pytest.mark.timeout(60)
def test_the_first_failure_ends_the_workers_without_waiting_for_jobs_in_flight():
    started = time.monotonic()
    with pytest.raises(ValueError, match="job 0 is bad"):
        list(map_in_order(_fail_first_else_sleep, [0, 1, 2, 3], 2))
    assert time.monotonic() - started < 60  # the jobs in flight sleep 120 s each
    assert multiprocessing.active_children() == []
