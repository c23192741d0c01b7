"""Power sampling during the timed run: energy to train, measured from real counters.

One sampler per node (local rank 0) reads, every ``power.interval_s`` (1 s by default, the MLPerf
power rules' minimum rate), either the site's node meter (``power.node_meter_command``: the
whole node at the wall, used alone when given) or the sum of every NVML GPU (total energy
counter, else the power gauge) and every readable RAPL CPU-package and DRAM zone under
``power.powercap_root``. It writes ``<out>/power/result_N/node_K.txt`` in the MLPerf power-log
layout (`mlhpc.power.sampler`), the folder ``mlperf_logging``'s result_summarizer and
``mlhpc report`` integrate into energy to train. Where nothing can be read, the run says so once
and no file is written: no energy is claimed. Not measured: network switches (an ``sw_K.txt``
with ``interconnect_power_est`` may be added by hand), and, without a node meter, fans, power
supplies, NICs, disks and anything else outside the GPUs and the RAPL zones. See docs/power.md.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from mlhpc.data.files import reason
from mlhpc.power.sampler import Clock, Sampler
from mlhpc.power.sources import NodeMeter, SourceError, close_nvml, find_nvml, find_rapl

__all__ = ["PowerConfig", "Sampler", "find_sources", "node_file", "samples_node", "sampling"]

POWER_DIR = "power"


class PowerConfig(BaseModel):
    """The ``power`` section of a run config.

    Attributes:
        enabled: ``true`` sample (say so when nothing can be read), ``false`` never, ``null``
            (default) sample where a counter is found.
        interval_s: seconds between readings, 0.05 .. 1 (at least 1 Hz, as the MLPerf power rules).
        node_meter_command: a command printing the node's power in watts as one number (run
            without a shell each reading); when given it is the node's only source.
        powercap_root: where the Linux powercap (RAPL) zones are.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    enabled: Optional[bool] = None
    interval_s: float = Field(1.0, ge=0.05, le=1.0)
    node_meter_command: str = ""
    powercap_root: Path = Field(Path("/sys/class/powercap"), strict=False)

    @field_validator("node_meter_command")
    @classmethod
    def _splits(cls, value: str) -> str:
        """The command is split as it will be run (no shell), at load: an unbalanced quote is a
        config error before the run starts, not a failure after run_start."""
        import shlex

        try:
            shlex.split(value)
        except ValueError as exc:
            raise ValueError(f"cannot be split into a command and its arguments ({exc})") from None
        return value


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


def _result_name(log_path: Path | None, rt: Any) -> str | None:
    """``result_N`` of the run: from rank 0's log, broadcast to every rank of the instance."""
    name = Path(log_path).stem if log_path is not None else None
    if getattr(rt, "distributed", False):
        import torch.distributed as dist

        box = [name]
        dist.broadcast_object_list(box, src=dist.get_global_rank(rt.group, 0) if rt.group else 0,
                                   group=rt.group)
        name = box[0]
    return name


def samples_node(rt: Any) -> bool:
    """Whether this rank samples its node for its run: the node's local rank 0, and, in
    throughput mode with instances smaller than a node (`mlhpc.runtime.split_instances`), each
    instance's rank 0 too, so that every instance's ``result_N`` has the node's file. The node's
    power cannot be split between instances that share it by measurement: each such file holds
    the whole node's readings over that instance's run (``instances_on_node`` in its metadata)."""
    return rt.local_rank == 0 or (getattr(rt, "instances_per_node", 1) > 1 and rt.rank == 0)


@contextlib.contextmanager
def sampling(config: PowerConfig, rt: Any, log_path: Path | None, out_dir: Path,
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


def _start(config: PowerConfig, rt: Any, name: str, out_dir: Path, clock: Clock,
           say: Callable[[str], None]) -> tuple[Sampler | None, Any]:
    from mlhpc.data.files import part_path

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
    shared = getattr(rt, "instances_per_node", 1)
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
    was claimed with the run's log (`mlhpc.run.mllog.RUN_FILES`) and is made by the publisher."""
    from mlhpc.data.files import check_output_folder, open_dir, open_root

    root = open_root(out_dir)
    try:
        check_output_folder(root, out_dir)
        os.close(open_dir(root, parts, create=True))
    finally:
        os.close(root)
