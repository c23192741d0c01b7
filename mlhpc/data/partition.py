"""The partition rule: items dealt over shares, for files to nodes and samples to ranks.

Staging deals a split's files (or groups of files a workload keeps together,
`mlhpc.workload.DataTools.file_group`) to the nodes, weighted by bytes (`mlhpc.data.stage.plan`);
the samplers deal a node's samples of one epoch to its ranks, every sample of weight one
(`mlhpc.data.sampler`). Both call `partition`: the items, permuted once with a seed where one is
given, are taken largest first (equal weights keep the permuted order) and each goes to the share
holding the least weight so far, then the fewest items, then the lowest index -- the
longest-processing-time rule. Each share so holds about ``1/parts`` of the weight, within one
item of it; with equal weights the deal is round-robin: item ``i`` goes to share ``i % parts``,
the strided split of `torch.utils.data.DistributedSampler`. MosaicML streaming's
``partition`` plays the same part for its nodes and ranks: one deterministic function, the same
on every process without talking.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence


def partition(weights: Sequence[int] | int, parts: int, seed: str | None = None,
              sizes: Sequence[int] | None = None) -> list[list[int]]:
    """The indices of ``weights`` dealt over ``parts`` shares.

    Args:
        weights: each item's weight (bytes of a file or group), or ``n``: ``n`` items of weight
            one (a node's samples).
        parts: the number of shares (nodes, ranks), at least 1.
        seed: the items are permuted once with ``random.Random(seed)`` before the deal (None:
            they keep their order).
        sizes: each item's count of members (files of a group; default one), the second key of
            the deal after the weight held.

    Returns:
        ``parts`` lists of item indices, each in the order dealt.

    Raises:
        ValueError: ``parts < 1``.
    """
    if parts < 1:
        raise ValueError(f"partition: expected at least 1 share, got {parts}")
    n = weights if isinstance(weights, int) else len(weights)
    order = list(range(n))
    if seed is not None:
        random.Random(seed).shuffle(order)
    if isinstance(weights, int) or (len(set(weights)) <= 1 and sizes is None):
        return [order[p::parts] for p in range(parts)]  # equal weights: round-robin, the same deal
    order.sort(key=lambda i: -weights[i])  # stable: equal weights keep the permuted order
    shares: list[list[int]] = [[] for _ in range(parts)]
    held = [(0, 0, p) for p in range(parts)]  # heap of (weight so far, members so far, share)
    for i in order:
        weight, count, p = heapq.heappop(held)
        shares[p].append(i)
        heapq.heappush(held, (weight + weights[i], count + (1 if sizes is None else sizes[i]), p))
    return shares
