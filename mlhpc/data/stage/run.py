"""Staging, the run: plan and claim, the chosen strategy (copy or convert) alone or coordinated
across the ranks of a node, then the manifest and the prune; and `stage_dataset`, the one
config-driven staging used by ``mlhpc run`` and ``mlhpc stage``.

MLPerf HPC v3.0 lets a submission stage its dataset to node-local storage before the timed run
starts, and asks that staging be timed and reported on its own (``staging_start``/``staging_stop``);
`mlhpc.rules` says which ruleset times it inside the run.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from mlhpc.errors import StagingError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime
from mlhpc.data.locks import node_lock
from mlhpc.data.manifest import (
    converted_doc,
    read_convert_state,
    read_state,
    write_manifest,
)
from mlhpc.data.stage.collective import (
    StagingResult,
    barrier,
    dist_ready,
    gather,
    gather_rows,
    raise_if_any,
    result,
    row,
)
from mlhpc.data.stage.convert import convert_share, record_converted
from mlhpc.data.stage.copies import hold
from mlhpc.data.stage.copy import copy_share
from mlhpc.data.stage.dest import claim_dest, prune, record_claim
from mlhpc.data.stage.job import Convert, Copy, Counts, StageOptions
from mlhpc.data.stage.plan import (
    Planned,
    Shard,
    order,
    plan_convert,
    plan_from_manifest,
    plan_node,
    shard_mode,
    shard_samples,
    staging_dest,
)


def stage(source: Path, dest: Path, runtime: "Runtime",
          options: StageOptions | None = None) -> StagingResult:
    """Copy ``options.files`` (default: every regular file) of ``source`` to node-local ``dest``.

    Called on every rank of the job; the ranks of a node split the node's files and each rank
    copies its share with ``workers`` threads. With ``shard``, a node plans only its share of the
    training and validation files (`Shard`, `assign_shards`). Resumes an interrupted staging (see
    the module docstring). Afterwards ``dest`` holds exactly the planned files: anything else in
    it (an earlier dataset staged to the same folder, a file since deleted from the source) is
    removed, so a loader that reads every file of ``dest`` reads the plan and nothing more.

    When ``source`` is not reachable and ``dest`` holds a complete manifest of this source (and
    this shard), the files are verified against it (sizes; with ``verify`` also checksums) and
    used without the source: a site can stage in one job step and train in the next after the
    shared copy is gone.

    Args:
        source: shared dataset folder; only read.
        dest: node-local folder; created if missing. Must not lie inside ``source``, and must be
            empty or an mlhpc staging folder (staging prunes it to the plan).
        runtime: this process's place in the job (``local_rank``, ``local_world_size``,
            ``node_rank``).
        options: how it stages (`StageOptions`: workers, files, verify, shard, to, tools,
            follow_links); None: its defaults.

    Returns:
        a `StagingResult`, the same on every rank when ``torch.distributed`` is initialised.

    Raises:
        StagingError: the source folder is missing (and no complete staged copy is at ``dest``)
            or holds no file; a listed file is missing, outside ``source`` or not a regular file;
            a split has fewer files than nodes; a source file cannot be read; the destination is
            not writable, is full (ENOSPC), or holds files mlhpc did not stage; a copied file does
            not read back with the source's checksum. The message names the file. With a process
            group the error is raised on every rank.
        DataError: (converting) the source's form cannot be told, or a source file is
            malformed (the workload's converter names the file and record).
    """
    options = options if options is not None else StageOptions()
    job = _job(Path(source), Path(dest), options)
    files, shard, to = options.files, options.shard, options.to
    coordinated = runtime.distributed and dist_ready()
    t0 = time.perf_counter()
    counts = Counts()
    plan, offline, failure = _plan_and_claim(job, files, shard, counts)
    if coordinated:
        _stage_coordinated(job, runtime, plan, counts, failure)
        rows = gather_rows(runtime, job.host, job.dest, counts, time.perf_counter() - t0, offline)
    else:
        if failure is not None:
            raise failure
        _stage_alone(job, plan, counts)
        rows = [row(runtime, job.host, job.dest, counts, time.perf_counter() - t0, offline)]
    staged = result(job.source, job.dest, rows, None if shard is None else shard.to_dict(), to)
    if files is None and to == "none" and not staged.offline:  # the plan is the manifest's files
        staged = replace(staged, node_samples=shard_samples(job.source, shard))
    return staged


def _job(source: Path, dest: Path, opts: StageOptions) -> Copy:
    """The `Copy` every rank works from. Raises StagingError on bad options."""
    if opts.workers < 1:
        raise StagingError(f"staging workers: expected at least 1, got {opts.workers}")
    convert = None
    if opts.to != "none":
        if opts.tools is None:
            raise StagingError(f"staging to {opts.to!r}: no data tools given to convert with")
        if opts.to not in opts.tools.convert_to:
            raise StagingError(f"data.staging.to: {opts.to!r}: expected none or one of "
                               f"{', '.join(opts.tools.convert_to)}")
        convert = Convert(opts.tools, opts.to)
    shard = opts.shard
    return Copy(source, dest, opts.workers, opts.verify, socket.gethostname(),
                None if shard is None else {**shard.to_dict(), "node_rank": shard.node_rank}, convert,
                opts.follow_links)


def _plan_and_claim(job: Copy, files: Optional[list[Path]], shard: Optional[Shard],
                    counts: Counts) -> tuple[list[Planned], bool, Optional[BaseException]]:
    """``(plan, offline, None)`` with the plan counted and ``dest`` claimed, or ``([], False,
    failure)``: a rank's failure is held until the other ranks hear of it."""
    try:
        if job.convert is not None:
            plan, offline = plan_convert(job, files, shard)
        else:
            plan, offline = plan_node(job, files, shard)
            counts.staged_files = len(plan)
            counts.staged_bytes = sum(p.size_bytes for p in plan)
        claim_dest(job.dest)
    except BaseException as exc:  # noqa: BLE001 - re-raised by the caller, after the other ranks hear
        return [], False, exc
    return plan, offline, None


def _stage_alone(job: Copy, plan: list[Planned], counts: Counts) -> None:
    """One process staging without a process group (ranks of a node take turns on a file lock):
    copy the whole plan, write its manifest and prune ``dest`` to it."""
    with node_lock(job.dest):
        _work_share(job, order(plan), _state(job), counts)
        _record(job, plan, counts)


def _record(job: Copy, plan: list[Planned], counts: Counts) -> None:
    """The manifest of ``plan`` from every journal, and ``dest`` pruned to ``plan``."""
    if job.convert is not None:
        record_converted(job, plan, counts)
    else:
        counts.pruned_files = prune(job.dest, plan)
        write_manifest(job.dest, job.source, plan, read_state(job.dest, job.source), job.shard_doc)
    record_claim(job.dest)


def _stage_coordinated(job: Copy, runtime: "Runtime", plan: list[Planned], counts: Counts,
                       failure: Optional[BaseException]) -> None:
    """Every rank of a process group copies its share of the node's plan; local rank 0 writes
    the manifest and prunes. After each step every rank hears of any rank's failure and raises."""
    raise_if_any(failure, gather(None if failure is None else failure), runtime)
    known = _state(job)
    barrier()  # every rank has read the old state before anyone writes a new journal
    share = order(plan)[runtime.local_rank::runtime.local_world_size]
    try:
        _work_share(job, share, known, counts)
    except BaseException as exc:  # noqa: BLE001 - re-raised below, after the other ranks hear
        failure = exc
    raise_if_any(failure, gather(failure), runtime)
    if runtime.local_rank == 0:
        try:
            _record(job, plan, counts)
        except BaseException as exc:  # noqa: BLE001
            failure = exc
    raise_if_any(failure, gather(failure), runtime)


def stage_dataset(config: "Config", runtime: "Runtime") -> Optional[StagingResult]:
    """Stage ``config.data.path`` as ``config.data.staging`` asks; ``None`` when disabled.

    This is the project's only staging function: ``mlhpc run`` and ``mlhpc stage`` both call
    it, so a separate stage step leaves exactly what a run's own staging would (and the run then
    finds it complete and copies nothing). ``staging.shard`` (`shard_mode`): ``node`` stages on
    node ``n`` of ``N`` its share of the split folders (`node_shard`, `Shard`, permuted with
    ``train.seed``); ``none`` stages everything on every node. ``staging.dest``: see
    `staging_dest`. ``staging.to``: convert the data files with the data tools of
    ``config.workload`` (`mlhpc.data.formats.DataTools`) instead of copying them; the run's reader
    then finds the converted form by detection.

    Raises:
        StagingError: as `stage`; ``shard: node`` with ``train.instances > 1``.
        ConfigError: ``staging.to`` names a form the workload does not write, or ``data.format``
            names a form other than ``auto`` or ``staging.to`` (the run reads the converted copy).
        DataError: as `stage`, when converting.
    """
    options = config.data.staging
    if not options.enabled:
        return None
    source = Path(config.data.path)
    if shard_mode(config, runtime) == "node" and config.train.instances > 1:
        raise StagingError("data.staging.shard: node stages one share per node of one model; "
                           "with train.instances > 1 each instance needs the whole dataset "
                           "(set data.staging.shard: none)")
    shard = node_shard(config, runtime)
    to = options.to
    tools = _conversion_tools(config) if to != "none" else None
    staged = stage(source, staging_dest(config, runtime), runtime, StageOptions(
        workers=options.workers, verify=options.verify, shard=shard, to=to, tools=tools,
        follow_links=options.follow_links))
    hold(staged.dest)  # read from now on: not removed under this process (`copies.release`)
    return staged


def node_shard(config: "Config", runtime: "Runtime") -> Optional[Shard]:
    """This node's `Shard` when ``staging.shard`` is ``node`` (`shard_mode`), else None. Its
    split folders are the ones the workload's data tools name (``find_splits``, e.g. OC20's
    ``train`` and ``val_id``) in ``data.path``, or in this node's copy when the source is gone;
    ``train`` and ``validation`` for a workload without ``find_splits``. A split folder the
    shard does not name would be staged whole on every node and read once per node. The files
    the tools keep together (``file_group``) are dealt to one node together."""
    from mlhpc.errors import MlhpcError
    from mlhpc.workload import get as get_workload

    if shard_mode(config, runtime) != "node":
        return None
    try:
        tools = get_workload(config.workload).data_tools
    except MlhpcError:
        tools = None
    shard = Shard(runtime.node_rank, runtime.num_nodes, config.train.seed,
                  group=None if tools is None else tools.file_group)
    names = _split_names(config, runtime, tools)
    return shard if names is None else replace(shard, splits=names)


def _split_names(config: "Config", runtime: "Runtime", tools: Any) -> Optional[tuple[str, ...]]:
    """The split folders the workload's data ``tools`` name (``find_splits``) in ``data.path``
    or in this node's copy (`node_shard`); None where it declares no tools or no root answers
    (`Shard`'s default splits then)."""
    from mlhpc.errors import MlhpcError

    try:
        roots = [Path(config.data.path), staging_dest(config, runtime)]
    except MlhpcError:
        return None
    for root in roots if tools is not None else []:
        if root.is_dir():
            try:
                return tuple(tools.find_splits(root))
            except MlhpcError:
                continue
    return None


def _conversion_tools(config: "Config") -> Any:
    """The data tools of ``config.workload`` for ``data.staging.to``, after checking the form.

    Raises:
        ConfigError: the workload does not write ``to``; ``data.format`` is neither ``auto`` nor
            ``to``; the workload is unknown.
        DataError: the workload declares no data tools.
    """
    from mlhpc.data import formats
    from mlhpc.errors import ConfigError
    from mlhpc.workload import get as get_workload

    to = config.data.staging.to
    tools = formats.tools_of(get_workload(config.workload))
    if to not in tools.convert_to:
        raise ConfigError(f"data.staging.to: {to!r}: workload {config.workload!r} converts to "
                          f"{', '.join(tools.convert_to)} (or none: copy as is)")
    fmt = config.data.format
    if fmt not in ("auto", to):
        raise ConfigError(f"data.format: {fmt!r} with data.staging.to: {to!r}: the run reads the "
                          f"converted copy; set data.format: auto (or {to})")
    return tools


def staged_copy_present(config: "Config", runtime: "Runtime") -> bool:
    """Whether this node's staging folder (`staging_dest`) holds the complete copy a run of
    ``config`` would stage here: a finished manifest of ``data.path`` for this node's shard
    (`shard_mode`) whose every file is on disk with its recorded size. Checksums are not read
    here; `stage_dataset` verifies them when it uses the copy. ``False`` when staging is disabled.

    A run uses this to know that it does not need the source (`mlhpc.data.ready.ensure_source`): after ``mlhpc stage``
    in one job step the shared copy may be gone in the next.
    """
    options = config.data.staging
    if not options.enabled:
        return False
    shard = node_shard(config, runtime)
    try:
        dest = staging_dest(config, runtime)
    except StagingError:
        return False
    to = options.to
    if to != "none":
        doc = converted_doc(dest, Path(config.data.path), shard, to)
        if doc is None:
            return False
        plan = [Planned(e["path"], e["bytes"], 0) for e in doc["files"]]
    else:
        plan = plan_from_manifest(dest, Path(config.data.path), shard)
    if plan is None:
        return False
    for item in plan:
        try:
            if os.stat(dest / item.rel).st_size != item.size_bytes:
                return False
        except OSError:
            return False
    return True


def _state(job: Copy) -> dict[str, dict[str, Any]]:
    """What earlier stagings recorded at ``job.dest``: copies, or conversions to ``job``'s form."""
    if job.convert is None:
        return read_state(job.dest, job.source)
    return read_convert_state(job.dest, job.source, job.convert.to)


def _work_share(job: Copy, share: list[Planned], known: dict[str, dict[str, Any]],
                counts: Counts) -> None:
    """`copy_share`, or `convert_share` when ``data.staging.to`` is set."""
    if job.convert is None:
        copy_share(job, share, known, counts)
    else:
        convert_share(job, share, known, counts)
