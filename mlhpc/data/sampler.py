"""Which samples each rank reads: node-local shards after a sharded stage, the global shuffle otherwise.

With ``data.staging.shard: node`` (`mlhpc.data.stage.Shard`) node ``n`` holds only its share of the
training and validation files, so its ranks can read only those samples. `NodeShardSampler`
shards the node's samples over the node's ranks and shuffles them within the node every epoch,
as NVIDIA's CosmoFlow and DeepCAM submissions to MLPerf HPC v3.0 do with their node-local data
(mlcommons/hpc_results_v3.0, NVIDIA/benchmarks/*/implementations); docs/staging-at-scale.md
quotes the rule sentences on staging and data order that allow it.

Coverage and step counts. Every rank must run the same number of steps (DistributedDataParallel
all-reduces once per step), but nodes may hold different numbers of samples (shares are balanced
by bytes, one file apart). Each rank therefore yields ``samples_per_rank = max over ranks of
ceil(node samples / ranks of the node)`` indices per epoch: the node's samples in this epoch's
order, cut into strides over its ranks, the short strides topped up by repeating the node's
first samples of the epoch -- the padding `torch.utils.data.DistributedSampler` does with
``drop_last=False``, here within a node. The strides are the deal of the partition rule
(`mlhpc.data.partition.partition`, samples of weight one), the rule staging deals files to
nodes by. The nodes' counts come from the staged folder's manifest where it counts every
file's samples (`mlhpc.data.stage.StagingResult.node_samples`); only otherwise are they
gathered from the ranks. An epoch thus covers every training sample of the job
exactly once, plus ``padded_samples`` repeats (zero when every node holds a multiple of its rank
count of samples and the nodes hold equal counts). The count logged as ``train_samples`` is the
job's, ``global_samples`` (`node_counts` sums the nodes), never one node's.

With ``shard: none`` every node holds everything and `train_sampler` returns the global,
seeded `DistributedSampler` of before: R ranks x local batch b see the same global batches as
1 rank x R*b.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from torch.utils.data import DistributedSampler, Sampler

from mlhpc.data.partition import partition

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.runtime import Runtime


class NodeShardSampler(Sampler[int]):
    """This rank's indices into its node's dataset for one epoch (see the module docstring).

    Epoch ``e`` (`set_epoch`) orders the node's ``node_samples`` samples by
    ``torch.randperm(node_samples)`` from a generator seeded with ``seed + e``, the same on every
    rank of the node; local rank ``r`` of ``L`` takes positions ``r, r + L, ...`` of that order,
    wrapped around to ``samples_per_rank * L`` positions.

    Args:
        node_samples: samples in this node's dataset (>= 1).
        local_rank / local_world_size: this rank's place on its node.
        samples_per_rank: indices each rank yields per epoch; the same on every rank of the job
            and at least ``ceil(node_samples / local_world_size)`` (`node_counts`).
        seed: the run's seed.

    Raises:
        ValueError: an empty node, a rank outside the node, or ``samples_per_rank`` too small to
            cover the node.
    """

    def __init__(self, node_samples: int, local_rank: int, local_world_size: int,
                 samples_per_rank: int, seed: int = 0) -> None:
        if node_samples < 1:
            raise ValueError(f"node shard sampler: the node holds no sample ({node_samples})")
        if not 0 <= local_rank < local_world_size:
            raise ValueError(f"node shard sampler: local rank {local_rank} outside 0..{local_world_size - 1}")
        if samples_per_rank * local_world_size < node_samples:
            raise ValueError(f"node shard sampler: {samples_per_rank} samples per rank x "
                             f"{local_world_size} ranks cannot cover the node's {node_samples} samples")
        self.node_samples = node_samples
        self.local_rank = local_rank
        self.local_world_size = local_world_size
        self.samples_per_rank = samples_per_rank
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order (0-based, like `DistributedSampler.set_epoch`)."""
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.node_samples, generator=generator)
        total = self.samples_per_rank * self.local_world_size
        if total > self.node_samples:  # top up with this epoch's first samples, wrapping round
            order = order.repeat(math.ceil(total / self.node_samples))[:total]
        mine = partition(total, self.local_world_size)[self.local_rank]
        return iter(order[torch.as_tensor(mine, dtype=torch.long)].tolist())

    def __len__(self) -> int:
        return self.samples_per_rank


class ShardSampler(Sampler[int]):
    """Evaluation sharding without padding: rank ``r`` of ``R`` takes indices r, r+R, r+2R, ...

    No sample is repeated, so (sum, count) reduced over ranks gives the exact metric over the
    whole validation set. After a sharded stage pass the node's dataset with the local rank and
    local world size (`eval_sampler`).
    """

    def __init__(self, length: int, rank: int, world_size: int):
        self.indices = list(partition(length, world_size)[rank])

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


def samples_per_rank(node_samples: Sequence[int], local_world_sizes: Sequence[int]) -> int:
    """``max over nodes of ceil(node_samples[n] / local_world_sizes[n])``: what every rank yields."""
    return max(math.ceil(n / max(l, 1)) for n, l in zip(node_samples, local_world_sizes))


def node_counts(node_samples: int, rt: "Runtime",
                recorded: Sequence[int] | None = None) -> tuple[list[int], list[int]]:
    """Samples held and ranks run by every node, ordered by node rank: ``(samples, ranks)``.

    ``recorded``: every node's samples as the staged manifest counts them
    (`mlhpc.data.stage.StagingResult.node_samples`), taken as they are, every node running
    ``local_world_size`` ranks (as torchrun and ``srun --ntasks-per-node`` start them). Without
    them, ``(node_rank, local_world_size, node_samples)`` is gathered from every rank of
    ``rt``'s group (one ``all_gather_object``); one process: ``([node_samples], [1])``.

    Raises:
        ValueError: two ranks of one node report different sample counts.
        DataError: this node's dataset holds another count than the manifest records.
    """
    ranks = rt.local_world_size if rt.distributed else 1
    if recorded is not None and len(recorded) == rt.num_nodes \
            and ranks * rt.num_nodes == (rt.world_size if rt.distributed else 1):
        if recorded[rt.node_rank] != node_samples:
            from mlhpc.errors import DataError

            raise DataError(f"node {rt.node_rank}: its staged dataset holds {node_samples} samples, "
                            f"its manifest counts {recorded[rt.node_rank]} (the source changed "
                            "after its manifest was written: convert or prepare it again)")
        return list(recorded), [ranks] * rt.num_nodes
    if not rt.distributed or not torch.distributed.is_initialized():
        return [node_samples], [rt.local_world_size if rt.distributed else 1]
    rows: list = [None] * torch.distributed.get_world_size(group=rt.group)
    torch.distributed.all_gather_object(rows, (rt.node_rank, rt.local_world_size, node_samples),
                                        group=rt.group)
    nodes: dict[int, tuple[int, int]] = {}
    for node, ranks, samples in rows:
        if node in nodes and nodes[node][1] != samples:
            raise ValueError(f"node {node}: its ranks see {nodes[node][1]} and {samples} samples")
        nodes[node] = (ranks, samples)
    order = sorted(nodes)
    return [nodes[n][1] for n in order], [nodes[n][0] for n in order]


def train_sampler(dataset_len: int, rt: "Runtime", seed: int, sharded: bool,
                  recorded: Sequence[int] | None = None) -> Sampler[int]:
    """The training sampler of this rank, with ``global_samples`` and ``padded_samples`` set.

    Args:
        dataset_len: samples in the dataset this rank built (its node's share when ``sharded``).
        rt: this rank's `Runtime` (``rank``/``world_size`` of its instance, ``local_rank``,
            ``local_world_size``, ``node_rank``, ``group``).
        seed: the run's seed; epoch ``e`` shuffles with ``seed + e``.
        sharded: the data were staged with ``shard: node`` (`NodeShardSampler`); else the global
            `DistributedSampler` (``shuffle=True, drop_last=False``) over ``world_size`` ranks.
        recorded: the nodes' sample counts from the staged manifest (`node_counts`), or None.

    Returns:
        a sampler with ``set_epoch``; its ``global_samples`` is the job's training-set size (log
        it as ``train_samples``) and ``padded_samples`` the repeats per epoch that keep every
        rank's step count equal.
    """
    if not sharded:
        sampler = DistributedSampler(range(dataset_len), num_replicas=rt.world_size, rank=rt.rank,
                                     shuffle=True, seed=seed, drop_last=False)
        sampler.global_samples = dataset_len  # type: ignore[attr-defined]
        sampler.padded_samples = sampler.total_size - dataset_len  # type: ignore[attr-defined]
        return sampler
    samples, ranks = node_counts(dataset_len, rt, recorded)
    per_rank = samples_per_rank(samples, ranks)
    sampler = NodeShardSampler(dataset_len, rt.local_rank, rt.local_world_size if rt.distributed else 1,
                               per_rank, seed)
    sampler.global_samples = sum(samples)  # type: ignore[attr-defined]
    sampler.padded_samples = per_rank * sum(ranks) - sum(samples)  # type: ignore[attr-defined]
    return sampler


def eval_sampler(dataset_len: int, rt: "Runtime", sharded: bool) -> ShardSampler:
    """The evaluation sampler of this rank: the node's validation share over the node's ranks
    when ``sharded``, else the whole validation set over all ranks; never padded."""
    if sharded:
        return ShardSampler(dataset_len, rt.local_rank, rt.local_world_size if rt.distributed else 1)
    return ShardSampler(dataset_len, rt.rank, rt.world_size)


def global_count(dataset_len: int, rt: "Runtime", sharded: bool,
                 recorded: Sequence[int] | None = None) -> int:
    """The job's sample count of a split: the sum over nodes when ``sharded`` (`node_counts`),
    else ``dataset_len``."""
    return sum(node_counts(dataset_len, rt, recorded)[0]) if sharded else dataset_len
