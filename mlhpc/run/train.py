"""A run of one benchmark, one straight line: every stage takes values and returns values.

    run(config): config (or a checkpoint's) -> the output folder checked -> runtime.started:
      the job's ranks and this instance's share (`mlhpc.runtime`)
      -> _ensure_source: embedded data made if missing (untimed, before the log) -> Job (frozen)
      -> _preflight: model and checkpoint fit (nothing reads the dataset) -> result_N.txt claimed,
         the log synchronised over the instance's ranks (`ComplianceLog.barrier`)
      -> log_init: init_start, submission_*, cache_clear, seed, resume (`mlhpc.run.mllog`)
      -> _prepare: hyperparameters; staging (staging_start/stop) and build (the parts: the first
         read of the data checked against the model) before or after init_stop .. run_start
         (`start_run`), by ``data.staging.placement``
      -> train_loop: epochs and evaluations until the target, then run_stop (`mlhpc.run.loop`)
      -> finish: measured_N.json, summary_N.json read back from the log, config_N.yaml,
         env_N.json (`mlhpc.run.outcome`)
      -> agree: every rank leaves with the job's exit status (`mlhpc.run.outcome`)

Data parallelism is DistributedDataParallel; which samples a rank reads is
`mlhpc.data.sampler`'s choice: after a sharded stage (``data.staging.shard: node``) its node's
samples, shuffled within the node; otherwise a seeded per-epoch shuffle shared by all ranks (so R
ranks x local batch b see the same global batches as 1 rank x R*b).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlhpc import rules, runtime
from mlhpc.config import Config
from mlhpc.data import embedded
from mlhpc.data import stage as staging
from mlhpc.data.stage.copies import release
from mlhpc.errors import ConfigError
from mlhpc.power.sampler import sampling
from mlhpc.run import checkpoint
from mlhpc.run.assemble import Parts, build, sources_named, stage
from mlhpc.run.job import Job, ProgressFn
from mlhpc.run.loop import train_loop
from mlhpc.run.mllog import ComplianceLog, constants, log_hyperparameters, log_init, log_samples
from mlhpc.run.outcome import Outcome, RunInterrupted, Stop, agree, close_failed, finish
from mlhpc.run.result import RunFiles, RunResult, check_output_dir
from mlhpc.runtime import Runtime
from mlhpc.workload import Workload
from mlhpc.workload import get as get_workload

__all__ = ["RunInterrupted", "RunResult", "local_batch_size", "run", "stage_only"]


def run(config: Config | None, *, on_progress: ProgressFn | None = None,
        resume_dir: Path | None = None) -> RunResult:
    """Train ``config``'s workload to its quality target; write the run's files on rank 0.

    With ``resume_dir`` (a run folder or a ``checkpoint_N.pt``), continue the run stopped there
    (``config`` is then taken from its checkpoint and may be None; `mlhpc.run.checkpoint` says
    what a resumed run is worth). Returns this rank's instance's `RunResult`.

    Everything that can be checked without reading the dataset is checked before
    ``result_N.txt`` is opened (`_preflight`); the data are read first after ``init_start``
    (`build`, `check_sample`). An attempt that fails (or is signalled) before ``run_start`` has
    its log moved to ``<output.dir>/failed/`` and named in the error, so it never counts as a
    run of the folder; one that fails after ``run_start`` logs ``run_stop`` (aborted, with the
    reason) first.

    Raises:
        ConfigError, DataError, StagingError, OutputError: bad input or environment.
        RunInterrupted: a signal before ``run_start`` (exit status 128 + its number).
    """
    resume = None
    if resume_dir is not None:
        config, resume = checkpoint.load_resume(Path(resume_dir))
    assert config is not None
    check_output_dir(config.output.dir)  # before anything is written (OutputError)
    workload = get_workload(config.workload)
    tcfg = config.train
    progress = on_progress or (lambda event: None)
    with runtime.started(tcfg.device, tcfg.instances, tcfg.threads) as (world, rt):
        if world.is_main:  # first thing: where data and results go
            progress(_where(config))
        lbs = local_batch_size(config, rt)  # a batch that does not divide: refused before any data
        with Stop() as stop:  # SIGTERM: an error before run_start, a checkpoint after it
            # Synthesising the embedded dataset when it is missing creates the data a run then
            # reads (as a download would); it is not the benchmark touching the dataset, so it
            # stays before the log, untimed, once for every instance. Nothing here reads a sample.
            synthesis_s = _ensure_source(config, workload, world, progress)
            job = Job(config, workload, world, rt, resume, progress, synthesis_s)
            result = _run_instance(job, stop, lbs)
        return agree(result, world)  # rank 0 has written every file; no rank exits before


def stage_only(config: Config) -> tuple[staging.StagingResult | None, bool]:
    """`mlhpc stage`: the staging a run of ``config`` would do, on every rank of this job, with
    the process group set up and torn down here. Returns ``(result or None when staging is
    disabled, whether this rank is the one that reports)``.

    Raises:
        StagingError: as `mlhpc.data.stage.stage_dataset`.
    """
    with runtime.started("cpu") as (world, _):
        return staging.stage_dataset(config, world), world.is_main


def _run_instance(job: Job, stop: Stop, lbs: int) -> RunResult:
    """One instance's attempt at local batch size ``lbs``, from its checks to its files; the
    log is closed (with ``run_stop``, or set aside before ``run_start``) whatever happens."""
    _preflight(job)
    log = ComplianceLog.create(Path(job.config.output.dir), job.rt)
    files = RunFiles.of_log(log.path) if log.path else None
    claimed = None  # the checkpoint this attempt resumes, claimed by its log
    try:
        if job.resume is not None and files is not None:
            claimed = checkpoint.claim(job.resume, files.log)
        parts, outcome = _attempt(job, (log, files), stop, lbs)
    except BaseException as exc:
        close_failed(claimed, log, files, exc)
        raise
    finally:
        log.close()
    # still under `Stop`: a SIGTERM now (a launcher stopping the job) waits for the files
    result = finish(job, files, parts, outcome)
    # the staged copy this run made goes unless data.staging.keep (every rank lets go of it)
    said = release(parts.staged, job.config.data.staging.keep, job.world.local_rank, job.world.node_rank)
    if said and job.world.is_main:
        job.progress({"kind": "note", "message": said})
    return result


def _attempt(job: Job, written: tuple[ComplianceLog, RunFiles | None], stop: Stop, lbs: int
             ) -> tuple[Parts, Outcome]:
    """init_start .. run_stop: the records before the run, the parts, the timed loop.
    ``written``: the log and the run's files (None on ranks that write none)."""
    (log, files), config, rt = written, job.config, job.rt
    if rt.is_main:
        job.progress({"kind": "start", "result_file": str(log.path), "workload": job.workload.name,
                      "instance": rt.instance})
    log_init(job, log)
    parts = _prepare(job, log, stop, lbs)
    with sources_named(parts.staged), sampling(  # run_start .. run_stop
            config.power, rt, log.path, Path(config.output.dir),
            notify=lambda m: job.progress({"kind": "warning", "message": m})):
        return parts, train_loop(job, log, parts, stop, files)


def _prepare(job: Job, log: ComplianceLog, stop: Stop, lbs: int) -> Parts:
    """Hyperparameters, staging and building on either side of ``run_start``.

    ``data.staging.placement: init`` stages (and builds the datasets, model and loaders) before
    ``init_stop``/``run_start``, as MLPerf HPC v3.0 allows within its initialisation limit;
    ``run`` logs ``init_stop`` and ``run_start`` first, so staging and everything that reads the
    data count in the time to train (the rule before v3.0). Returns after ``run_start``.
    """
    log_hyperparameters(job, log)
    in_run = job.config.data.staging.placement == "run"
    if in_run:
        start_run(job, log, stop)
    staged = stage(job, log)
    with sources_named(staged):  # an error naming the staged copy names the source file
        parts = build(job, staged, lbs)
    log_samples(log, parts.train_samples, parts.eval_samples, parts.padded_samples)
    if not in_run:
        start_run(job, log, stop)
    return parts


def start_run(job: Job, log: ComplianceLog, stop: Stop) -> None:
    """init_stop (with a warning when staging sat in an initialisation longer than the rules
    allow, `mlhpc.rules.init_limit_warning`), then run_start; from then on a signal stops the
    run with a checkpoint (`Stop.start_timed`)."""
    stop.check()  # a signal during initialisation: the attempt is set aside
    log.barrier()
    log.end(constants.INIT_STOP)
    began, ended = log.first(constants.INIT_START), log.first(constants.INIT_STOP)
    if began is not None and ended is not None and job.rt.is_main:
        warning = rules.init_limit_warning((ended.time_ms - began.time_ms) / 1e3,
                                             job.config.submission.division,
                                             job.config.data.staging.placement)
        if warning:
            job.progress({"kind": "warning", "message": warning})
    log.barrier()
    stop.start_timed()
    log.start(constants.RUN_START)


def _where(config: Config) -> dict[str, Any]:
    """The ``where`` event: ``data`` and ``output`` as absolute paths, each with the value the
    config gave (``*_given``), and ``cwd``, the folder a relative one was resolved against."""
    data, output = Path(config.data.path), Path(config.output.dir)
    return {"kind": "where", "data": str(data.absolute()), "data_given": str(data),
            "output": str(output.absolute()), "output_given": str(output),
            "cwd": str(Path.cwd())}


def _preflight(job: Job) -> None:
    """What can be checked before the log is opened without touching the dataset: the model the
    config builds can be constructed, and a checkpoint being resumed fits that model and its
    optimizer (names, shapes). The config (ranges, seeds) and the output folder were checked
    before (`mlhpc.config`, `mlhpc.run.result`). Whether the data fit the model is checked after
    ``init_start`` (`check_sample`): MLPerf's training rules (training_rules.adoc, "Run Results")
    say "The clock must start before any part of the system touches the dataset", and the log is
    where that start is shown.

    Raises:
        ConfigError: the checkpoint does not fit (`mlhpc.run.checkpoint.restore`).
    """
    config, workload = job.config, job.workload
    model = workload.build_model(config.model)
    if job.resume is not None:
        # steps per epoch shape only the schedule's function, never the state restored here;
        # `build` restores again with the real count
        optimizer, scheduler = workload.build_optimizer(model, config, 1)
        checkpoint.restore(job.resume.state, model, optimizer, scheduler,
                           source=f"--resume {job.resume.source}")


def _ensure_source(config: Config, workload: Workload, world: Runtime, progress: ProgressFn) -> float:
    """`mlhpc.data.embedded.ensure_data` on ``data.path``, unless the source is gone and every node
    already holds its complete staged copy (`mlhpc.data.stage.staged_copy_present`): a run after a
    separate ``mlhpc stage`` step then needs no source (and synthesises none). Every rank of the
    job (``world``) takes the same branch. Returns the seconds spent synthesising."""
    present = (not Path(config.data.path).exists()
               and staging.staged_copy_present(config, world))
    if runtime.all_reduce([float(not present)], world, op="max")[0] == 0.0:
        return 0.0
    state = embedded.describe(Path(config.data.path))
    if world.is_main and config.data.synthesize_if_missing and state not in ("complete", "unmarked"):
        synth = config.synth  # what ensure_data is about to make, and how big
        progress({"kind": "synthesis", "path": str(config.data.path), "state": state,
                  "workload": workload.name,
                  "samples": {k: v for k, v in (synth.model_dump() if synth is not None else {}).items()
                              if k.endswith("_samples")}})
    seconds = embedded.ensure_data(config, workload, world, progress)
    if world.is_main and seconds > 0:
        progress({"kind": "synthesised", "path": str(config.data.path), "seconds": seconds})
    return seconds


def local_batch_size(config: Config, rt: Runtime) -> int:
    """Per-rank micro-batch: global batch / (world size x gradient accumulation steps).

    Raises:
        ConfigError: the global batch does not divide evenly.
    """
    gbs, accum = config.train.global_batch_size, config.train.gradient_accumulation_steps
    if gbs % (rt.world_size * accum):
        raise ConfigError(f"{config.source}: train.global_batch_size: {gbs} is not divisible by "
                          f"world size {rt.world_size} x gradient_accumulation_steps {accum}")
    return gbs // (rt.world_size * accum)
