"""Where a node's power is read: NVML (GPUs), Linux powercap RAPL (CPU packages, DRAM), a site's
node meter command.

Each source is either a *counter* (`read` gives the energy in joules consumed since the source
was opened, monotonic: NVML's ``nvmlDeviceGetTotalEnergyConsumption``, RAPL's ``energy_uj``
unwrapped at ``max_energy_range_uj``) or a *gauge* (`read` gives the power in watts at that
moment: NVML's ``nvmlDeviceGetPowerUsage`` on devices without the energy counter, the node meter).
A counter's interval mean (energy difference / time) is exact; a gauge is a sample that stands
for the interval before it. `find_sources` says, one line per source, what could not be read;
nothing here guesses a figure (no TDP, no estimate).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import select
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

COUNTER = "counter"
GAUGE = "gauge"
_RAPL_DIR = re.compile(r"^intel-rapl:\d+(:\d+)?$")


class SourceError(Exception):
    """A source could not be read (one line: which source, what failed)."""


class Source(Protocol):
    name: str
    kind: str  # COUNTER (read -> joules since opened) or GAUGE (read -> watts now)

    def read(self) -> float: ...


@dataclass
class RaplDomain:
    """One powercap zone: ``<zone>/energy_uj`` in microjoules, wrapping to 0 after
    ``max_energy_range_uj`` (Linux Documentation/power/powercap/powercap.rst)."""

    path: Path
    name: str
    max_range_uj: int
    kind: str = COUNTER
    _last_raw: int | None = None
    _total_uj: int = 0

    def read(self) -> float:
        try:
            raw = int((self.path / "energy_uj").read_text().strip())
        except (OSError, ValueError) as exc:
            raise SourceError(f"{self.name}: energy_uj unreadable ({_why(exc)})") from None
        if self._last_raw is not None:
            delta = raw - self._last_raw
            if delta < 0:  # the counter wrapped past max_energy_range_uj
                delta += self.max_range_uj
            if delta < 0:  # reset (or no range known): resynchronise, refuse this interval
                previous, self._last_raw = self._last_raw, raw
                raise SourceError(f"{self.name}: energy_uj went back from {previous} to {raw} "
                                  "(counter reset); this interval is not measured")
            self._total_uj += delta
        self._last_raw = raw
        return self._total_uj / 1e6


def find_rapl(root: Path) -> tuple[list[RaplDomain], list[str]]:
    """The CPU package zones (``name`` ``package-N``) and DRAM zones (``dram``) under ``root``
    (``/sys/class/powercap``), each read once to be sure it is readable. Core, uncore and psys
    zones are left out (core and uncore lie inside their package; psys overlaps everything).

    Returns ``(domains, problems)``: ``problems`` names each zone that could not be read.
    """
    domains, problems = [], []
    try:
        entries = sorted(p for p in Path(root).iterdir() if _RAPL_DIR.match(p.name))
    except OSError:
        return [], []
    for zone in entries:
        try:
            kind = (zone / "name").read_text().strip()
        except OSError as exc:
            problems.append(f"powercap {zone.name}: name unreadable ({_why(exc)})")
            continue
        if not (kind.startswith("package") or kind == "dram"):
            continue
        name = f"rapl:{zone.name.split(':', 1)[1]}:{kind}"
        try:
            max_range = int((zone / "max_energy_range_uj").read_text().strip())
            domain = RaplDomain(zone, name, max_range)
            domain.read()
        except (OSError, ValueError, SourceError) as exc:
            problems.append(f"powercap {zone.name} ({kind}): {_why(exc)}; not counted")
            continue
        domains.append(domain)
    return domains, problems


@dataclass
class NvmlDevice:
    """One GPU through NVML: the total energy counter (millijoules since the driver loaded, Volta
    and later) where the device has it, else the power gauge (milliwatts)."""

    nvml: Any
    handle: Any
    name: str
    kind: str = COUNTER
    _first_mj: int | None = None

    def read(self) -> float:
        try:
            if self.kind == COUNTER:
                mj = int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
                self._first_mj = mj if self._first_mj is None else self._first_mj
                return (mj - self._first_mj) / 1e3
            return float(self.nvml.nvmlDeviceGetPowerUsage(self.handle)) / 1e3
        except self.nvml.NVMLError as exc:
            raise SourceError(f"{self.name}: NVML read failed ({exc})") from None


def find_nvml() -> tuple[list[NvmlDevice], list[str], Any]:
    """Every GPU NVML sees on this node. Returns ``(devices, problems, nvml module or None)``;
    the caller shuts NVML down (`close_nvml`) when done."""
    try:
        import pynvml as nvml
    except ImportError:
        return [], ["NVML: nvidia-ml-py not installed (pip install 'mlhpc[gpu]')"], None
    try:
        nvml.nvmlInit()
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:  # NVMLError, or a library that fails to load: no GPU counter here
        return [], [f"NVML: {exc}"], None
    devices, problems = [], []
    for index in range(count):
        device = NvmlDevice(nvml, None, f"gpu{index}")
        try:
            device.handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            problems.append(f"NVML gpu{index}: {exc}")
            continue
        for kind in (COUNTER, GAUGE):
            device.kind = kind
            try:
                device.read()
                devices.append(device)
                break
            except SourceError as exc:
                last = str(exc)
        else:
            problems.append(f"NVML {last}; not counted")
    return devices, problems, nvml


def close_nvml(nvml: Any) -> None:
    """``nvmlShutdown`` (errors ignored: the readings are already written)."""
    if nvml is not None:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down after the run; nothing to report
            pass


@dataclass
class NodeMeter:
    """A site's command printing the node's instantaneous power in watts as one number (a BMC
    query, a PDU, Slurm's acct_gather_energy): run without a shell in its own process group,
    ``timeout_s`` at most, its output read up to `METER_OUTPUT_BYTES`, the group killed after
    each reading (`run_bounded`)."""

    command: str
    timeout_s: float = 5.0
    name: str = "node_meter"
    kind: str = GAUGE
    argv: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.argv = shlex.split(self.command)

    def read(self) -> float:
        out, status = run_bounded(self.argv, self.timeout_s, f"node meter {self.command!r}")
        text = out.decode("utf-8", errors="replace").strip()
        try:
            watts = float(text)
        except ValueError:
            watts = math.nan
        if status != 0 or not math.isfinite(watts) or watts < 0:
            raise SourceError(f"node meter {self.command!r}: exit {status}, printed "
                              f"{text[:40]!r}; expected one number of watts")
        return watts


#: The most bytes a node meter may print (one number is a few bytes).
METER_OUTPUT_BYTES = 4096


def run_bounded(argv: list[str], timeout_s: float, what: str) -> tuple[bytes, int]:
    """Run ``argv`` (no shell) in its own process group, read at most `METER_OUTPUT_BYTES` of
    its output within ``timeout_s`` seconds, then kill the whole group (SIGKILL: whatever the
    command left running dies with it) and reap it. Returns ``(output, exit status)``.

    Raises:
        SourceError: it cannot be started, runs past ``timeout_s`` or prints more than the cap.
    """
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        raise SourceError(f"{what}: {_why(exc)}") from None
    try:
        out, problem = _read_until(proc.stdout, time.monotonic() + timeout_s)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
        status = proc.wait()
    if problem:
        raise SourceError(f"{what}: {problem.format(timeout_s=timeout_s)}; its process group was killed")
    return out, status


def _read_until(stream: Any, deadline: float) -> tuple[bytes, str]:
    """Bytes of ``stream`` until its end, the deadline or the cap; a problem in words, or ""."""
    chunks: list[bytes] = []
    total = 0
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(chunks), "timed out after {timeout_s} s"
        if not select.select([stream], [], [], left)[0]:
            continue
        chunk = os.read(stream.fileno(), METER_OUTPUT_BYTES + 1)
        if not chunk:
            return b"".join(chunks), ""
        chunks.append(chunk)
        total += len(chunk)
        if total > METER_OUTPUT_BYTES:
            return b"", f"printed more than {METER_OUTPUT_BYTES} bytes"


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
