"""Staging: a dataset copied (or converted) from shared storage to node-local storage.

One job per file: `plan` (what this node stages: the source walked without following a link
out of it, the per-node shard), `dest` (destination safety: ownership, modes, claiming and
pruning), `copy` and `convert` (the two strategies, chosen once per staging), `collective` (the
per-node and per-job agreement over ``torch.distributed``) and `run` (the staging itself and the
config-driven `stage_dataset`). The manifest and journals live in `mlhpc.data.manifest`, file
primitives in `mlhpc.data.files`, the MLPerf HPC rules about when staging is timed in
`mlhpc.rules`. See docs/architecture.md, "The data layer".
"""

from mlhpc.data.manifest import MANIFEST_NAME, read_manifest
from mlhpc.data.stage.collective import StagingResult
from mlhpc.data.stage.job import StageOptions
from mlhpc.data.stage.plan import (
           Shard,
           assign_shards,
           default_dest,
           resolve_dest,
           shard_mode,
           staging_dest,
)
from mlhpc.data.stage.run import stage, stage_dataset, staged_copy_present

__all__ = ["MANIFEST_NAME", "Shard", "StageOptions", "StagingResult", "assign_shards", "default_dest",
           "read_manifest", "resolve_dest", "shard_mode", "stage", "stage_dataset", "staged_copy_present",
           "staging_dest"]
