"""Staging, the collective part: per-rank figures folded into per-node rows and job totals, and
the barriers and gathers by which every rank of a job hears of any rank's failure.
"""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mlhpc.errors import StagingError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.runtime import Runtime
from mlhpc.data.manifest import MANIFEST_NAME
from mlhpc.data.stage.job import Counts


@dataclass
class StagingResult:
    """What one staging did, the same on every rank.

    Attributes:
        source: the shared folder read from.
        dest: this node's folder written to (``data.staging.dest`` with its placeholders filled).
        staged_files / staged_bytes: files and bytes the nodes hold after staging, summed over
            nodes (with a sharded stage: the whole training and validation sets once, plus the
            shared files such as ``stats.h5`` once per node).
        copied_files / copied_bytes: files and bytes actually copied, summed over nodes.
        skipped_files: files already present and verified (resume), summed over nodes.
        pruned_files: files removed from the destinations because the plan does not hold them
            (an earlier dataset, a file deleted from the source), summed over nodes.
        elapsed_s: wall time of the slowest rank, barriers included.
        gb_per_s: ``copied_bytes / elapsed_s / 1e9``: aggregate copy bandwidth of the job (0 when
            nothing was copied).
        per_node: one dict per node, ordered by node rank: ``node_rank``, ``hostname``, ``ranks``,
            ``dest``, ``staged_files``, ``staged_bytes``, ``copied_files``, ``copied_bytes``,
            ``skipped_files``, ``pruned_files``, ``elapsed_s``, ``gb_per_s``.
        shard: ``None`` (every node holds everything) or the split, as recorded in each node's
            manifest: ``{"mode": "node", "num_nodes", "seed", "splits", "balance": "bytes"}``.
        offline: the source was not reachable and every node used its complete, verified copy.
        manifest: this node's manifest (``dest/.mlhpc-manifest.json``).
        to: ``"none"`` (files copied as they are) or the form the data files were converted to
            (``data.staging.to``). When converting, ``copied_files`` counts the source files
            converted (or copied) this time, ``copied_bytes`` the bytes they put in the
            destination, ``skipped_files`` the source files whose outputs were already in place,
            ``pruned_files`` the outputs removed because their source left the plan, and
            ``staged_files`` / ``staged_bytes`` the files the nodes hold (outputs, file lists,
            copied files).
        node_samples: with a sharded stage of a folder whose manifest counts every file's
            samples, per split the samples each node holds, ordered by node rank (the samplers'
            counts, `mlhpc.data.stage.plan.shard_samples`); None otherwise.
    """

    source: Path
    dest: Path
    staged_files: int
    staged_bytes: int
    copied_files: int
    copied_bytes: int
    skipped_files: int
    pruned_files: int
    elapsed_s: float
    gb_per_s: float
    per_node: list[dict[str, Any]] = field(default_factory=list)
    shard: Optional[dict[str, Any]] = None
    offline: bool = False
    manifest: Path = Path(MANIFEST_NAME)
    to: str = "none"
    node_samples: Optional[dict[str, list[int]]] = None

    def node_summary(self) -> dict[str, Any]:
        """Per-node figures for the run summary and the log: ``nodes``, ``slowest_node_s``,
        ``mean_node_s``, ``node_gb_per_s`` (copy bandwidth of each node, GB/s = 1e9 bytes/s),
        ``aggregate_gb_per_s``, ``node_staged_bytes`` (bytes each node holds),
        ``max_node_staged_bytes``."""
        nodes = self.per_node
        times = [n["elapsed_s"] for n in nodes]
        return {
            "nodes": len(nodes),
            "slowest_node_s": max(times, default=0.0),
            "mean_node_s": sum(times) / len(times) if times else 0.0,
            "node_gb_per_s": [n["gb_per_s"] for n in nodes],
            "aggregate_gb_per_s": self.gb_per_s,
            "node_staged_bytes": [n["staged_bytes"] for n in nodes],
            "max_node_staged_bytes": max((n["staged_bytes"] for n in nodes), default=0),
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON-able dict (paths as strings) for ``summary.json``, with `node_summary` under
        ``"nodes_summary"``."""
        out = asdict(self)
        for key in ("source", "dest", "manifest"):
            out[key] = str(out[key])
        out["nodes_summary"] = self.node_summary()
        return out


def dist_ready() -> bool:
    from mlhpc import runtime

    return runtime.group_ready()


def barrier() -> None:
    from mlhpc import runtime

    runtime.world_barrier()


def gather(payload: Any) -> list[Any]:
    """Every rank's ``payload`` (`mlhpc.runtime.all_gather`); an exception travels as
    ``{"error", "host"}``."""
    from mlhpc import runtime

    if isinstance(payload, BaseException):
        payload = {"error": str(payload) or type(payload).__name__, "host": socket.gethostname()}
    return runtime.all_gather(payload)


def raise_if_any(own: Optional[BaseException], gathered: list[Any], runtime: "Runtime") -> None:
    """Raise this rank's own failure, or the first other rank's as a StagingError, on every rank."""
    if own is not None:
        raise own
    for rank, item in enumerate(gathered):
        if isinstance(item, dict) and "error" in item:
            raise StagingError(f"staging failed on rank {rank} ({item['host']}): {item['error']}")


def row(runtime: "Runtime", host: str, dest: Path, counts: Counts, seconds: float,
         offline: bool) -> dict[str, Any]:
    return dict(rank=runtime.rank, node_rank=runtime.node_rank, local_rank=runtime.local_rank,
                hostname=host, dest=str(dest), elapsed_s=seconds, offline=offline, **asdict(counts))


def gather_rows(runtime: "Runtime", host: str, dest: Path, counts: Counts, seconds: float,
                 offline: bool) -> list[dict[str, Any]]:
    return [r for r in gather(row(runtime, host, dest, counts, seconds, offline)) if isinstance(r, dict)]


def result(source: Path, dest: Path, rows: list[dict[str, Any]],
            shard: Optional[dict[str, Any]], to: str = "none") -> StagingResult:
    """Fold per-rank rows into per-node rows and job totals."""
    nodes: dict[int, dict[str, Any]] = {}
    for row in rows:
        node = nodes.setdefault(row["node_rank"], {
            "node_rank": row["node_rank"], "hostname": row["hostname"], "dest": row["dest"],
            "ranks": [], "staged_files": 0, "staged_bytes": 0, "copied_files": 0,
            "copied_bytes": 0, "skipped_files": 0, "pruned_files": 0, "elapsed_s": 0.0})
        node["ranks"].append(row["rank"])
        node["elapsed_s"] = max(node["elapsed_s"], row["elapsed_s"])
        for key in ("copied_files", "copied_bytes", "skipped_files", "pruned_files"):
            node[key] += row[key]
        if row["local_rank"] == 0 or not node["staged_files"]:  # every rank planned the same node list
            node["staged_files"], node["staged_bytes"] = row["staged_files"], row["staged_bytes"]
    per_node = [nodes[k] for k in sorted(nodes)]
    for node in per_node:
        node["ranks"].sort()
        node["gb_per_s"] = node["copied_bytes"] / node["elapsed_s"] / 1e9 if node["elapsed_s"] > 0 else 0.0
    seconds = max((n["elapsed_s"] for n in per_node), default=0.0)
    copied_bytes = sum(n["copied_bytes"] for n in per_node)
    return StagingResult(
        source=source, dest=dest, staged_files=sum(n["staged_files"] for n in per_node),
        staged_bytes=sum(n["staged_bytes"] for n in per_node),
        copied_files=sum(n["copied_files"] for n in per_node), copied_bytes=copied_bytes,
        skipped_files=sum(n["skipped_files"] for n in per_node),
        pruned_files=sum(n["pruned_files"] for n in per_node), elapsed_s=seconds,
        gb_per_s=copied_bytes / seconds / 1e9 if seconds > 0 and copied_bytes else 0.0,
        per_node=per_node, shard=shard, offline=bool(rows) and all(r["offline"] for r in rows),
        manifest=dest / MANIFEST_NAME, to=to)
