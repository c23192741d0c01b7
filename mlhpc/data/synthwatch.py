"""What a running synthesis has done: `SynthWatch`, the `mlhpc.workload.SynthProgress` a
workload's ``synthesize`` is handed by `mlhpc.data.embedded`, reporting samples, bytes and time
left while the data are written.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from mlhpc.data.synthteam import SynthTeam
from mlhpc.workload import SynthProgress

T = TypeVar("T")

#: The longest a synthesis goes without a ``synth_progress`` event, in seconds.
TICK_S = 1.0

ProgressFn = Callable[[dict[str, Any]], None]


class SynthWatch(SynthProgress):
    """What a running synthesis has done, told to ``on_progress`` (None: nothing is watched).

    A workload's ``synthesize`` is handed this watch as its ``progress``
    (`mlhpc.workload.SynthProgress`): ``plan(n, b)`` before it writes its first sample (``n``
    samples about to be written, ``b`` their estimated size in bytes, or None), then ``done(k)``
    each time ``k`` more are written. A workload that says nothing is watched through the bytes
    under its output folder alone. A thread reports at
    least every `TICK_S` seconds, so a slow sample never leaves a log silent.

    Events: ``{"kind": "synth_plan", "path", "samples", "bytes"}``, then ``{"kind":
    "synth_progress", "path", "done", "samples", "bytes" (on disk now), "planned_bytes",
    "elapsed_s", "eta_s", "rank", "ranks", "rank_bytes"}`` (``bytes``: every rank's files under
    the folder; ``rank_bytes``: this rank's, estimated); ``done``, ``samples``,
    ``planned_bytes``, ``eta_s`` and ``rank_bytes`` are None where the workload reports nothing to
    base them on.
    """

    def __init__(self, folder: Path, path: Path, on_progress: ProgressFn | None,
                 team: SynthTeam = SynthTeam()) -> None:
        self.folder, self.path, self.emit, self.team = Path(folder), Path(path), on_progress, team
        self.workers = team.workers
        self.samples: int | None = None
        self.planned_bytes: int | None = None
        self.done_samples: int | None = None
        self._planned = False
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SynthWatch":
        if self.emit is not None:
            self._thread = threading.Thread(target=self._tick, name="mlhpc-synth-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def run(self, synthesize: Callable[..., None], synth: Any, seed: int) -> None:
        """``synthesize(folder, synth, seed, self)``."""
        synthesize(self.folder, synth, seed, self)

    def plan(self, samples: int, size_bytes: int | None = None) -> None:
        """The workload is about to write ``samples`` samples, about ``size_bytes`` bytes."""
        with self._lock:
            self.samples, self.done_samples = int(samples), 0
            self.planned_bytes = size_bytes
            self.start = time.monotonic()  # rates from here: set-up before is not writing
            self._planned = True
        self._emit({"kind": "synth_plan", "path": str(self.path.absolute()),
                    "samples": self.samples, "bytes": self.planned_bytes})

    def done(self, samples: int = 1) -> None:
        """``samples`` more are written."""
        with self._lock:
            self.done_samples = (self.done_samples or 0) + int(samples)
        self.report()

    def share(self, tasks: Sequence[T]) -> list[T]:
        """This rank's part of the plan (`SynthTeam.share`)."""
        return self.team.share(tasks)

    def gather(self, part: list[T]) -> list[T] | None:
        """Every rank's ``part`` on rank 0 (`SynthTeam.gather`)."""
        return self.team.gather(part)

    def rank_figures(self) -> dict[str, Any]:
        """This rank's samples and bytes written (`_rank_bytes`) and seconds since its plan."""
        with self._lock:
            return {"rank": self.team.rank, "samples": self.done_samples, "bytes": self._rank_bytes(),
                    "elapsed_s": time.monotonic() - self.start}

    def _rank_bytes(self) -> float | None:
        """Bytes this rank has written: the workload's estimate in proportion to the samples
        done (None where it gave none); the folder's bytes count every rank's files."""
        if self.planned_bytes is None or not self.samples:
            return None if self.samples != 0 else 0.0
        return self.planned_bytes * (self.done_samples or 0) / self.samples

    def report(self) -> None:
        """One ``synth_progress`` event: samples done, bytes on disk, elapsed, remaining (after
        a ``synth_plan`` of unknown size when the workload has announced none)."""
        if not self._planned:
            self._planned = True
            self._emit({"kind": "synth_plan", "path": str(self.path.absolute()), "samples": None,
                        "bytes": None})
        with self._lock:
            elapsed_s = time.monotonic() - self.start
            written = _bytes_under(self.folder)
            eta_s = None
            if self.samples is not None:  # from the samples written, once there are some
                eta_s = (elapsed_s * (self.samples - self.done_samples) / self.done_samples
                         if self.done_samples else None)
            elif self.planned_bytes and written:
                eta_s = max(0.0, elapsed_s * (self.planned_bytes - written) / written)
            self._emit({"kind": "synth_progress", "path": str(self.path.absolute()), "done": self.done_samples,
                        "samples": self.samples, "bytes": written,
                        "planned_bytes": self.planned_bytes, "elapsed_s": elapsed_s,
                        "eta_s": eta_s, "rank": self.team.rank, "ranks": self.team.ranks,
                        "rank_bytes": self._rank_bytes()})

    def _emit(self, event: dict[str, Any]) -> None:
        if self.emit is not None:
            self.emit(event)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self.report()


def _bytes_under(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (links not followed; files that vanish while
    counted, such as a renamed temporary, are skipped)."""
    total = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total
