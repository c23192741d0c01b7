"""Who am I: rank, local rank, world size, node, device.

Detection order (first match wins), as documented for `detect`:

1. torchrun / torch.distributed.launch: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``
   (``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` where set); rendezvous from ``MASTER_ADDR``/``MASTER_PORT``.
2. Slurm step: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``, ``SLURM_NODEID``,
   ``SLURM_JOB_NUM_NODES`` (or ``SLURM_NNODES``); master address = first host of
   ``SLURM_STEP_NODELIST`` (or ``SLURM_JOB_NODELIST``), expanded with ``scontrol show hostnames``
   where needed.
3. MPI: ``mpi4py.MPI.COMM_WORLD`` when the process was started by mpiexec (PMI/OMPI variables set);
   the master address is rank 0's hostname, broadcast over MPI.
4. A single process.

`init_process_group` then sets up torch.distributed: NCCL when the device is CUDA, Gloo on CPUs,
one device per local rank; `started` does all of it for a run. The collectives the harness uses
are here too, in one place: `barrier`, `all_reduce`, `all_gather` (and `world_barrier`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Iterator, Mapping

import torch

DEFAULT_PORT = 29511
_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID")
#: What `detect` reads to find a launcher's ranks (and the prefixes of MPI's own variables).
_LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                 "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID") + _MPI_ENV
_MPI_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "MPI_LOCAL")


def single_process_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default ``os.environ``) without what marks a process as one rank of a launched
    job, so that a process started from a rank (an AutoML trial, `mlhpc.automl`) detects itself
    as a single process rather than as a rank of its parent's job."""
    env = os.environ if env is None else env
    return {k: v for k, v in env.items() if k not in _LAUNCHER_ENV and not k.startswith(_MPI_PREFIXES)}


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask (a launcher's binding), else the
    node's count."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def die_with_parent() -> None:
    """In a child process before exec (``preexec_fn``): SIGTERM when the process that started it
    dies (Linux ``PR_SET_PDEATHSIG``), so that no run outlives its worker or sweep on a shared
    node; elsewhere nothing."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass(frozen=True)
class Runtime:
    """This process's place in the job.

    Attributes:
        rank / world_size: global rank and number of processes.
        local_rank / local_world_size: rank within this node and processes on this node.
        node_rank / num_nodes: this node's index and the number of nodes.
        launcher: ``"torchrun"``, ``"slurm"``, ``"mpi"`` or ``"single"``.
        master_addr / master_port: torch.distributed rendezvous.
        device: ``torch.device`` this rank computes on.
        group / instance: the instance's process group and id in throughput mode (else None).
        instances_per_node: instances whose ranks share this rank's node (throughput mode with
            instances smaller than a node; 1 otherwise): each samples the node's power.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    num_nodes: int = 1
    launcher: str = "single"
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    group: Any = None  # torch.distributed process group of this instance (None: the world)
    instance: int | None = None  # instance id in throughput mode
    instances_per_node: int = 1  # instances sharing this rank's node (throughput mode, small instances)

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the only rank that writes logs and results."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def accelerators_per_node(self) -> int:
        """GPUs used per node (0 on CPUs), as logged in ``accelerators_per_node``."""
        return self.local_world_size if self.device.type == "cuda" else 0

    def with_device(self, device: torch.device) -> "Runtime":
        return Runtime(**{**self.__dict__, "device": device})


def _int(env: Mapping[str, str], *names: str, default: int | None = None) -> int:
    for name in names:
        if env.get(name, "") != "":
            return int(env[name])
    if default is None:
        raise KeyError(names[0])
    return default


def _first_slurm_host(nodelist: str) -> str:
    if not any(c in nodelist for c in "[,"):
        return nodelist
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, check=True, timeout=30).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    head = nodelist.split(",")[0]
    if "[" in head:  # node[01-04] -> node01
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return head


def detect(env: Mapping[str, str] | None = None, device: str = "auto") -> Runtime:
    """Detect this process's `Runtime` from the environment (order in the module docstring).

    Args:
        env: environment mapping (default ``os.environ``).
        device: ``"auto"`` (CUDA if available), ``"cpu"`` or ``"cuda"``.
    """
    env = os.environ if env is None else env
    port = _int(env, "MASTER_PORT", default=DEFAULT_PORT)
    if "RANK" in env and "WORLD_SIZE" in env:
        world = _int(env, "WORLD_SIZE")
        local_world = _int(env, "LOCAL_WORLD_SIZE", default=world)
        rank = _int(env, "RANK")
        rt = Runtime(rank=rank, world_size=world, local_rank=_int(env, "LOCAL_RANK", default=0),
                     local_world_size=local_world,
                     node_rank=_int(env, "GROUP_RANK", default=rank // max(local_world, 1)),
                     num_nodes=max(1, world // max(local_world, 1)), launcher="torchrun",
                     master_addr=env.get("MASTER_ADDR", "127.0.0.1"), master_port=port)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env and "SLURM_STEP_ID" in env:
        world = _int(env, "SLURM_NTASKS")
        nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", default=1)
        tasks_per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", ""))
        local_world = int(tasks_per_node.split("(")[0].split(",")[0]) if tasks_per_node else world // nodes
        nodelist = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", "127.0.0.1"))
        rt = Runtime(rank=_int(env, "SLURM_PROCID"), world_size=world,
                     local_rank=_int(env, "SLURM_LOCALID", default=0), local_world_size=local_world,
                     node_rank=_int(env, "SLURM_NODEID", default=0), num_nodes=nodes,
                     launcher="slurm", master_addr=env.get("MASTER_ADDR") or _first_slurm_host(nodelist),
                     master_port=port)
    elif any(name in env for name in _MPI_ENV):
        rt = _detect_mpi(port)
    else:
        rt = Runtime(master_port=port)
    return rt.with_device(_pick_device(device, rt.local_rank))


def _detect_mpi(port: int) -> Runtime:
    from mpi4py import MPI  # imported only under mpiexec: MPI_Init is not free

    comm = MPI.COMM_WORLD
    local = comm.Split_type(MPI.COMM_TYPE_SHARED)
    leaders = comm.Split(0 if local.Get_rank() == 0 else MPI.UNDEFINED, comm.Get_rank())
    node_rank = leaders.Get_rank() if leaders != MPI.COMM_NULL else -1
    num_nodes = leaders.Get_size() if leaders != MPI.COMM_NULL else -1
    node_rank, num_nodes = local.bcast((node_rank, num_nodes), root=0)
    master = comm.bcast(socket.gethostname() if comm.Get_rank() == 0 else None, root=0)
    return Runtime(rank=comm.Get_rank(), world_size=comm.Get_size(), local_rank=local.Get_rank(),
                   local_world_size=local.Get_size(), node_rank=node_rank, num_nodes=num_nodes,
                   launcher="mpi", master_addr=master, master_port=port)


def _pick_device(device: str, local_rank: int) -> torch.device:
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if count == 0:
        from mlhpc.errors import ConfigError

        raise ConfigError("train.device: 'cuda' asked for but no CUDA device is visible")
    return torch.device("cuda", local_rank % count)


def init_process_group(rt: Runtime, timeout_s: float = 600.0) -> None:
    """Start torch.distributed for ``rt`` (no-op for one process): NCCL on CUDA, Gloo on CPU."""
    if not rt.distributed or torch.distributed.is_initialized():
        return
    if rt.device.type == "cuda":
        torch.cuda.set_device(rt.device)
    backend = "nccl" if rt.device.type == "cuda" else "gloo"
    torch.distributed.init_process_group(
        backend=backend, init_method=f"tcp://{rt.master_addr}:{rt.master_port}",
        rank=rt.rank, world_size=rt.world_size, timeout=timedelta(seconds=timeout_s))


@contextmanager
def process_group(rt: Runtime) -> Iterator[Runtime]:
    """`init_process_group` on entry, `destroy_process_group` on exit (also on an error)."""
    init_process_group(rt)
    try:
        yield rt
    finally:
        destroy_process_group()


@contextmanager
def started(device: str = "auto", instances: int = 1, threads: int = 0
            ) -> Iterator[tuple[Runtime, Runtime]]:
    """This process's place in the job with the process group up, torn down on exit:
    ``(world, instance)``, the whole job's `Runtime` (`detect`) and this rank's instance's share
    of it (`split_instances`; ``world`` itself for one instance). ``threads`` > 0 sets torch's
    intra-op threads.

    Raises:
        ConfigError: no CUDA device for ``device="cuda"``, or ``instances`` does not divide the
            ranks.
    """
    world = detect(device=device)
    if threads:
        torch.set_num_threads(threads)
    with process_group(world):
        yield world, split_instances(world, instances)


def barrier(rt: Runtime) -> None:
    """Wait for every rank of ``rt``'s group (no-op for one process)."""
    if rt.distributed and torch.distributed.is_initialized():
        torch.distributed.barrier(group=rt.group)


def all_reduce(values: list[float], rt: Runtime, op: str = "sum") -> list[float]:
    """``values`` summed (``op="sum"``) or maxed (``"max"``) over the ranks of ``rt.group`` as
    float64; returned unchanged when not distributed."""
    if not rt.distributed:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=rt.device)
    red = torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX
    torch.distributed.all_reduce(tensor, op=red, group=rt.group)
    return tensor.tolist()


def group_ready() -> bool:
    """torch.distributed is up in this process (a process group was started)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def world_barrier() -> None:
    """Wait for every rank of the started process group."""
    torch.distributed.barrier()


def all_gather(payload: Any) -> list[Any]:
    """``payload`` of every rank of the started process group, in rank order (picklable
    objects; `torch.distributed.all_gather_object`)."""
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, payload)
    return out


def split_instances(rt: Runtime, instances: int) -> Runtime:
    """The `Runtime` of this rank's instance when the job trains ``instances`` independent models
    (MLPerf HPC throughput / weak-scaling mode): ranks ``[i*n, (i+1)*n)`` form instance ``i``,
    with ``n = world_size / instances`` and a process group of their own.

    Raises:
        ConfigError: the world size is not a multiple of ``instances``.
    """
    from mlhpc.errors import ConfigError

    if instances == 1:
        return rt
    if rt.world_size % instances:
        raise ConfigError(f"train.instances: {instances} does not divide the {rt.world_size} ranks "
                          "of this job")
    size = rt.world_size // instances
    groups = [torch.distributed.new_group(list(range(i * size, (i + 1) * size)))
              if rt.distributed else None for i in range(instances)]
    return Runtime(**{**rt.__dict__, **instance_placement(rt.rank, rt.local_world_size, size),
                      "group": groups[rt.rank // size]})


def instance_placement(rank: int, ranks_per_node: int, instance_size: int) -> dict[str, int]:
    """Where global ``rank`` sits in its throughput instance, ranks placed on nodes in blocks of
    ``ranks_per_node`` (rank r on node r // ranks_per_node) and instances in blocks of
    ``instance_size``: the instance, the rank and world size within it, its ranks on this node
    (``local_world_size``), the nodes it spans and this node's index among them, and how many
    instances have ranks on this node. An instance smaller than a node, or one that straddles
    two nodes when neither size divides the other, is counted as placed."""
    per_node = max(ranks_per_node, 1)
    instance = rank // instance_size
    members = range(instance * instance_size, (instance + 1) * instance_size)
    nodes = sorted({r // per_node for r in members})
    node = rank // per_node
    on_node = range(node * per_node, (node + 1) * per_node)
    return {"rank": rank - instance * instance_size, "world_size": instance_size,
            "instance": instance, "local_world_size": sum(1 for r in members if r // per_node == node),
            "num_nodes": len(nodes), "node_rank": nodes.index(node),
            "instances_per_node": len({r // instance_size for r in on_node})}


def destroy_process_group() -> None:
    """End torch.distributed if it was started (no-op otherwise)."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
