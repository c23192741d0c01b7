"""After run_stop: the run's side files, written by the rank that holds the log (`finish`):
``measured_N.json`` (what the log cannot hold), ``summary_N.json`` read back from the log
(`mlhpc.run.result`), ``config_N.yaml`` and ``env_N.json``."""

from __future__ import annotations

from typing import Any

from mlhpc.run import env as envinfo
from mlhpc.run import perf
from mlhpc.run import result as results
from mlhpc.run.assemble import Parts
from mlhpc.run.job import Job
from mlhpc.run.outcome import Outcome
from mlhpc.run.result import RunFiles, RunResult
from mlhpc.run.step import compile_mode


def finish(job: Job, files: RunFiles | None, parts: Parts, outcome: Outcome) -> RunResult:
    """Write the side file, then the summary read back from the log, the config and the env
    (each once, exclusively: the set was claimed with the log), on the rank that holds the log
    (``files``; None elsewhere). Returns this rank's `RunResult`."""
    result = RunResult(outcome.status, outcome.reason, signal=outcome.signal)
    if files is None:
        return result
    results.write_json(files.measured, measured(job, files, parts))
    result.result_file = str(files.log)
    result.summary = results.load(files.log)
    results.write_json(files.summary, result.summary)
    results.write_yaml(files.config, job.config.to_dict())
    world = job.world
    results.write_json(files.env, {**envinfo.collect(), "runtime": {
        "launcher": world.launcher, "world_size": world.world_size, "num_nodes": world.num_nodes,
        "local_world_size": world.local_world_size, "device": str(job.rt.device),
        "instances": job.config.train.instances}})
    from mlhpc.store import record_run  # the results store (MLHPC_STORE=none: off); a warning, never a raise
    from mlhpc.store.engine import shown_url

    run_id = record_run(files.log.parent, files.log, lambda m: job.progress({"kind": "warning", "message": m}))
    if run_id is not None:
        job.progress({"kind": "note", "message": f"recorded in the results store {shown_url()} as run "
                      f"{run_id} (mlhpc results show {run_id}; MLHPC_STORE=none turns recording off)"})
    return result


def measured(job: Job, files: RunFiles, parts: Parts) -> dict[str, Any]:
    """What the log cannot hold: the contents of ``measured_N.json``."""
    config, rt, model = job.config, job.rt, parts.model
    staged = parts.staged.to_dict() if parts.staged is not None else {}
    samples = parts.train_samples + parts.eval_samples  # the job's, as staged_bytes
    peak, peak_source = perf.device_peak(rt.device, parts.step.precision)
    return {
        "workload": job.workload.name, "target": target_of(job), "synthesis_s": job.synthesis_s,
        "world_size": rt.world_size, "num_nodes": rt.num_nodes, "instance": rt.instance,
        "staging": staged, "padded_samples_per_epoch": parts.padded_samples,
        "departs_from_reference": departures(job, parts),
        "resumed_from": str(job.resume.source) if job.resume else None,
        "checkpoint": str(files.checkpoint) if files.checkpoint.exists() else None,
        "perf": {
            "forward_flops_per_sample": parts.flops.forward_flops,
            "train_flops_per_sample": parts.flops.train_flops,
            "peak_flop_per_s_per_rank": peak, "peak_source": peak_source,
            "precision": parts.step.precision, "parameters": sum(p.numel() for p in model.parameters()),
            "allreduce_bytes_per_step": perf.allreduce_bytes_per_step(model) if rt.distributed else 0,
            "dataset_bytes_per_sample": staged["staged_bytes"] / samples if staged else None,
            "data_path": {"num_workers": parts.train_loader.host.num_workers,
                          "pin_memory": parts.train_loader.host.pin_memory,
                          "memory_mapped": parts.train_ds.memory_mapped,
                          "decode_on_device": parts.train_ds.decodes_on_device,
                          "compile": compile_mode(config.train.compile)},
            "model_settings": job.workload.model_settings(config.model)},
    }


def target_of(job: Job) -> float:
    target = job.config.train.target
    return job.workload.metric.target if target is None else target


def departures(job: Job, parts: Parts) -> list[str]:
    """How this run departs from the reference: the workload's own list when it declares one,
    else the model settings that differ from their defaults, sample counts and target."""
    config, workload = job.config, job.workload
    if workload.departures is not None:
        return workload.departures(config)
    reference = workload.model_settings(workload.model_config())
    notes = [f"model.{key}={value} (reference {reference.get(key)})"
             for key, value in workload.model_settings(config.model).items()
             if reference.get(key) != value]
    train_n, eval_n = parts.train_samples, parts.eval_samples
    ref_train, ref_eval = workload.reference_samples
    if ref_train and (train_n, eval_n) != (ref_train, ref_eval):
        notes.append(f"samples {train_n}/{eval_n} (reference {ref_train}/{ref_eval})")
    if config.train.target is not None and config.train.target != workload.metric.target:
        notes.append(f"target {config.train.target} (reference {workload.metric.target})")
    return notes
