"""At cluster scale each node stages and reads its own shard (`mlhpc.sampler`, `mlhpc.staging`).

The sampler's coverage property is checked over many node/rank/sample-count layouts, even and
uneven; the two-node job on one machine (two torchrun agents, ``--nnodes 2``) runs ``mlhpc
stage`` for real.
"""

from __future__ import annotations

import collections
import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from mlhpc.sampler import NodeShardSampler, ShardSampler, samples_per_rank

BIN = Path(sys.executable).parent


def epoch_indices(node_samples: list[int], ranks: list[int], seed: int, epoch: int
                  ) -> dict[tuple[int, int], list[int]]:
    """(node, local rank) -> the node-local indices that rank reads in ``epoch``."""
    per_rank = samples_per_rank(node_samples, ranks)
    out = {}
    for node, (n, local_world) in enumerate(zip(node_samples, ranks)):
        for local in range(local_world):
            sampler = NodeShardSampler(n, local, local_world, per_rank, seed)
            sampler.set_epoch(epoch)
            out[node, local] = list(sampler)
            assert len(sampler) == len(out[node, local])
    return out


LAYOUTS = [  # (samples per node, ranks per node)
    ([64], [1]), ([64, 64], [1, 1]), ([64, 64], [4, 4]),        # even: exactly once, no padding
    ([33, 31], [1, 1]), ([33, 31], [2, 2]), ([7, 8, 9], [4, 4, 4]),  # uneven
    ([1, 50], [3, 3]), ([100, 100, 99, 98], [8, 8, 8, 8]), ([10, 20], [1, 3]),
]


@pytest.mark.parametrize("node_samples,ranks", LAYOUTS)
def test_every_sample_once_per_epoch_and_equal_steps(node_samples: list[int], ranks: list[int]) -> None:
    per_rank = samples_per_rank(node_samples, ranks)
    assert per_rank == max(math.ceil(n / r) for n, r in zip(node_samples, ranks))
    for epoch in range(3):
        got = epoch_indices(node_samples, ranks, seed=11, epoch=epoch)
        assert {len(v) for v in got.values()} == {per_rank}  # same step count on every rank
        for node, n in enumerate(node_samples):
            seen = collections.Counter(i for (nd, _), v in got.items() if nd == node for i in v)
            assert set(seen) == set(range(n))  # every sample of the node, nothing from elsewhere
            repeats = sum(seen.values()) - n
            assert repeats == per_rank * ranks[node] - n  # the only extra reads are the padding
            assert max(seen.values()) <= math.ceil(per_rank * ranks[node] / n)
        total = sum(len(v) for v in got.values())
        padded = total - sum(node_samples)
        if all(n == per_rank * r for n, r in zip(node_samples, ranks)):
            assert padded == 0  # even layouts: exactly once
        # within a node the local ranks' unpadded reads are disjoint: the first n positions of the
        # epoch's order are split over the ranks, each read once
        for node, n in enumerate(node_samples):
            order = [None] * (per_rank * ranks[node])
            for local in range(ranks[node]):
                order[local::ranks[node]] = got[node, local]
            assert sorted(order[:n]) == list(range(n))


def test_shuffle_changes_every_epoch_and_is_reproducible() -> None:
    a = epoch_indices([40, 40], [2, 2], seed=3, epoch=0)
    b = epoch_indices([40, 40], [2, 2], seed=3, epoch=1)
    assert a != b and a == epoch_indices([40, 40], [2, 2], seed=3, epoch=0)
    assert a != epoch_indices([40, 40], [2, 2], seed=4, epoch=0)
    assert epoch_indices([40, 40], [2, 2], seed=3, epoch=1) == epoch_indices([40, 40], [2, 2], seed=4, epoch=0)


def test_bad_sampler_arguments() -> None:
    with pytest.raises(ValueError, match="holds no sample"):
        NodeShardSampler(0, 0, 1, 1)
    with pytest.raises(ValueError, match="cannot cover"):
        NodeShardSampler(10, 0, 2, 4)
    with pytest.raises(ValueError, match="local rank 2 outside"):
        NodeShardSampler(10, 2, 2, 5)


def test_eval_shards_cover_the_node_once() -> None:
    for n, ranks in ((13, 4), (3, 4), (8, 2)):
        got = [i for r in range(ranks) for i in ShardSampler(n, r, ranks)]
        assert sorted(got) == list(range(n))


def test_train_sampler_factory_single_process() -> None:
    from mlhpc.runtime import Runtime
    from mlhpc.sampler import eval_sampler, global_count, train_sampler

    rt = Runtime()
    node = train_sampler(30, rt, seed=0, sharded=True)
    assert isinstance(node, NodeShardSampler) and len(node) == 30
    assert (node.global_samples, node.padded_samples) == (30, 0)
    flat = train_sampler(30, rt, seed=0, sharded=False)
    assert (flat.global_samples, flat.padded_samples, len(flat)) == (30, 0, 30)
    assert len(eval_sampler(7, rt, sharded=True)) == 7 and global_count(7, rt, sharded=True) == 7
