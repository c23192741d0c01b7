"""``train.eval_every_steps``: an epoch of the run as a block of optimizer steps read on through
the passes over the data (the reference's OpenFold evaluates every 40 steps). Each pass still
reads every sample once, a block resumed after k micro-steps continues with exactly the batches
the uninterrupted block would have given, and ``epoch_num`` counts samples for the benchmarks the
rules count so."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from mlhpc.data.loader import DeviceLoader
from mlhpc.run import train


class _Indices(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> tuple[int, int]:
        return index, index

    @staticmethod
    def collate_fn(items: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
        return [x for x, _ in items], [y for _, y in items]


def _parts(n: int, batch: int) -> SimpleNamespace:
    dataset = _Indices(n)
    sampler = DistributedSampler(range(n), num_replicas=1, rank=0, shuffle=True, seed=7)
    return SimpleNamespace(train_ds=dataset, train_sampler=sampler, local_batch_size=batch,
                           train_loader=DeviceLoader(DataLoader(dataset, batch_size=batch,
                                                                sampler=sampler,
                                                                collate_fn=dataset.collate_fn),
                                                     "cpu", lambda x: x),
                           step=SimpleNamespace(device=torch.device("cpu")))


def _config(every: int | None, accumulation: int = 1) -> SimpleNamespace:
    return SimpleNamespace(train=SimpleNamespace(eval_every_steps=every,
                                                 gradient_accumulation_steps=accumulation,
                                                 global_batch_size=4),
                           data=SimpleNamespace(num_workers=0))


def _block(parts, epoch: int, skip: int, config) -> tuple[list[list[int]], int]:
    batches, micro_steps = train._epoch_batches(parts, epoch, skip, config)
    return [list(x) for x, _ in batches], micro_steps


def test_blocks_read_on_through_passes_each_pass_reading_every_sample_once():
    parts, config = _parts(10, 4), _config(every=4)  # 3 micro-steps a pass (4, 4, 2 samples)
    blocks = [_block(parts, epoch, 0, config) for epoch in (1, 2, 3)]
    assert [m for _, m in blocks] == [4, 4, 4] and all(len(b) == 4 for b, _ in blocks)
    stream = [batch for b, _ in blocks for batch in b]  # 12 micro-steps = 4 passes of 3
    passes = [list(itertools.chain(*stream[i:i + 3])) for i in range(0, 12, 3)]
    for number, seen in enumerate(passes):
        assert sorted(seen) == list(range(10)), f"pass {number} reads every sample once"
    assert passes[0] != passes[1], "each pass is shuffled anew"


@pytest.mark.parametrize("epoch, skip", [(1, 1), (2, 3), (3, 2)])
def test_a_resumed_block_gives_the_batches_the_uninterrupted_one_gives(epoch, skip):
    whole, _ = _block(_parts(10, 4), epoch, 0, _config(every=4))
    resumed, micro_steps = _block(_parts(10, 4), epoch, skip, _config(every=4))
    assert micro_steps == 4 and resumed == whole[skip:]


def test_gradient_accumulation_makes_a_block_of_micro_steps():
    batches, micro_steps = _block(_parts(10, 2), 1, 0, _config(every=3, accumulation=2))
    assert micro_steps == 6 and len(batches) == 6


def test_unset_an_epoch_is_one_pass():
    batches, micro_steps = _block(_parts(10, 4), 2, 0, _config(every=None))
    assert micro_steps == 3 and sorted(itertools.chain(*batches)) == list(range(10))


@pytest.mark.parametrize("name, every, expected", [
    ("openfold", 40, [40 * 4, 2 * 40 * 4]),  # samples: steps x global batch
    ("openfold", None, [4 * 3, 2 * 4 * 3]),  # a pass: 3 steps of 4
    ("cosmoflow", 40, [1, 2]),  # epochs count passes (or blocks)
])
def test_epoch_num_counts_samples_where_the_rules_do(name, every, expected):
    job = SimpleNamespace(workload=SimpleNamespace(name=name), config=_config(every))
    state = SimpleNamespace(job=job, parts=_parts(10, 4))
    assert [train._epoch_num(state, epoch) for epoch in (1, 2)] == expected
