"""The records a run writes around its timed part, through the log writer
(`mlhpc.log.writer.ComplianceLog`): init_start and the submission keys (`log_init`), the
hyperparameters (`log_hyperparameters`) and the sample counts (`log_samples`);
`mlhpc.run.train` writes init_stop .. run_start and, in its loop, the rest.
"""

from __future__ import annotations

from mlhpc.log.writer import (ACCELERATORS_PER_NODE, GRADIENT_ACCUMULATION_FREQUENCY, NUMBER_OF_NODES,
                              RESUME, ComplianceLog, constants)
from mlhpc.run.job import Job

__all__ = ["log_hyperparameters", "log_init", "log_samples"]


# ---- the records around the timed run ---------------------------------------------------------

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
    log.event(NUMBER_OF_NODES, rt.num_nodes)
    log.event(ACCELERATORS_PER_NODE, rt.accelerators_per_node)
    log.event(constants.SEED, job.seed)
    if job.resume is not None:  # the marker `mlhpc.log.summary.is_resumed` reads
        resume, state = job.resume, job.resume.state
        log.event(RESUME, {"checkpoint": resume.source.name,
                                 "from_result_file": state.result_file, "epoch": state.epoch,
                                 "step": state.step,
                                 "earlier_attempts_s": round(resume.earlier_attempts_s, 3)},
                  metadata={"resumed": True})


def log_hyperparameters(job: Job, log: ComplianceLog) -> None:
    """The hyperparameters (nothing that reads the data)."""
    tcfg = job.config.train
    log.event(constants.GLOBAL_BATCH_SIZE, tcfg.global_batch_size)
    log.event(GRADIENT_ACCUMULATION_FREQUENCY, tcfg.gradient_accumulation_steps)
    for key, value in job.workload.hyperparameters(job.config).items():
        log.event(key, value)


def log_samples(log: ComplianceLog, train_samples: int, eval_samples: int,
                padded_samples: int = 0) -> None:
    """``train_samples`` and ``eval_samples``: the job's counts (after a sharded stage every
    node's share summed, never one node's); the padding per epoch, if any, as metadata."""
    meta = {"padded_samples_per_epoch": padded_samples} if padded_samples else None
    log.event(constants.TRAIN_SAMPLES, train_samples, metadata=meta)
    log.event(constants.EVAL_SAMPLES, eval_samples)
