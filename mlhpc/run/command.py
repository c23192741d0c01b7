"""``mlhpc run`` as a library call: the run in one straight line, and what the command composes
around it.

    run(config): the checkpoint to resume chosen from the folder's logs (`mlhpc.run.resume`)
      -> the output folder checked -> runtime.started: the job's ranks and this instance's share
      -> the batch checked against the ranks -> data.ready.ensure_source: the embedded data made where
         missing (untimed, before the log) -> Job (frozen)
      -> the run's stages (`mlhpc.run.train`): seeded_model, attempt (init_start ..),
         prepare (.. run_start), Run and train_loop (.. run_stop), finish: the run's own files
         (result, measured, config, env); the staged copy let go
      -> summary_of: ``summary_N.json``, the log and its side file read back through the log
         reader (`mlhpc.log`) as ``mlhpc report`` reads them
      -> agree: every rank leaves with the job's exit status (`mlhpc.run.outcome.agree`)

The CLI then records the run in the results store. The run's stages (`mlhpc.run.train`) read no
earlier log, make no data and summarise nothing: the run begins at its log and ends at its files
(docs/architecture.md, "The layers").
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlhpc import runtime
from mlhpc.config import Config
from mlhpc.data import ready
from mlhpc.data.stage.copies import release
from mlhpc.data.inputs import read_text_input
from mlhpc.errors import LogFormatError
from mlhpc.log.summary import read_summary
from mlhpc.power.sampler import sampling
from mlhpc.run import result as results
from mlhpc.run.assemble import seeded_model, sources_named
from mlhpc.run.job import Job, ProgressFn
from mlhpc.run.outcome import Stop, agree, finish
from mlhpc.run.result import RunFiles, RunResult, check_output_dir
from mlhpc.run.resume import load_resume
from mlhpc.run.train import Clock, Run, attempt, local_batch_size, prepare, train_loop
from mlhpc.workload import get as get_workload

__all__ = ["run", "summary_of"]


def run(config: Config | None, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the run's files on rank 0.

    With ``resume_dir`` (a run folder or a ``checkpoint_N.pt``), continue the run stopped there
    (``config`` is then taken from its checkpoint and may be None; `mlhpc.run.checkpoint` says
    what a resumed run is worth). Returns this rank's instance's `RunResult`, with the summary
    on the rank that wrote the log.

    Everything that can be checked without reading the dataset is checked before
    ``result_N.txt`` is opened: the config and output folder, then the model, built once here
    (`seeded_model`; a checkpoint being resumed must fit it). Whether the data fit the model is
    checked after ``init_start`` (`build`, `check_sample`): MLPerf's training rules
    (training_rules.adoc, "Run Results"): "The clock must start before any part of the system
    touches the dataset", and the log is where that start is shown. An attempt that fails (or
    is signalled) before ``run_start`` has its log moved to ``<output.dir>/failed/`` and named
    in the error, so it never counts as a run of the folder; one that fails after
    ``run_start`` logs ``run_stop`` (aborted, with the reason) first.

    Raises:
        ConfigError, DataError, StagingError, OutputError: bad input or environment.
        RunInterrupted: a signal before ``run_start`` (exit status 128 + its number).
    """
    resume = None
    if resume_dir is not None:
        config, resume = load_resume(Path(resume_dir))
    assert config is not None
    where = _where(config)
    check_output_dir(config.output.dir)  # before anything is written (OutputError)
    workload = get_workload(config.workload)
    tcfg = config.train
    progress = on_progress or (lambda event: None)
    with runtime.started(tcfg.device, tcfg.instances, tcfg.threads) as (world, rt):
        if world.is_main:  # first thing: where data and results go
            progress(where)
        lbs = local_batch_size(config, rt)  # a batch that does not divide: refused before any data
        with Stop() as stop:  # SIGTERM: an error before run_start, a checkpoint after it
            # Synthesising the embedded dataset when it is missing creates the data a run then
            # reads (as a download would); it is not the benchmark touching the dataset, so it
            # stays before the log, untimed, once for every instance. Nothing here reads a sample.
            synthesis_s = ready.ensure_source(config, workload, world, progress)
            job = Job(config, workload, world, rt, resume, progress, synthesis_s)
            seeded = seeded_model(job)  # the model, once; a resumed run's weights fit (ConfigError)
            with attempt(job) as (log, files):  # init_start .. run_stop, or the log set aside
                parts = prepare(job, log, stop, lbs, seeded)  # .. run_start
                with sources_named(parts.staged), sampling(
                        config.power, rt, log.path, Path(config.output.dir),
                        notify=lambda m: progress({"kind": "warning", "message": m})):
                    before_s = resume.earlier_attempts_s if resume else 0.0
                    outcome = train_loop(Run(job, log, files, parts, stop, Clock(before_s)))  # .. run_stop
            # still under `Stop`: a SIGTERM now (a launcher stopping the job) waits for the files
            result = finish(job, files, parts, outcome)
            if files is not None:  # the result read back from the log, as `mlhpc report` reads it
                result.summary = summary_of(files.log)
                results.write_json(files.summary, result.summary)
            # the staged copy this run made goes unless data.staging.keep (every rank lets go)
            said = release(parts.staged, config.data.staging.keep, world.local_rank, world.node_rank)
            if said and world.is_main:
                progress({"kind": "note", "message": said})
        return agree(result, world)  # rank 0 has written every file; no rank exits before


def _where(config: Config) -> dict[str, Any]:
    """The ``where`` event: ``data`` and ``output`` as absolute paths, each with the value the
    config gave (``*_given``), and ``cwd``, the folder a relative one was resolved against."""
    data, output = Path(config.data.path), Path(config.output.dir)
    return {"kind": "where", "data": str(data.absolute()), "data_given": str(data),
            "output": str(output.absolute()), "output_given": str(output),
            "cwd": str(Path.cwd())}


# ---- summary_N.json: the result read back from the log ------------------------------------------

def derived_perf(perf: dict[str, Any], samples_per_s: float, world_size: int,
                 emulated: bool = False) -> dict[str, Any]:
    """``perf`` (as measured: FLOPs per sample, per-rank peak, bytes per sample) with the rates
    that follow from the log's samples/s: achieved FLOP/s (total and per rank), MFU and read
    bytes/s. ``emulated``: a storage-mode run, whose steps computed nothing (no FLOP/s, no MFU)."""
    achieved = None if emulated else perf.get("train_flops_per_sample", 0) * samples_per_s
    peak = perf.get("peak_flop_per_s_per_rank") or 0
    per_sample = perf.get("dataset_bytes_per_sample")
    return {**perf, "achieved_flop_per_s": achieved,
            "achieved_flop_per_s_per_rank": None if achieved is None else achieved / max(world_size, 1),
            "mfu": achieved / (peak * world_size) if peak and achieved is not None else None,
            "read_bytes_per_s": per_sample * samples_per_s if per_sample is not None else None}


def summary_dict(run: dict[str, Any], measured: dict[str, Any]) -> dict[str, Any]:
    """The run's summary: ``run`` (`mlhpc.log.summary.RunSummary.to_dict`: the names ``mlhpc
    report --format json`` uses), the side file's measurements, and the rates that follow."""
    out = {**run, **{k: v for k, v in measured.items() if k != "perf"}}
    out["perf"] = derived_perf(measured.get("perf", {}), run.get("samples_per_s") or 0.0,
                               measured.get("world_size", 1), emulated=run.get("emulation") is not None)
    return out


def summary_of(log: Path, target: float | None = None) -> dict[str, Any]:
    """`summary_dict` of ``log`` (`mlhpc.log.summary.read_summary`, exactly as ``mlhpc report``
    reads it) and the ``measured_N.json`` beside it (``{}`` if absent): what ``summary_N.json``
    holds, so the end-of-run table, that file and ``mlhpc report`` cannot disagree.

    ``target``: the quality target the run trained to (default: the side file's ``target``).

    Raises:
        LogFormatError: the log or its side file cannot be read.
    """
    side = RunFiles.of_log(Path(log)).measured
    measured = json.loads(read_text_input(side, root=side.parent, what="side file", error=LogFormatError)) \
        if os.path.lexists(side) else {}
    if target is None:
        target = measured.get("target")
    return summary_dict(read_summary(log, target), measured)
