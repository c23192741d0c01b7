"""One node's power readings during the timed run, written as MLPerf power logs.

A background thread reads every source each ``interval_s`` on a fixed schedule (no drift) and
appends one ``power_reading`` line per tick to a temporary file; `Sampler.stop` takes a last
reading, writes ``power_measurement_stop``, and only then gives the file its final name
``power/result_N/node_K.txt`` (never over an existing file). A crash leaves the temporary file
(the project's one temporary-name rule, `mlhpc.data.files.part_path`), never a file that claims
to be complete.

The line format is ``mlperf_logging.mllog``'s (``:::MLLOG {json}``) with the keys of
``mlperf_logging.mllog.constants``: ``power_measurement_start``, ``power_reading`` (value: the
node's power in watts, the mean over the interval that ends at the reading's ``time_ms``; the
metadata gives each source's share) and ``power_measurement_stop``. That is the layout
``result_summarizer._compute_power_node`` integrates: sum(value x (time_ms - previous time_ms)),
from the start record, so a counter's interval mean gives back exactly its energy.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from mlperf_logging.mllog import constants

from mlhpc.power.sources import COUNTER, Source, SourceError
from mlhpc.report.plausible import implausible

Clock = Callable[[], float]  # seconds since the Unix epoch, the run's log clock (time.time)


def mllog_line(key: str, value: Any, time_ms: int, event_type: str, metadata: dict[str, Any]) -> str:
    """One ``:::MLLOG`` record as ``mlperf_logging.mllog`` writes it (one line, with newline)."""
    record = {"namespace": "", "time_ms": time_ms, "event_type": event_type, "key": key,
              "value": value, "metadata": metadata}
    return ":::MLLOG " + json.dumps(record, allow_nan=False) + "\n"


class Sampler:
    """Reads ``sources`` every ``interval_s`` into ``part`` (then ``final`` on `stop`).

    Args:
        sources: the node's sources (`mlhpc.power.sources`); at least one.
        interval_s: seconds between readings (MLPerf's power rules ask at least 1 Hz).
        part / final: the temporary and the final file.
        clock: the run's clock in seconds (``time.time``, as the result log's ``time_ms``).
        start_metadata: written in ``power_measurement_start`` (node, sources, what was missing).
    """

    def __init__(self, sources: Sequence[Source], interval_s: float, part: Path, final: Path,
                 clock: Clock = time.time, start_metadata: dict[str, Any] | None = None) -> None:
        self.sources, self.interval_s, self.part, self.final = list(sources), interval_s, part, final
        self.clock, self.start_metadata = clock, dict(start_metadata or {})
        self.readings = 0
        self.missed: list[str] = []
        self._last: dict[str, float] = {}
        self._last_ms = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: Any = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1e3)

    def _write(self, line: str) -> None:
        self._handle.write(line)
        self._handle.flush()

    def start(self) -> None:
        """Open the temporary file, prime the counters, write the start record, start the thread."""
        self.part.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        self._handle = os.fdopen(fd, "w", encoding="utf-8")
        for source in self.sources:
            if source.kind == COUNTER:
                self._last[source.name] = source.read()
        self._last_ms = self._now_ms()
        meta = {**self.start_metadata, "interval_s": self.interval_s}
        self._write(mllog_line(constants.POWER_MEASUREMENT_START, None, self._last_ms, "INTERVAL_START", meta))
        self._thread = threading.Thread(target=self._loop, name="mlhpc-power", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        begin = time.monotonic()
        tick = 1
        while not self._stop.wait(max(0.0, begin + tick * self.interval_s - time.monotonic())):
            self.read_once()
            tick = max(tick + 1, int((time.monotonic() - begin) / self.interval_s) + 1)

    def read_once(self) -> bool:
        """Read every source and write one ``power_reading``; a source that fails, or whose
        watts are implausible (a counter reset gives negative watts: `implausible`), skips the
        tick (the next reading's interval then covers it) and is recorded in ``missed``."""
        now_ms = self._now_ms()
        if now_ms <= self._last_ms:
            return False
        dt_s = (now_ms - self._last_ms) / 1e3
        watts: dict[str, float] = {}
        counters: dict[str, float] = {}
        try:
            for source in self.sources:
                value = source.read()
                if source.kind == COUNTER:
                    counters[source.name] = value
                    watts[source.name] = (value - self._last[source.name]) / dt_s
                else:
                    watts[source.name] = value
                if problem := implausible("power_w", watts[source.name]):  # a counter reset
                    raise SourceError(f"{source.name}: reading refused ({problem})")
        except SourceError as exc:
            self.missed.append(f"{now_ms}: {exc}")
            return False
        self._last.update(counters)
        self._last_ms = now_ms
        meta = {"unit": "W", "sources": {k: round(v, 3) for k, v in watts.items()}}
        self._write(mllog_line(constants.POWER_READING, sum(watts.values()), now_ms, "POINT_IN_TIME", meta))
        self.readings += 1
        return True

    def stop(self, publish: bool = True) -> Path | None:
        """Stop the thread, take a last reading, write ``power_measurement_stop`` and give the
        file its final name (``publish``); returns the final path, or None when not published
        (the temporary file is then removed)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._handle is None:
            return None
        try:
            if publish:
                self.read_once()
                meta = {"readings": self.readings, "missed_readings": len(self.missed)}
                if self.missed:
                    meta["first_missed"] = self.missed[0][:300]
                self._write(mllog_line(constants.POWER_MEASUREMENT_STOP, None, self._last_ms,
                                       "INTERVAL_END", meta))
                os.fsync(self._handle.fileno())
        finally:
            self._handle.close()
            self._handle = None
        if not publish or self.readings == 0:
            self.part.unlink(missing_ok=True)
            return None
        return _publish(self.part, self.final)


def _publish(part: Path, final: Path) -> Path:
    """``part`` -> ``final`` atomically and never over an existing file (a hard link, then the
    temporary name removed); FileExistsError when ``final`` exists."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(part, final)
    except FileExistsError:
        raise
    except OSError:  # a file system without hard links: rename, after checking
        if os.path.lexists(final):
            raise FileExistsError(final) from None
        os.rename(part, final)
        return final
    part.unlink()
    return final
