"""The compliance log's records around the timed run: init_start and the submission keys
(`log_init`), the hyperparameters, the sample counts, and init_stop .. run_start (`start_run`).
Rank 0 writes; the barriers make a once-only key appear once and measure the slowest rank."""

from __future__ import annotations

from mlhpc import rules
from mlhpc.run import mllog
from mlhpc.run.assemble import Parts
from mlhpc.run.job import Job
from mlhpc.run.mllog import ComplianceLog, constants
from mlhpc.run.outcome import Stop


def log_init(job: Job, log: ComplianceLog) -> None:
    """init_start and the keys logged before staging."""
    rt, sub = job.rt, job.config.submission
    log.barrier()
    log.start(constants.INIT_START)
    log.event(constants.SUBMISSION_BENCHMARK, job.workload.name)
    log.event(constants.SUBMISSION_ORG, sub.org)
    log.event(constants.SUBMISSION_DIVISION, sub.division)
    log.event(constants.SUBMISSION_STATUS, sub.status)
    log.event(constants.SUBMISSION_PLATFORM, sub.platform)
    if sub.poc_name:
        log.event(constants.SUBMISSION_POC_NAME, sub.poc_name)
    if sub.poc_email:
        log.event(constants.SUBMISSION_POC_EMAIL, sub.poc_email)
    log.event(constants.CACHE_CLEAR, True)
    log.event(mllog.NUMBER_OF_NODES, rt.num_nodes)
    log.event(mllog.ACCELERATORS_PER_NODE, rt.accelerators_per_node)
    log.event(constants.SEED, job.seed)
    if job.resume is not None:  # the marker `mlhpc.report.runs.is_resumed` reads
        resume, state = job.resume, job.resume.state
        log.event(mllog.RESUME, {"checkpoint": resume.source.name,
                                 "from_result_file": state.result_file, "epoch": state.epoch,
                                 "step": state.step,
                                 "earlier_attempts_s": round(resume.earlier_attempts_s, 3)},
                  metadata={"resumed": True})


def log_hyperparameters(job: Job, log: ComplianceLog) -> None:
    """The hyperparameters (nothing that reads the data)."""
    tcfg = job.config.train
    log.event(constants.GLOBAL_BATCH_SIZE, tcfg.global_batch_size)
    log.event(mllog.GRADIENT_ACCUMULATION_FREQUENCY, tcfg.gradient_accumulation_steps)
    for key, value in job.workload.hyperparameters(job.config).items():
        log.event(key, value)


def log_samples(log: ComplianceLog, parts: Parts) -> None:
    """``train_samples`` and ``eval_samples``: the job's counts (after a sharded stage every
    node's share summed, never one node's); the padding, if any, as metadata."""
    meta = {"padded_samples_per_epoch": parts.padded_samples} if parts.padded_samples else None
    log.event(constants.TRAIN_SAMPLES, parts.train_samples, metadata=meta)
    log.event(constants.EVAL_SAMPLES, parts.eval_samples)


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
