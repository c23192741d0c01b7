"""Node-local staging (`mlhpc.data.stage`): copy, manifest, resume, corruption, failures, ranks."""

from __future__ import annotations

import errno
import hashlib

import xxhash
import json
import os
import socket
from pathlib import Path

import pytest

from mlhpc import rules
from mlhpc.data import checksums
from mlhpc.data import files as data_files
from mlhpc.data import manifest as data_manifest
from mlhpc.data import stage as staging
from mlhpc.data.stage import copy as stage_copy
from mlhpc.errors import StagingError
from mlhpc.runtime import Runtime
from mlhpc.data.stage import (MANIFEST_NAME, Shard, StageOptions, StagingResult, assign_shards, default_dest,
                              read_manifest, stage)

SIZES = {  # relative path -> bytes: empty, small, one buffer and a bit, nested folders
    "train/a.bin": 3 * checksums.BUFFER_BYTES + 17,
    "train/b.bin": 1000,
    "train/c.bin": 0,
    "train/sub/d.bin": checksums.BUFFER_BYTES,
    "train/sub/e.bin": 12345,
    "validation/v0.bin": 777,
    "validation/v1.bin": 2 * checksums.BUFFER_BYTES - 1,
    "README": 5,
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _snapshot(root: Path) -> dict[str, tuple[str, int, int]]:
    """relative path -> (sha256, size, mtime_ns) of every file under root."""
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            st = path.stat()
            out[path.relative_to(root).as_posix()] = (_sha256(path), st.st_size, st.st_mtime_ns)
    return out


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for i, (rel, size) in enumerate(sorted(SIZES.items())):
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(bytes((i * 31 + j) % 251 for j in range(size)) if size < 5000
                         else os.urandom(size))
    return root


def _assert_staged(source: Path, dest: Path) -> None:
    """dest holds exactly source's files, and a manifest whose sizes and checksums are right."""
    src, dst = _snapshot(source), _snapshot(dest)
    assert {rel: v[:2] for rel, v in dst.items() if not rel.startswith(".mlhpc")} == \
        {rel: v[:2] for rel, v in src.items()}
    leftovers = [p.name for p in dest.rglob("*") if p.name.endswith(data_files.PART_SUFFIX)
                 or p.name.startswith(data_manifest.JOURNAL_PREFIX)]
    assert leftovers == []
    manifest = read_manifest(dest)
    assert sorted(manifest) == sorted(src)
    for rel, (digest, size, _) in src.items():
        assert manifest[rel]["bytes"] == size
        expected = xxhash.xxh3_128((source / rel).read_bytes()).hexdigest()
        assert manifest[rel]["xxh3_128"] == expected


def test_stage_copies_tree_writes_manifest_and_leaves_source_alone(source: Path, tmp_path: Path) -> None:
    before = _snapshot(source)
    dest = tmp_path / "node" / "dst"
    result = stage(source, dest, Runtime(), StageOptions(workers=3))

    _assert_staged(source, dest)
    assert _snapshot(source) == before  # bytes, sizes and modification times
    assert (result.staged_files, result.staged_bytes) == (len(SIZES), sum(SIZES.values()))
    assert (result.copied_files, result.copied_bytes, result.skipped_files) == \
        (len(SIZES), sum(SIZES.values()), 0)
    assert result.manifest == dest / MANIFEST_NAME and result.dest == dest
    assert result.elapsed_s > 0 and result.gb_per_s == pytest.approx(result.copied_bytes / result.elapsed_s / 1e9)
    assert [n["hostname"] for n in result.per_node] == [socket.gethostname()]
    assert json.loads(json.dumps(result.to_dict()))["dest"] == str(dest)
    doc = json.loads((dest / MANIFEST_NAME).read_text())
    assert doc["algorithm"] == "xxh3_128" and doc["source"] == str(source.resolve())

    again = stage(source, dest, Runtime(), StageOptions(workers=2))  # everything present and verified
    assert (again.copied_files, again.skipped_files, again.gb_per_s) == (0, len(SIZES), 0.0)
    assert _snapshot(source) == before


def test_interrupted_staging_resumes_copying_only_the_rest(source: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "dst"
    real_copy = stage_copy.copy_file
    calls: list[str] = []

    def dies_on_fourth(src: Path, dst: Path, host: str, verify: bool, root=None):
        if len(calls) == 3:
            raise KeyboardInterrupt("killed half way")
        calls.append(src.name)
        return real_copy(src, dst, host, verify, root)

    monkeypatch.setattr(stage_copy, "copy_file", dies_on_fourth)
    with pytest.raises(KeyboardInterrupt):
        stage(source, dest, Runtime(), StageOptions(workers=1))
    assert not (dest / MANIFEST_NAME).exists()
    assert list(dest.glob(data_manifest.JOURNAL_PREFIX + "*"))  # the finished files are on record
    assert not [p for p in dest.rglob("*") if p.name.endswith(data_files.PART_SUFFIX)]

    monkeypatch.setattr(stage_copy, "copy_file", real_copy)
    copied: list[str] = []
    monkeypatch.setattr(stage_copy, "copy_file",
                        lambda s, d, h, v, r=None: (copied.append(s.name), real_copy(s, d, h, v, r))[1])
    result = stage(source, dest, Runtime(), StageOptions(workers=2))
    assert result.skipped_files == 3 and result.copied_files == len(SIZES) - 3
    assert sorted(copied + calls) == sorted(Path(rel).name for rel in SIZES)
    _assert_staged(source, dest)


def test_part_file_left_by_a_kill_is_not_trusted(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    (dest / MANIFEST_NAME).unlink()  # as if killed before the manifest was written
    (dest / "train/b.bin").unlink()
    (dest / "train" / f".b.bin.{socket.gethostname()}{data_files.PART_SUFFIX}").write_bytes(b"half")
    result = stage(source, dest, Runtime())
    assert result.copied_files == len(SIZES)  # no manifest, no journal: nothing is trusted
    _assert_staged(source, dest)


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "delete"])
def test_corrupted_destination_file_is_copied_again(source: Path, tmp_path: Path, damage: str) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    victim = dest / "train/a.bin"
    data = bytearray(victim.read_bytes())
    if damage == "flip_byte":
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    elif damage == "truncate":
        victim.write_bytes(bytes(data[:100]))
    else:
        victim.unlink()
    result = stage(source, dest, Runtime())
    assert (result.copied_files, result.copied_bytes) == (1, SIZES["train/a.bin"])
    assert result.skipped_files == len(SIZES) - 1
    _assert_staged(source, dest)


def test_bytes_that_land_wrong_are_caught_by_the_read_back(source: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    real_write = stage_copy.write_all

    def garbling_write(fd, data, path, src):  # a faulty device: one byte differs on disk
        if src.name == "a.bin":
            data = bytearray(data)
            data[7] ^= 0x01
            data = memoryview(data)
        real_write(fd, data, path, src)

    monkeypatch.setattr(stage_copy, "write_all", garbling_write)
    with pytest.raises(StagingError, match=r"\.a\.bin\..*mlhpc-part: staged copy does not read back as written"):
        stage(source, tmp_path / "dst", Runtime(), StageOptions(workers=2))
    assert not (tmp_path / "dst" / "train" / "a.bin").exists()  # never renamed into place


def test_changed_source_file_is_copied_again(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    (source / "README").write_bytes(b"new text, new size")
    result = stage(source, dest, Runtime(), StageOptions(verify=False))
    assert result.copied_files == 1 and (dest / "README").read_bytes() == b"new text, new size"
    _assert_staged(source, dest)


def test_enospc_names_the_file(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    dest = tmp_path / "dst"
    real_write = stage_copy.write_all

    def full_disk(fd, data, path, src):  # b.bin's bytes go to /dev/full: the kernel says ENOSPC
        if src.name == "b.bin":
            full = os.open("/dev/full", os.O_WRONLY)
            try:
                real_write(full, data, path, src)
            finally:
                os.close(full)
        real_write(fd, data, path, src)

    monkeypatch.setattr(stage_copy, "write_all", full_disk)
    with pytest.raises(StagingError, match=r"b\.bin.*destination full.*copying .*src/train/b\.bin"):
        stage(source, dest, Runtime(), StageOptions(workers=2))
    assert not (dest / MANIFEST_NAME).exists()


def test_unreadable_source_file_names_it(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    locked = source / "train/sub/e.bin"
    real_open = open

    def guarded_open(path, *args, **kwargs):  # root ignores mode bits, so refuse like the kernel
        if Path(path) == locked:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(stage_copy, "open", guarded_open, raising=False)
    with pytest.raises(StagingError, match=r"src/train/sub/e\.bin: cannot read source file \(permission denied\)"):
        stage(source, tmp_path / "dst", Runtime())


def test_read_error_in_the_middle_of_a_source_file_names_it(source: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    broken = source / "train/a.bin"
    real_open = open

    class FailingRead:  # opens fine; the second read fails as a bad sector would (EIO)
        def __init__(self, handle):
            self.handle, self.reads = handle, 0

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def fileno(self):
            return self.handle.fileno()

        def readinto(self, buf):
            self.reads += 1
            if self.reads == 2:
                raise OSError(errno.EIO, "Input/output error")
            return self.handle.readinto(buf)

    def opener(path, *args, **kwargs):
        handle = real_open(path, *args, **kwargs)
        return FailingRead(handle) if Path(path) == broken else handle

    monkeypatch.setattr(stage_copy, "open", opener, raising=False)
    with pytest.raises(StagingError, match=r"src/train/a\.bin: cannot read source file"):
        stage(source, tmp_path / "dst", Runtime(), StageOptions(workers=1))


def test_source_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match=r"nowhere: staging source folder not found"):
        stage(tmp_path / "nowhere", tmp_path / "dst", Runtime())
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    with pytest.raises(StagingError, match=r"empty: staging source folder holds no files"):
        stage(tmp_path / "empty", tmp_path / "dst", Runtime())


def test_destination_not_writable_or_inside_source(source: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(StagingError, match=r"a_file/dst: cannot write staged file"):
        stage(source, blocker / "dst", Runtime())
    with pytest.raises(StagingError, match=r"destination lies inside its source"):
        stage(source, source / "staged", Runtime())


def test_file_subset_and_bad_entries(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    result = stage(source, dest, Runtime(), StageOptions(files=[Path("README"), source / "validation/v0.bin"]))
    assert result.staged_files == 2 and sorted(read_manifest(dest)) == ["README", "validation/v0.bin"]
    with pytest.raises(StagingError, match=r"\.\./x: staging file list: expected a path inside"):
        stage(source, dest, Runtime(), StageOptions(files=[Path("../x")]))
    with pytest.raises(StagingError, match=r"nope\.bin: staging file list: source file not found"):
        stage(source, dest, Runtime(), StageOptions(files=[Path("train/nope.bin")]))


def test_default_dest_is_stable_and_distinct(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    rt = Runtime(rank=3, world_size=4, local_rank=1, local_world_size=2, launcher="slurm")
    a = default_dest(Path("/data/cosmo"), rt)
    assert a == default_dest(Path("/data/cosmo"), Runtime(launcher="slurm"))  # ranks agree
    assert a.parent == tmp_path and "-4242-" in a.name
    assert a != default_dest(Path("/data/deepcam"), rt)
    monkeypatch.delenv("SLURM_JOB_ID")
    assert "4242" not in default_dest(Path("/data/cosmo"), rt).name


def test_stage_dataset_follows_the_config(source: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from mlhpc.config import StagingConfig

    dest = tmp_path / "cfgdst"
    config = SimpleNamespace(data=SimpleNamespace(path=source, staging=StagingConfig(dest=dest, workers=2)))
    result = staging.stage_dataset(config, Runtime())
    assert isinstance(result, StagingResult) and result.dest == dest
    _assert_staged(source, dest)
    off = SimpleNamespace(data=SimpleNamespace(path=source, staging=StagingConfig(enabled=False)))
    assert staging.stage_dataset(off, Runtime()) is None


# ------------------------------------------------------------------------------------------
# two ranks on one node, coordinated by a Gloo process group


def _two_rank_worker(rank: int, port: int, source: str, tmp: str) -> None:
    """Stage twice: into ``tmp/ok`` cleanly, then into ``tmp/bad`` with v0.bin failing."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    rt = Runtime(rank=rank, world_size=2, local_rank=rank, local_world_size=2, launcher="torchrun")
    real_copy = stage_copy.copy_file
    reports = []
    for name, fail_name in (("ok", ""), ("bad", "v0.bin")):
        calls: list[str] = []

        def recording(src, dst, host, verify, root=None, calls=calls, fail_name=fail_name):
            calls.append(Path(src).name)
            if Path(src).name == fail_name:
                raise StagingError(f"{src}: injected failure")
            return real_copy(src, dst, host, verify, root)

        stage_copy.copy_file = recording
        report: dict = {"calls": calls}
        try:
            report["result"] = stage(Path(source), Path(tmp, name), rt, StageOptions(workers=2)).to_dict()
        except StagingError as exc:
            report["error"] = str(exc)
        reports.append(report)
    Path(tmp, f"rank{rank}.json").write_text(json.dumps(reports))
    dist.destroy_process_group()


def test_two_ranks_split_the_copy_agree_on_totals_and_share_errors(source: Path, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_two_rank_worker, args=(port, str(source), str(tmp_path)), nprocs=2,
                       join=True, start_method="spawn")
    (ok0, bad0), (ok1, bad1) = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]

    assert ok0["result"] == ok1["result"]  # same totals on every rank
    res = ok0["result"]
    assert (res["staged_files"], res["copied_files"], res["skipped_files"]) == (len(SIZES), len(SIZES), 0)
    assert res["per_node"][0]["ranks"] == [0, 1]
    assert ok0["calls"] and ok1["calls"] and not set(ok0["calls"]) & set(ok1["calls"])  # a real split
    _assert_staged(source, tmp_path / "ok")

    # the rank owning v0.bin fails; the other rank hears of it and raises too, naming the file
    assert "v0.bin: injected failure" in bad0["error"] and "v0.bin: injected failure" in bad1["error"]
    assert not (tmp_path / "bad" / MANIFEST_NAME).exists()


# ------------------------------------------------------------------------------------------
# sharded staging (issue 13) and a staged folder that is exactly the plan (issue 15.2)


def _sized(n_files: int, split: str = "train", size: int = 100) -> list[tuple[str, int]]:
    return [(f"{split}/f{i:03d}.h5", size) for i in range(n_files)]


@pytest.mark.parametrize("num_nodes", [1, 2, 3, 7])
def test_assign_shards_is_disjoint_covering_balanced_and_deterministic(num_nodes: int) -> None:
    sizes = [(f"train/u{i // 8:02d}_{i % 8}.h5", 1000 + 37 * (i % 5)) for i in range(61)]
    files = sizes + _sized(9, "validation", 500) + [("stats.h5", 10)]
    shares = assign_shards(files, num_nodes, seed=3)
    assert shares == assign_shards(list(reversed(files)), num_nodes, seed=3)  # order-free
    for split, members in (("train", sizes), ("validation", _sized(9, "validation", 500))):
        per_node = [[r for r in share if r.startswith(split + "/")] for share in shares]
        flat = [r for share in per_node for r in share]
        assert sorted(flat) == sorted(r for r, _ in members) and len(set(flat)) == len(flat)
        size = dict(members)
        total = sum(size.values())
        largest = max(size.values())
        for share in per_node:  # each node within one file of 1/N of the split's bytes
            assert abs(sum(size[r] for r in share) - total / num_nodes) <= largest
    assert all("stats.h5" in share for share in shares)  # shared files go to every node
    if num_nodes > 1:  # the seed permutes: names of one universe (u00_*) spread over nodes
        assert shares != assign_shards(files, num_nodes, seed=4)
        assert len({n for n, share in enumerate(shares) for r in share if r.startswith("train/u00_")}) > 1


def test_assign_shards_balances_bytes_not_files() -> None:
    files = [("train/big.h5", 9000)] + [(f"train/s{i}.h5", 1000) for i in range(9)]
    a, b = assign_shards(files, 2, seed=0)
    size = dict(files)
    assert sum(size[r] for r in a) == sum(size[r] for r in b) == 9000
    assert sorted([len(a), len(b)]) == [1, 9]  # the node holding big.h5 holds nothing else


def test_assign_shards_refuses_fewer_files_than_nodes() -> None:
    with pytest.raises(StagingError, match=r"validation/: 2 files cannot be sharded over 3 nodes"):
        assign_shards(_sized(6) + _sized(2, "validation"), 3, seed=0)
    assert assign_shards([("train/huge.h5", 10**6), ("train/tiny.h5", 1)], 2, seed=0) == \
        [["train/huge.h5"], ["train/tiny.h5"]]


def _tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.fixture()
def dataset(tmp_path: Path) -> Path:
    files = {f"train/t{i}.h5": os.urandom(1000 + i) for i in range(8)}
    files.update({f"validation/v{i}.h5": os.urandom(700 + i) for i in range(4)})
    files["stats.h5"] = b"stats"
    return _tree(tmp_path / "ds", files)


def test_two_nodes_stage_disjoint_shares_whose_union_is_the_dataset(dataset: Path, tmp_path: Path) -> None:
    staged = {}
    for node in range(2):
        rt = Runtime(node_rank=node, num_nodes=2)
        result = stage(dataset, tmp_path / f"n{node}", rt, StageOptions(shard=Shard(node, 2, seed=5)))
        assert result.shard == {"mode": "node", "num_nodes": 2, "seed": 5,
                                "splits": ["train", "validation"], "balance": "bytes"}
        doc = json.loads((tmp_path / f"n{node}" / MANIFEST_NAME).read_text())
        assert doc["shard"] == {**result.shard, "node_rank": node}  # recorded in the manifest
        staged[node] = set(read_manifest(tmp_path / f"n{node}"))
        on_disk = {p.relative_to(tmp_path / f"n{node}").as_posix()
                   for p in (tmp_path / f"n{node}").rglob("*") if p.is_file() and not p.name.startswith(".mlhpc")}
        assert on_disk == staged[node]
    everything = {p.relative_to(dataset).as_posix() for p in dataset.rglob("*") if p.is_file()}
    data = everything - {"stats.h5"}
    assert (staged[0] - {"stats.h5"}) & (staged[1] - {"stats.h5"}) == set()
    assert (staged[0] | staged[1]) == everything and {"stats.h5"} <= staged[0] & staged[1]
    assert all(any(r.startswith("validation/") for r in staged[n]) for n in range(2))
    assert len(data) == 12


def test_a_complete_shard_is_used_when_the_source_is_gone(dataset: Path, tmp_path: Path) -> None:
    dest = tmp_path / "n1"
    rt = Runtime(node_rank=1, num_nodes=2)
    first = stage(dataset, dest, rt, StageOptions(shard=Shard(1, 2, seed=0)))
    moved = tmp_path / "moved-away"
    dataset.rename(moved)
    again = stage(dataset, dest, rt, StageOptions(shard=Shard(1, 2, seed=0)))
    assert again.offline and again.copied_files == 0 and again.skipped_files == first.staged_files
    # another shard, or a damaged copy, needs the source: one line naming it
    with pytest.raises(StagingError, match=r"ds: staging source folder not found \(and .*n1 holds no complete"):
        stage(dataset, dest, rt, StageOptions(shard=Shard(0, 2, seed=0)))
    victim = sorted(read_manifest(dest))[0]
    (dest / victim).write_bytes(b"damaged")
    with pytest.raises(StagingError, match=r"cannot read source file \(not found\)"):
        stage(dataset, dest, rt, StageOptions(shard=Shard(1, 2, seed=0)))


def test_staged_folder_is_pruned_to_the_plan(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    (source / "train/b.bin").unlink()  # deleted from the source after staging
    result = stage(source, dest, Runtime())
    assert result.pruned_files == 1 and not (dest / "train/b.bin").exists()
    _assert_staged(source, dest)


def test_a_second_dataset_in_the_same_dest_does_not_train_on_the_union(source: Path, dataset: Path,
                                                                       tmp_path: Path) -> None:
    dest = tmp_path / "shared-dest"
    stage(source, dest, Runtime())
    result = stage(dataset, dest, Runtime())
    assert result.pruned_files == len(SIZES) - 0 and result.copied_files == 13
    _assert_staged(dataset, dest)
    assert sorted(p.name for p in (dest / "train").iterdir()) == [f"t{i}.h5" for i in range(8)]


def test_rewrite_keeping_size_and_mtime_is_noticed(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    victim = source / "train/b.bin"
    st = victim.stat()
    victim.write_bytes(bytes(reversed(victim.read_bytes())))  # same size, other bytes
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the old modification time
    assert victim.stat().st_size == st.st_size and victim.stat().st_mtime_ns == st.st_mtime_ns
    result = stage(source, dest, Runtime(), StageOptions(verify=False))
    assert result.copied_files == 1
    _assert_staged(source, dest)


def test_dest_with_foreign_files_is_refused(source: Path, tmp_path: Path) -> None:
    dest = _tree(tmp_path / "home", {"thesis.tex": b"precious"})
    with pytest.raises(StagingError, match=r"thesis\.tex: the staging destination .* holds files mlhpc did not stage"):
        stage(source, dest, Runtime())
    assert (dest / "thesis.tex").read_bytes() == b"precious"


def test_dest_placeholders_and_shard_default(source: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from mlhpc.config import StagingConfig

    rt = Runtime(rank=1, world_size=2, node_rank=1, num_nodes=2)
    assert staging.resolve_dest(tmp_path / "n{node_rank}-{hostname}", rt) == \
        tmp_path / f"n1-{socket.gethostname()}"
    with pytest.raises(StagingError, match=r"data\.staging\.dest: .*bad placeholder"):
        staging.resolve_dest("/x/{rank}", rt)
    config = SimpleNamespace(data=SimpleNamespace(path=source, staging=StagingConfig()),
                             train=SimpleNamespace(instances=1, seed=0))
    assert staging.shard_mode(config, rt) == "node" and staging.shard_mode(config, Runtime()) == "none"
    config.train.instances = 2
    assert staging.shard_mode(config, rt) == "none"
    assert default_dest(source, rt) != default_dest(source, Runtime(rank=0, world_size=2, num_nodes=2))


def test_staging_config_checks_placeholders() -> None:
    from mlhpc.config import StagingConfig
    from pydantic import ValidationError

    assert StagingConfig(dest="/dev/shm/mlhpc-{node_rank}").dest == Path("/dev/shm/mlhpc-{node_rank}")
    with pytest.raises(ValidationError, match=r"unknown placeholder \{rank\}"):
        StagingConfig(dest="/tmp/{rank}")
    with pytest.raises(ValidationError):
        StagingConfig(shard="rank")


def test_init_limit_warning() -> None:
    assert rules.init_limit_warning(29 * 60, "closed", "init") is None
    assert "allows 30 min" in rules.init_limit_warning(31 * 60, "closed", "init")
    assert rules.init_limit_warning(3 * 3600, "open", "init") is None
    assert "allows 240 min" in rules.init_limit_warning(5 * 3600, "open", "init")
    assert rules.init_limit_warning(5 * 3600, "closed", "run") is None


def test_node_summary(source: Path, tmp_path: Path) -> None:
    result = stage(source, tmp_path / "dst", Runtime())
    summary = result.to_dict()["nodes_summary"]
    assert summary["nodes"] == 1 and summary["slowest_node_s"] == result.elapsed_s
    assert summary["node_staged_bytes"] == [sum(SIZES.values())] == [summary["max_node_staged_bytes"]]


def test_staged_copy_present_says_whether_a_run_needs_the_source(source: Path, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from mlhpc.config import StagingConfig

    dest = tmp_path / "node{node_rank}"
    config = SimpleNamespace(workload="cosmoflow",
                             data=SimpleNamespace(path=source, staging=StagingConfig(dest=dest)),
                             train=SimpleNamespace(instances=1, seed=0))
    assert not staging.staged_copy_present(config, Runtime())  # nothing staged yet
    staging.stage_dataset(config, Runtime())
    assert staging.staged_copy_present(config, Runtime())
    # node 1 of 2 (a sharded plan) is not what node 0 staged unsharded
    assert not staging.staged_copy_present(config, Runtime(rank=1, world_size=2, node_rank=0, num_nodes=2))
    moved = source.rename(tmp_path / "moved")
    assert staging.staged_copy_present(config, Runtime())  # the source is not needed
    victim = next(p for p in (tmp_path / "node0").rglob("*") if p.is_file() and not p.name.startswith("."))
    victim.write_bytes(victim.read_bytes()[:-1])
    assert not staging.staged_copy_present(config, Runtime())  # a file lost a byte
    config.data.staging = StagingConfig(enabled=False, dest=dest)
    assert not staging.staged_copy_present(config, Runtime())
    assert moved.is_dir()
