"""Level 3 of ``mlhpc validate``, distributed training (Deep500 ``lv3``: a distributed optimizer
against its consistent, one-process version).

W ranks (2 started here with ``torch.multiprocessing`` spawn: Gloo on the CPU, NCCL on GPUs when
there are two, Gloo between ranks sharing one GPU; or the ranks of the launcher that started the
job, torchrun or srun, `mlhpc.runtime`) each take their share of one global batch (one sample of
W), run forward and backward in DistributedDataParallel as a run does
(`mlhpc.run.step.wrap_model`) at the run's precision, and their averaged gradients are compared
with the gradients one process gets on the same global batch in float64 on the CPU, taken as W
micro-batches (gradient accumulation, averaged): what data parallel must equal, whatever couples
the samples of a batch (batch statistics, a loss averaged per atom). The ranks must also agree
with each other exactly (every rank steps with the same gradients).
"""

from __future__ import annotations

import queue
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch

from mlhpc.runtime import Runtime
from mlhpc.validate.checks import TOLERANCES, Check, judged, skipped
from mlhpc.validate.material import Material, reference_copy
from mlhpc.validate.network import Outcome, compare_rows, outcome, sensitivity

SPAWNED_RANKS = 2
#: How long the parent waits for the spawned ranks' gradients.
RANKS_TIMEOUT_S = 600.0


def ddp_outcome(model: torch.nn.Module, loss_fn: Any, batch: Any, seed: int, rt: Runtime,
                precision: str) -> Outcome:
    """This rank's `Outcome` after one forward and backward of ``model`` (float32, on
    ``rt.device``) in DistributedDataParallel on ``batch``: its gradients the average over the
    ranks."""
    from mlhpc.run.step import wrap_model

    wrapped = wrap_model(model.to(rt.device).train(), rt, False)
    found = outcome(wrapped, loss_fn, [(batch, seed)], (rt.device, precision))
    prefix = "gradient of module."  # DistributedDataParallel's own name for the model
    return {k.replace(prefix, "gradient of ", 1): v for k, v in found.items()}


def compare(mat: Material, ranks: list[Outcome], batches: list[Any]) -> list[Check]:
    """Level 3's rows: rank 0's gradients against a single process's (float64, the ranks'
    ``batches`` as micro-batches), and every rank's against rank 0's (exactly)."""
    tol = TOLERANCES[mat.precision].network
    world = len(ranks)
    parts = [(batch, mat.seed + r) for r, batch in enumerate(batches)]
    want = outcome(reference_copy(mat.model), mat.loss_fn, parts, None)
    sens = sensitivity(mat, lambda m: outcome(m, mat.loss_fn, parts, None), want)
    what = (f"{world} ranks on {mat.device} {mat.precision}, one sample each, against one process "
            f"on the same {world} samples in float64")
    got = {k: v for k, v in ranks[0].items() if k.startswith("gradient of ")}
    rows = [r for r in compare_rows(3, {**got, "output": [], "loss": []},
                                    {**{k: v for k, v in want.items() if k.startswith("gradient of ")},
                                     "output": [], "loss": []}, sens, tol, what)
            if r.name != "loss"]
    spread = 0.0
    for other in ranks[1:]:
        for name, g in got.items():
            h = other.get(name)
            if g and h:
                spread = max(spread, float((g[0] - h[0]).abs().max()))
    rows.append(judged(3, "ranks agree", "max abs", spread, 0.0,
                       "every rank must hold the same averaged gradient"))
    return rows


def level3(mat: Material, rt: Runtime) -> list[Check]:
    """Level 3 (module docstring): with the launcher's ranks when ``rt`` is distributed, else
    with `SPAWNED_RANKS` processes spawned here."""
    if rt.distributed:
        from mlhpc.runtime import all_gather

        batch = mat.batch([rt.rank])
        mine = ddp_outcome(mat.device_copy(), mat.loss_fn, batch, mat.seed + rt.rank, rt,
                           mat.precision)
        return compare(mat, all_gather(mine), all_gather(batch))
    return _spawned(mat)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spawned(mat: Material) -> list[Check]:
    ctx = torch.multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    port = _free_port()
    state = {k: v.detach().clone() for k, v in mat.model.state_dict().items()}
    tree = mat.config.model_dump(mode="json")
    procs = [ctx.Process(target=_rank, daemon=True, args=(_RankJob(
        r, port, str(mat.device), tree, state, mat.batch([r]), mat.precision, mat.seed), results))
        for r in range(SPAWNED_RANKS)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        while len(got) < SPAWNED_RANKS:
            rank, payload = results.get(timeout=RANKS_TIMEOUT_S)
            got[rank] = payload if isinstance(payload, str) else {
                n: [torch.from_numpy(a) for a in v] for n, v in payload.items()}
    except queue.Empty:
        got.setdefault(0, f"no answer from the spawned ranks within {RANKS_TIMEOUT_S:g} s")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.terminate()
    failed = [v for v in got.values() if isinstance(v, str)]
    if failed:
        return [skipped(3, "distributed gradients", f"the spawned ranks could not run: {failed[0]}")]
    return compare(mat, [got[r] for r in range(SPAWNED_RANKS)],
                   [mat.batch([r]) for r in range(SPAWNED_RANKS)])


@dataclass(frozen=True)
class _RankJob:
    """What a spawned rank is given: its rank, the rendezvous port, the device, the config (as a
    tree: its class is made per workload), the weights, its batch, precision and seed."""

    rank: int
    port: int
    device: str
    tree: dict[str, Any]
    state: dict[str, torch.Tensor]
    batch: Any
    precision: str
    seed: int


def _rank(job: _RankJob, results: Any) -> None:
    """One spawned rank: its gradients, or one line saying why it could not, to ``results``."""
    rank, port, device, tree, state = job.rank, job.port, job.device, job.tree, job.state
    batch, precision, seed = job.batch, job.precision, job.seed
    torch.set_num_threads(1)
    try:
        from mlhpc.config import from_dict
        from mlhpc.workload import get

        config = from_dict(tree, source="the validated config")  # its class is made per workload
        dev = torch.device(device)
        several = dev.type == "cuda" and torch.cuda.device_count() >= SPAWNED_RANKS
        if several:
            dev = torch.device("cuda", rank)
            torch.cuda.set_device(dev)
        rt = Runtime(rank=rank, world_size=SPAWNED_RANKS, local_rank=rank,
                     local_world_size=SPAWNED_RANKS, master_port=port, device=dev)
        torch.distributed.init_process_group(
            "nccl" if several else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
            world_size=SPAWNED_RANKS, timeout=timedelta(seconds=RANKS_TIMEOUT_S))
        workload = get(config.workload)
        model = workload.build_model(config.model)
        model.load_state_dict(state)
        found = ddp_outcome(model.float(), workload.build_loss(config), batch, seed + rank, rt,
                          precision)
        # plain arrays: a tensor sent through a queue is shared memory its sender must outlive
        results.put((rank, {n: [t.numpy() for t in v] for n, v in found.items()}))
    except Exception as exc:  # noqa: BLE001 - any failure of a rank is reported to the parent
        results.put((rank, f"rank {rank}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}"))
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
