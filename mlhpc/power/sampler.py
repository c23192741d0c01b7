"""One node's power readings during the timed run, written as MLPerf power logs.

`sampling` is what a run enters around its timed loop: on each node's sampling rank it finds the
node's sources (`find_sources`: the node meter alone, else NVML GPUs and RAPL zones), claims the
run's ``power/`` folder without following a link, and drives one `Sampler`; where nothing can be
read it says so once and writes nothing.

A `Sampler`'s background thread reads every source each ``interval_s`` on a fixed schedule (no drift) and
appends one ``power_reading`` line per tick to a temporary file; `Sampler.stop` takes a last
reading, writes ``power_measurement_stop``, and only then gives the file its final name
``power/result_N/node_K.txt`` (never over an existing file). A crash leaves the temporary file
(the project's temporary name, `mlhpc.data.files.part_path`), never a file that claims
to be complete.

The line format is ``mlperf_logging.mllog``'s (``:::MLLOG {json}``) with the keys of
``mlperf_logging.mllog.constants``: ``power_measurement_start``, ``power_reading`` (value: the
node's power in watts, the mean over the interval that ends at the reading's ``time_ms``; the
metadata gives each source's share) and ``power_measurement_stop``. That is the layout
``result_summarizer._compute_power_node`` integrates: sum(value x (time_ms - previous time_ms)),
from the start record, so a counter's interval mean gives back exactly its energy.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from mlperf_logging.mllog import constants

from mlhpc.data.claims import remove_own_part
from mlhpc.data.files import check_output_folder, open_dir, open_root, part_path, reason
from mlhpc.config.power import POWER_DIR, PowerConfig
from mlhpc.power.sources import COUNTER, NodeMeter, Source, SourceError, close_nvml, find_nvml, find_rapl
from mlhpc.log.plausible import implausible

if TYPE_CHECKING:
    from mlhpc.runtime import Runtime

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
            remove_own_part(self.part)
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
    remove_own_part(part)  # the bytes stay under the final name
    return final


def node_file(out_dir: Path, result_name: str, node: int) -> Path:
    """``<out_dir>/power/<result_name>/node_<node>.txt`` (result_name: ``result_N``)."""
    return Path(out_dir) / POWER_DIR / result_name / f"node_{node}.txt"


def find_sources(config: PowerConfig) -> tuple[list[Any], list[str], Any]:
    """This node's sources: the node meter alone when configured (and readable), else NVML
    GPUs and RAPL zones. Returns ``(sources, problems, nvml module to close or None)``."""
    if config.node_meter_command:
        meter = NodeMeter(config.node_meter_command)
        try:
            meter.read()
            return [meter], [], None
        except Exception as exc:  # noqa: BLE001 - any failure of the site's command: said, not raised
            return [], [str(exc)], None
    gpus, problems, nvml = find_nvml()
    rapl, rapl_problems = find_rapl(config.powercap_root)
    if not gpus:
        close_nvml(nvml)
        nvml = None
    return [*gpus, *rapl], problems + rapl_problems, nvml


def no_counter_reason(config: PowerConfig, problems: list[str]) -> str:
    """Why a node has no counter, naming every source looked for: the node meter, NVML and RAPL
    (each one's own problems where it had some)."""
    if config.node_meter_command:
        return "node meter: " + ("; ".join(problems) or "no reading")
    nvml = [p for p in problems if p.startswith("NVML")] or ["NVML: no GPU"]
    rapl = [p for p in problems if not p.startswith("NVML")] or [
        f"RAPL: no readable package or DRAM zone under {config.powercap_root}"]
    return "; ".join([*nvml, *rapl, "node meter: none configured (power.node_meter_command)"])


def _result_name(log_path: Path | None, rt: Runtime) -> str | None:
    """``result_N`` of the run: from rank 0's log, broadcast to every rank of the instance."""
    name = Path(log_path).stem if log_path is not None else None
    if rt.distributed:
        import torch.distributed as dist

        box = [name]
        dist.broadcast_object_list(box, src=dist.get_global_rank(rt.group, 0) if rt.group else 0,
                                   group=rt.group)
        name = box[0]
    return name


def samples_node(rt: Runtime) -> bool:
    """Whether this rank samples its node for its run: the node's local rank 0, and, in
    throughput mode with instances smaller than a node (`mlhpc.runtime.split_instances`), each
    instance's rank 0 too, so that every instance's ``result_N`` has the node's file. The node's
    power cannot be split between instances that share it by measurement: each such file holds
    the whole node's readings over that instance's run (``instances_on_node`` in its metadata)."""
    return rt.local_rank == 0 or (rt.instances_per_node > 1 and rt.rank == 0)


@contextlib.contextmanager
def sampling(config: PowerConfig, rt: Runtime, log_path: Path | None, out_dir: Path,
             clock: Clock = time.time, notify: Callable[[str], None] | None = None) -> Iterator[Sampler | None]:
    """Sample this node's power for the ``with`` block (the timed run: enter just after
    ``run_start``, leave after ``run_stop``); every rank of the run enters it.

    The file is published when the block ends, normally or by an exception (an error, a
    SIGTERM turned into one): its readings cover the run up to that moment. ``notify`` gets one
    line when the node has no readable counter or the file cannot be written.

    Args:
        config: the ``power`` section. rt: the `mlhpc.runtime.Runtime` of this run's instance.
        log_path: rank 0's ``result_N.txt`` (None elsewhere). out_dir: the run's output folder.
        clock: seconds since the epoch, the result log's clock.

    Yields:
        the running `Sampler` on a node's local rank 0 with a counter, else None.
    """
    say = notify or (lambda message: None)
    if config.enabled is False:
        yield None
        return
    name = _result_name(log_path, rt)
    sampler, nvml = _start(config, rt, name, out_dir, clock, say) if name and samples_node(rt) else (None, None)
    try:
        yield sampler
    finally:
        try:
            if sampler is not None:
                sampler.stop()
        except OSError as exc:
            say(f"power: {sampler.final} not written ({exc}); no energy for this run")
        finally:
            close_nvml(nvml)


def _start(config: PowerConfig, rt: Runtime, name: str, out_dir: Path, clock: Clock,
           say: Callable[[str], None]) -> tuple[Sampler | None, Any]:
    sources, problems, nvml = find_sources(config)
    if not sources:
        say(f"power: no power counter on node {rt.node_rank} ({no_counter_reason(config, problems)}): "
            "no energy is reported")
        return None, None
    if problems:
        say(f"power: node {rt.node_rank}: " + "; ".join(problems))
    final = node_file(out_dir, name, rt.node_rank)
    meta = {"node": rt.node_rank, "sources": [f"{s.name} ({s.kind})" for s in sources],
            "not_read": problems}
    shared = rt.instances_per_node
    if shared > 1:
        meta["instances_on_node"] = shared
        if rt.local_rank == 0:
            say(f"power: node {rt.node_rank} is shared by {shared} instances: each instance's "
                f"power/result_N/node_{rt.node_rank}.txt holds the whole node's readings over its own "
                "run (not its share; the instances' energies overlap and do not add up)")
    sampler = Sampler(sources, config.interval_s, part_path(final.parent.parent / f"{name}.{final.name}"),
                      final, clock, meta)
    try:
        _claim_folder(Path(out_dir), (POWER_DIR,))
        if os.path.lexists(final):
            raise FileExistsError(f"{final} exists")
        sampler.start()
    except (OSError, SourceError) as exc:
        why = reason(exc) if isinstance(exc, OSError) and exc.errno else str(exc)
        say(f"power: cannot write {final} ({why}); no energy for this run")
        sampler.stop(publish=False)
        close_nvml(nvml)
        return None, None
    return sampler, nvml


def _claim_folder(out_dir: Path, parts: tuple[str, ...]) -> None:
    """Create ``out_dir/power`` (``0700`` where missing) without following a link: a planted
    ``power`` link is refused (OSError ELOOP), never written through. ``power/result_N`` itself
    was claimed with the run's log (`mlhpc.log.writer.RUN_FILES`) and is made by the publisher."""
    root = open_root(out_dir)
    try:
        check_output_folder(root, out_dir)
        os.close(open_dir(root, parts, create=True))
    finally:
        os.close(root)
