"""Staging, step one: the plan of what this node stages.

Every regular file under the source (walked by `mlhpc.data.inputs.walk_files`, never following a
link out of it; mlhpc's own state files at the top left out), or the paths of a file list (a
path listed twice refused), with each file's identity (size, mtime, ctime, inode); with
``data.staging.shard: node`` only this node's share (`assign_shards`). The source must be a
complete dataset (`mlhpc.data.manifest.require_complete`) and may not contain the destination,
nor lie inside it.
"""

from __future__ import annotations

import hashlib
import os
import socket
import stat
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from mlhpc.errors import StagingError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime
from mlhpc.data.files import reason, safe_name
from mlhpc.data.inputs import walk_files
from mlhpc.data.manifest import (
    IDENTITY,
    converted_doc,
    load,
    require_complete,
    valid_entry,
)
from mlhpc.data.partition import partition
from mlhpc.data.stage.job import Copy
from mlhpc.data.trees import is_under, refuse_overlap, resolved


@dataclass(frozen=True)
class Shard:
    """Which share of the dataset this node stages (``data.staging.shard: node``).

    The files of each folder in ``splits`` are put in sorted order, permuted once with ``seed``
    (sorted names put the 64 sub-volumes of one CosmoFlow universe side by side, so contiguous
    shares would give a node few universes), and dealt to ``num_nodes`` shares of about equal
    bytes (`assign_shards`). Files outside ``splits`` (``stats.h5``, a README) are staged
    whole on every node. The split depends only on the file list, ``num_nodes`` and ``seed``, so
    every node computes the same one without talking, and a later run finds it in the manifest.
    """

    node_rank: int
    num_nodes: int
    seed: int
    splits: tuple[str, ...] = ("train", "validation")
    #: The workload's `mlhpc.workload.DataTools.file_group`: files that stay on one node.
    group: Optional[Callable[[str], str]] = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The job-wide description recorded in every node's manifest (node rank apart)."""
        return {"mode": "node", "num_nodes": self.num_nodes, "seed": self.seed,
                "splits": list(self.splits), "balance": "bytes"}


def assign_shards(files: Sequence[tuple[str, int]], num_nodes: int, seed: int,
                  splits: Sequence[str] = ("train", "validation"),
                  group: Callable[[str], str] | None = None) -> list[list[str]]:
    """Split ``files`` (``(relative POSIX path, size in bytes)``) over ``num_nodes`` nodes.

    Each folder named in ``splits`` is split on its own, by the partition rule
    (`mlhpc.data.partition.partition`): its files, gathered into the groups ``group`` names
    (``group(path within the split) -> key``, a workload's `mlhpc.workload.DataTools.file_group`:
    files a sample reads together land on one node; default: each file alone) and sorted by
    their first path, are permuted with ``random.Random(f"{seed}:{split}")``, then dealt largest
    first (equal sizes in the permuted order) each to the node holding the fewest bytes so far
    (longest-processing-time scheduling). Each node so holds about ``1/N`` of the split's bytes
    (within one group of it); the shares are disjoint and cover the split; with files of one
    size the deal is round-robin over the permuted order, so the files of one universe spread
    over the nodes. Every other file goes to every node.

    Returns:
        ``num_nodes`` lists of relative paths, sorted.

    Raises:
        StagingError: a split holds files, but fewer groups than ``num_nodes`` (a node would get
            none); ``num_nodes < 1``.
    """
    if num_nodes < 1:
        raise StagingError(f"staging shard: expected at least 1 node, got {num_nodes}")
    shares: list[list[str]] = [[] for _ in range(num_nodes)]
    by_split: dict[str, dict[str, list[tuple[str, int]]]] = {split: {} for split in splits}
    for rel, size in sorted(files):
        top, _, inner = rel.partition("/")
        if inner and top in by_split:
            key = group(inner) if group is not None else inner
            by_split[top].setdefault(key, []).append((rel, size))
        else:
            for share in shares:
                share.append(rel)
    for split, groups in by_split.items():
        if not groups:
            continue
        if len(groups) < num_nodes:
            raise StagingError(f"{split}/: {len(groups)} files cannot be sharded over {num_nodes} "
                               "nodes (each node needs at least one); set data.staging.shard: none "
                               "or write the split in more files")
        members = sorted(groups.values())
        dealt = partition([sum(size for _, size in m) for m in members], num_nodes,
                          f"{seed}:{split}", [len(m) for m in members] if group is not None else None)
        for node, indices in enumerate(dealt):
            shares[node] += [rel for i in indices for rel, _ in members[i]]
    for n, share in enumerate(shares):
        for split, groups in by_split.items():
            if groups and not any(rel.startswith(split + "/") for rel in share):
                raise StagingError(f"{split}/: node {n} of {num_nodes} gets no file (a few files "
                                   "hold most of the bytes); set data.staging.shard: none")
    return [sorted(share) for share in shares]


def shard_samples(source: Path, shard: Optional[Shard]) -> Optional[dict[str, list[int]]]:
    """Per split of ``shard``, the samples each node holds after staging ``source`` with it, by
    node rank: the source manifest's per-file ``samples`` summed over each node's share
    (`assign_shards` over the manifest's files). None without a shard, without a complete
    manifest, or when a file of a split has no sample count (data synthesised or staged
    without one)."""
    doc = load(source) if shard is not None else None
    if shard is None or doc is None:
        return None
    counted = {e["path"]: e.get("samples") for e in doc["files"]
               if "/" in e["path"] and e["path"].split("/", 1)[0] in shard.splits}
    if not counted or not all(type(n) is int for n in counted.values()):
        return None
    shares = assign_shards([(e["path"], e["bytes"]) for e in doc["files"]], shard.num_nodes,
                           shard.seed, shard.splits, shard.group)
    return {split: [sum(counted.get(rel, 0) for rel in share if rel.startswith(split + "/"))
                    for share in shares] for split in shard.splits}


def resolve_dest(template: "Path | str", runtime: "Runtime") -> Path:
    """``data.staging.dest`` with ``{node_rank}`` and ``{hostname}`` filled for this node.

    Raises:
        StagingError: the template names another placeholder or has an unmatched brace.
    """
    text = str(template)
    try:
        return Path(text.format(node_rank=runtime.node_rank, hostname=socket.gethostname()))
    except (KeyError, IndexError, ValueError) as exc:
        raise StagingError(f"data.staging.dest: {text!r}: bad placeholder ({exc}); only "
                           "{node_rank} and {hostname} are filled") from None


@dataclass(frozen=True)
class Planned:
    rel: str  # POSIX relative path under source and dest
    size_bytes: int
    mtime_ns: int
    ctime_ns: int = 0  # inode change time: moves on any rewrite, even one that restores the mtime
    ino: int = 0
    convert: bool = False  # data.staging.to: a data file the workload converts (else copied)


def default_dest(source: Path, runtime: "Runtime") -> Path:
    """The node-local folder a dataset is staged to when the config names none.

    ``$TMPDIR`` (else ``/tmp``) / ``mlhpc-<user>-<job id>-<12 hex of SHA-256(resolved source)>``;
    the job id is ``SLURM_JOB_ID`` (or ``TORCHELASTIC_RUN_ID`` under torchrun) and is left out
    when there is none; ``-node<N>`` ends it when the job spans several nodes. Every input is
    the same for all ranks of a node, so they agree without talking; two datasets, two users or
    two jobs never share a folder.

    Args:
        source: the shared dataset folder.
        runtime: this process's place in the job (its launcher picks the job-id variable).
    """
    base = Path(os.environ.get("TMPDIR") or "/tmp")
    try:
        import getpass

        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in some containers
        user = str(os.getuid())
    job = os.environ.get("SLURM_JOB_ID", "")
    if runtime.launcher == "torchrun" and not job:
        job = os.environ.get("TORCHELASTIC_RUN_ID", "")
    digest = hashlib.sha256(str(Path(source).resolve()).encode()).hexdigest()[:12]
    parts = ["mlhpc", safe_name(user)] + ([safe_name(job)] if job else []) + [digest]
    if runtime.num_nodes > 1:  # nodes sharing one file system (or one machine) never collide
        parts.append(f"node{runtime.node_rank}")
    return base / "-".join(parts)


def shard_mode(config: "Config", runtime: "Runtime") -> str:
    """``"node"`` or ``"none"``: ``data.staging.shard``, or its default (``node`` when the job
    spans several nodes and trains one model; ``none`` otherwise)."""
    chosen = config.data.staging.shard
    if chosen is not None:
        return chosen
    return "node" if runtime.num_nodes > 1 and config.train.instances == 1 else "none"


def staging_dest(config: "Config", runtime: "Runtime") -> Path:
    """This node's staging folder: ``data.staging.dest`` with its placeholders filled
    (`resolve_dest`), else `default_dest`."""
    options = config.data.staging
    source = Path(config.data.path)
    return resolve_dest(options.dest, runtime) if options.dest is not None else default_dest(source, runtime)


def is_state_file(rel: str) -> bool:
    """Whether ``rel`` is one of mlhpc's own files at the top of a folder (manifest, journals,
    lock, marker): never staged as data, never pruned."""
    return "/" not in rel and rel.startswith(".mlhpc")


def _plan(source: Path, dest: Optional[Path], files: Optional[list[Path]],
          follow_links: bool = False) -> list[Planned]:
    if not source.is_dir():
        what = "is not a folder" if source.exists() else "not found"
        raise StagingError(f"{source}: staging source folder {what}")
    if dest is not None:
        refuse_overlap(source, dest, "staging", StagingError)
    require_complete(source, StagingError)
    if files is None:
        plan = [Planned(rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
                for rel, st in walk_files(source, StagingError, follow_links) if not is_state_file(rel)]
        if not plan:
            raise StagingError(f"{source}: staging source folder holds no files")
        return sorted(plan, key=lambda p: p.rel)
    plan = [_listed(source, Path(item), follow_links) for item in files]
    if not plan:
        raise StagingError(f"{source}: staging file list is empty")
    seen: set[str] = set()
    for item in plan:
        if item.rel in seen:
            raise StagingError(f"{source / item.rel}: staging file list names this file twice (each "
                               "datum must appear exactly once per epoch)")
        seen.add(item.rel)
    return sorted(plan, key=lambda p: p.rel)


def _listed(source: Path, item: Path, follow_links: bool) -> Planned:
    """The plan entry of one path of a staging file list. Raises StagingError."""
    rel = item.relative_to(source) if item.is_absolute() and is_under(item, source) else item
    if rel.is_absolute() or ".." in rel.parts or str(rel) in ("", "."):
        raise StagingError(f"{item}: staging file list: expected a path inside {source}")
    path = source / rel
    try:
        if path.is_symlink() and (not follow_links or not is_under(resolved(path), resolved(source))):
            raise StagingError(f"{path}: staging file list: a symbolic link (to {os.readlink(path)}); "
                               "links out of the source are never followed")
        st = os.stat(path)
    except OSError as exc:
        raise StagingError(f"{path}: staging file list: source file {reason(exc)}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StagingError(f"{path}: staging file list: not a regular file")
    return Planned(rel.as_posix(), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def plan_node(job: Copy, files: Optional[list[Path]],
              shard: Optional[Shard]) -> tuple[list[Planned], bool]:
    """This node's plan and whether it comes from the manifest (source unreachable)."""
    source, dest = job.source, job.dest
    if not source.exists():
        plan = plan_from_manifest(dest, source, shard)
        if plan is None:
            raise StagingError(f"{source}: staging source folder not found (and {dest} holds no "
                               "complete staged copy of it)")
        return plan, True
    plan = _plan(source, dest, files, job.follow_links)
    if shard is not None:
        mine = set(assign_shards([(p.rel, p.size_bytes) for p in plan], shard.num_nodes, shard.seed,
                                 shard.splits, shard.group)[shard.node_rank])
        plan = [p for p in plan if p.rel in mine]
    return plan, False


def plan_from_manifest(dest: Path, source: Path, shard: Optional[Shard]) -> Optional[list[Planned]]:
    """The plan recorded by a finished staging of ``source`` (and ``shard``) at ``dest``."""
    doc = load(dest)
    if doc is None:
        return None
    wanted = None if shard is None else {**shard.to_dict(), "node_rank": shard.node_rank}
    if doc.get("kind") != "stage" \
            or doc.get("source") != str(source.absolute()) and doc.get("source") != str(resolved(source)) \
            or doc.get("shard") != wanted or doc.get("to", "none") != "none":
        return None
    entries = doc.get("files")
    if not isinstance(entries, list) or not entries or not all(valid_entry(e) for e in entries):
        return None
    return [Planned(e["path"], e["bytes"], e["source_mtime_ns"], e["source_ctime_ns"],
                     e["source_ino"]) for e in entries]


def order(plan: list[Planned]) -> list[Planned]:
    """Largest first (ties by path): strided shares are even in bytes, big files start early."""
    return sorted(plan, key=lambda p: (-p.size_bytes, p.rel))


def plan_convert(job: Copy, files: Optional[list[Path]],
                  shard: Optional[Shard]) -> tuple[list[Planned], bool]:
    """This node's sources to convert (the data files of ``train/`` and ``validation/`` the
    workload lists) and to copy (files outside the splits), and whether the plan comes from the
    manifest (source unreachable). Sets ``job.convert.fmt`` to the source's form.

    Raises:
        StagingError: the source is gone and ``dest`` holds no complete conversion of it.
        DataError: the workload cannot tell the source's form.
    """
    from mlhpc.data import formats

    conv = job.convert
    assert conv is not None
    if not job.source.exists():
        doc = converted_doc(job.dest, job.source, shard, conv.to)
        if doc is None:
            raise StagingError(f"{job.source}: staging source folder not found (and {job.dest} "
                               f"holds no complete staged conversion of it to {conv.to})")
        conv.fmt = doc["from"]
        return [Planned(e["path"], e["bytes"], *(e[k] for k in IDENTITY), e["convert"])
                for e in doc["sources"]], True
    everything = _plan(job.source, job.dest, files, job.follow_links)
    conv.fmt = formats.detect(conv.tools, job.source)
    splits = formats.split_dirs(conv.tools, job.source)
    data = {f"{split}/{Path(p).relative_to(job.source / split).as_posix()}"
            for split in splits for p in conv.tools.list_files(job.source / split, conv.fmt)}
    plan = [replace(p, convert=True) if p.rel in data else p for p in everything
            if p.rel in data or p.rel.split("/", 1)[0] not in splits or "/" not in p.rel]
    if shard is not None:
        mine = set(assign_shards([(p.rel, p.size_bytes) for p in plan], shard.num_nodes, shard.seed,
                                 shard.splits, shard.group)[shard.node_rank])
        plan = [p for p in plan if p.rel in mine]
    return plan, False
