"""One AutoML trial: an ordinary ``mlhpc run`` in its own process and folder, watched through
its MLLOG log as it grows.

The worker reads each evaluation's metric from the trial's log as it is written (so the pruner
sees every epoch, as AIPerf's master sees each trial's per-epoch accuracy), beats the trial's
heartbeat, and stops the run with SIGTERM, the signal a batch system sends, when the pruner
says so, when the search's time budget ends, or when the worker itself is asked to stop: the
run then logs ``run_stop`` (aborted) and writes its files, as any stopped run does. The trial
process is started with the parent-death signal set (Linux ``PR_SET_PDEATHSIG``), so a killed
worker leaves no orphan training on the node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from mlhpc import runtime
from mlhpc.data.inputs import open_input
from mlhpc.errors import LogFormatError
from mlhpc.log.parse import MAX_LOG_BYTES, TOKEN
from mlhpc.log.writer import constants

#: Seconds between looks at the trial's log.
POLL_S = 1.0
#: Seconds a stopped trial has to write its files before it is killed.
TERM_GRACE_S = 120.0


@dataclass(frozen=True)
class Watch:
    """What the worker does while a trial runs.

    Attributes:
        folder: the trial's run folder (its ``result_N.txt`` appears there).
        metric_key: the MLLOG key of the quality metric.
        deadline_unix_s: when the search's time budget ends.
        heartbeat_s: seconds between calls of ``beat``.
        report: ``(value, evaluation number from 1) -> stop?``: the pruner's answer.
        beat: keeps the trial's heartbeat in the study.
        asked_to_stop: the worker's signal, or None.
    """

    folder: Path
    metric_key: str
    deadline_unix_s: float
    heartbeat_s: float
    report: Callable[[float, int], bool]
    beat: Callable[[], None]
    asked_to_stop: Callable[[], str | None]


@dataclass
class TrialRun:
    """How a trial's process ended: its exit status (negative: killed by that signal), the
    metric of each evaluation it logged, and why the worker stopped it (None: it ended itself;
    ``pruned``, ``budget``, or the worker's signal)."""

    exit_status: int
    values: list[float] = field(default_factory=list)
    stopped: str | None = None


class LogTail:
    """The metric values a growing MLLOG log holds, read as complete lines are added (through
    `mlhpc.data.inputs.open_input`: a regular file inside the trial's folder, never a link out)."""

    def __init__(self, folder: Path, metric_key: str) -> None:
        self.folder, self.metric_key = folder, metric_key
        self.fd: int | None = None
        self.read_bytes, self.rest = 0, b""
        self.ended = False  # run_stop logged: the run is writing its files and recording itself

    def _open(self) -> None:
        logs = sorted(self.folder.glob("result_*.txt"))
        if logs:
            self.fd = open_input(logs[0], MAX_LOG_BYTES, root=self.folder, what="trial log",
                                 error=LogFormatError)

    def new_values(self) -> list[float]:
        """The metric values logged since the last call."""
        if self.fd is None:
            self._open()
        if self.fd is None:
            return []
        data = b""
        while self.read_bytes < MAX_LOG_BYTES:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                break
            data += chunk
            self.read_bytes += len(chunk)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [v for v in (self._value(line) for line in lines) if v is not None]

    def _value(self, line: bytes) -> float | None:
        text = line.decode("utf-8", "replace")
        if TOKEN not in text:
            return None
        try:
            record = json.loads(text.split(TOKEN, 1)[1])
        except ValueError:
            return None
        if isinstance(record, dict) and record.get("key") == constants.RUN_STOP:
            self.ended = True
        value = record.get("value") if isinstance(record, dict) and record.get("key") == self.metric_key else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def run_trial(command: list[str], env: dict[str, str], output_fd: int, watch: Watch) -> TrialRun:
    """Run ``command`` (an ``mlhpc run``) with ``env``, its output to ``output_fd``, watched by
    ``watch`` until it exits; returns how it ended. The run is stopped with SIGTERM (then
    SIGKILL after `TERM_GRACE_S`) when ``watch`` says so."""
    proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL, stdout=output_fd,
                            stderr=subprocess.STDOUT, preexec_fn=runtime.die_with_parent)
    tail, run = LogTail(watch.folder, watch.metric_key), TrialRun(exit_status=0)
    last_beat, termed_at = 0.0, None
    try:
        while True:
            try:
                run.exit_status = proc.wait(timeout=POLL_S)
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.time()
            if now - last_beat >= watch.heartbeat_s:
                watch.beat()
                last_beat = now
            reason = _why_stop(run, tail, watch, now)
            if reason is not None and termed_at is None:
                run.stopped, termed_at = reason, now
                proc.send_signal(signal.SIGTERM)
            if termed_at is not None and now - termed_at > TERM_GRACE_S:
                proc.kill()
        run.values += tail.new_values()
    finally:
        if proc.poll() is None:  # the worker itself is failing: no trial outlives it
            proc.kill()
            proc.wait()
        tail.close()
    return run


def _why_stop(run: TrialRun, tail: LogTail, watch: Watch, now: float) -> str | None:
    """Why the trial should stop now (the pruner, the budget, the worker's signal), or None;
    new metric values are reported to the pruner on the way. A run that has logged run_stop is
    left to end by itself, up to `TERM_GRACE_S` past the budget: a signal then would only cut
    short its files and its store record."""
    reason = None
    for value in tail.new_values():
        run.values.append(value)
        if watch.report(value, len(run.values)):
            reason = "pruned"
    if tail.ended:
        return None if now < watch.deadline_unix_s + TERM_GRACE_S else "budget"
    if reason is None and now >= watch.deadline_unix_s:
        reason = "budget"
    return reason or watch.asked_to_stop()
