"""One partition rule for files to nodes and samples to ranks (`mlhpc.data.partition`); the
nodes' sample counts from the manifest; files a workload keeps together staged on one node."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from mlhpc.data import manifest
from mlhpc.data.partition import partition
from mlhpc.data.sampler import NodeShardSampler, ShardSampler, node_counts, train_sampler
from mlhpc.data.stage import Shard, StageOptions, assign_shards, stage
from mlhpc.data.stage.plan import shard_samples
from mlhpc.errors import DataError
from mlhpc.runtime import Runtime
from mlhpc.workload import DataTools, get


def test_equal_weights_are_dealt_round_robin() -> None:
    assert partition(7, 3) == [[0, 3, 6], [1, 4], [2, 5]]
    assert partition([5] * 7, 3) == partition(7, 3)
    seeded = partition(10, 4, seed="s")
    assert seeded == partition(10, 4, seed="s") and seeded != partition(10, 4, seed="t")
    assert sorted(i for share in seeded for i in share) == list(range(10))
    with pytest.raises(ValueError, match="at least 1 share"):
        partition(3, 0)


def test_weights_are_balanced_largest_first() -> None:
    weights = [9, 1, 1, 1, 1, 1, 1, 1, 1, 1]
    shares = partition(weights, 2)
    assert sorted(sum(weights[i] for i in share) for share in shares) == [9, 9]
    assert [0] in shares  # the heavy item alone on its share


@pytest.mark.parametrize(("node_samples", "ranks", "per_rank"), [(13, 4, 4), (8, 2, 5), (3, 4, 1)])
def test_node_sampler_is_the_strided_deal(node_samples: int, ranks: int, per_rank: int) -> None:
    """The sampler's strides are the partition's deal: the same indices as ``order[r::L]``."""
    for rank in range(ranks):
        sampler = NodeShardSampler(node_samples, rank, ranks, per_rank, seed=5)
        sampler.set_epoch(2)
        generator = torch.Generator()
        generator.manual_seed(7)
        order = torch.randperm(node_samples, generator=generator)
        total = per_rank * ranks
        if total > node_samples:
            order = order.repeat(math.ceil(total / node_samples))[:total]
        assert list(sampler) == order[rank:total:ranks].tolist()
    assert [i for r in range(3) for i in ShardSampler(8, r, 3)] == [0, 3, 6, 1, 4, 7, 2, 5]


def test_node_counts_come_from_the_manifest_without_a_gather() -> None:
    """With the manifest's counts every rank knows every node's samples without talking (no
    process group exists here: a gather would fail); a node whose dataset disagrees is refused."""
    rt = Runtime(rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1, num_nodes=2)
    assert node_counts(11, rt, [10, 11]) == ([10, 11], [4, 4])
    sampler = train_sampler(11, rt, seed=0, sharded=True, recorded=[10, 11])
    assert (sampler.global_samples, len(sampler), sampler.padded_samples) == (21, 3, 3)
    with pytest.raises(DataError, match="node 1: its staged dataset holds 12 samples, its manifest counts 11"):
        node_counts(12, rt, [10, 11])


def _files(root: Path, rels: dict[str, int]) -> Path:
    for rel, size in rels.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(b"x" * size)
    return root


def test_shard_samples_sum_the_manifest_over_each_nodes_share(tmp_path: Path) -> None:
    rels = {f"train/f{i:02d}.npy": 100 + i for i in range(9)} | {"validation/v0.npy": 50,
                                                                 "validation/v1.npy": 60}
    root = _files(tmp_path / "src", rels)
    samples = {rel: 3 + i for i, rel in enumerate(sorted(rels))}
    manifest.write(root, "convert", [{"path": rel, "bytes": size, "xxh3_128": "0" * 32,
                                      "samples": samples[rel]} for rel, size in rels.items()])
    shard = Shard(0, 2, seed=4)
    counts = shard_samples(root, shard)
    shares = assign_shards(list(rels.items()), 2, 4)
    for split in ("train", "validation"):
        assert counts[split] == [sum(samples[r] for r in share if r.startswith(split + "/"))
                                 for share in shares]
    assert sum(counts["train"]) == sum(n for r, n in samples.items() if r.startswith("train/"))
    assert shard_samples(root, None) is None
    manifest.write(root, "stage", [{"path": rel, "bytes": size, "xxh3_128": "0" * 32}
                                   for rel, size in rels.items()])
    assert shard_samples(root, shard) is None  # a copy's manifest counts no samples


OPENFOLD_SPLIT = {
    "mmcif_files/1abc.cif": 900, "alignments/1abc_A/uniref90_hits.a3m": 300,
    "alignments/1abc_B/a3m/mgnify_hits.a3m": 200, "alignments/1abc_B/hhr/pdb70_hits.hhr": 40,
    "mmcif_files/2xyz.cif.gz": 700, "alignments/2xyz_A/bfd_uniclust_hits.a3m": 500,
    "mmcif_files/3pqr.cif": 100, "alignments/3pqr_C/uniref90_hits.a3m": 1200,
    "mmcif_files/4kkk.cif": 400, "alignments/4kkk_A/uniref90_hits.a3m": 400,
}


def _entry(rel: str) -> str:
    """The PDB entry of ``split/mmcif_files/ID.cif`` or ``split/alignments/ID_CHAIN/...``."""
    return rel.split("/")[2].split(".")[0].rsplit("_", 1)[0]


def test_openfold_keeps_a_chains_structure_and_alignments_on_one_node() -> None:
    """The contract's ``file_group``: OpenFold puts an entry's mmCIF and its chains' alignment
    files in one group, so a sharded stage never leaves a chain without its structure."""
    group = get("openfold").data_tools.file_group
    assert group("mmcif_files/1abc.cif") == group("alignments/1abc_B/a3m/mgnify_hits.a3m")
    assert group("mmcif_files/1abc.cif") != group("mmcif_files/2xyz.cif.gz")
    assert DataTools().file_group("a/b.h5") == "a/b.h5"  # the default: every file alone
    files = [(f"{split}/{rel}", size) for split in ("train", "validation")
             for rel, size in OPENFOLD_SPLIT.items()]
    for nodes in (2, 3, 4):
        shares = assign_shards(files, nodes, seed=1, group=group)
        for share in shares:
            held = {(r.split("/")[0], _entry(r)) for r in share}
            for split, entry in held:  # every file of an entry this node holds, it holds all
                mine = {r for r, _ in files if r.startswith(split + "/") and _entry(r) == entry}
                assert mine <= set(share)
        assert sorted(r for share in shares for r in share) == sorted(r for r, _ in files)
    ungrouped = assign_shards(files, 4, seed=1)  # without the hook the chains are split up
    assert any({(r.split("/")[0], _entry(r)) for r in s} & {(r.split("/")[0], _entry(r)) for r in t}
               for i, s in enumerate(ungrouped) for t in ungrouped[i + 1:])


def test_a_sharded_stage_of_openfold_data_keeps_entries_whole(tmp_path: Path) -> None:
    rels = {f"{split}/{rel}": size for split in ("train", "validation")
            for rel, size in OPENFOLD_SPLIT.items()}
    source = _files(tmp_path / "src", rels)
    group = get("openfold").data_tools.file_group
    held: list[set[str]] = []
    for node in range(2):
        dest = tmp_path / f"node{node}"
        stage(source, dest, Runtime(), StageOptions(shard=Shard(node, 2, seed=3, group=group)))
        held.append({p.relative_to(dest).as_posix() for p in dest.rglob("*")
                     if p.is_file() and not p.name.startswith(".")})
    assert held[0].isdisjoint(held[1]) and held[0] | held[1] == set(rels)
    for share in held:
        for rel in share:
            entry = (rel.split("/")[0], _entry(rel))
            assert {r for r in rels if (r.split("/")[0], _entry(r)) == entry} <= share


def test_the_run_takes_each_splits_counts_from_the_staging_result() -> None:
    """`mlhpc.run.assemble.recorded_counts`: the training counts are the shard's first split's,
    the validation counts its second's; none without a sharded stage that counted them."""
    from mlhpc.data.stage import StagingResult
    from mlhpc.run.assemble import recorded_counts

    def staged(shard, node_samples):
        return StagingResult(Path("s"), Path("d"), 0, 0, 0, 0, 0, 0, 0.0, 0.0, shard=shard,
                             node_samples=node_samples)

    shard = {"mode": "node", "num_nodes": 2, "seed": 0, "splits": ["train", "val_id"]}
    counted = staged(shard, {"train": [5, 6], "val_id": [2, 1]})
    assert recorded_counts(counted, 0) == [5, 6] and recorded_counts(counted, 1) == [2, 1]
    assert recorded_counts(staged(shard, None), 0) is None
    assert recorded_counts(staged(None, {"train": [5, 6]}), 0) is None
    assert recorded_counts(None, 0) is None
