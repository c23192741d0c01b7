"""How a run ends: its outcome, the signals that stop it, a failed attempt set aside, the side
files written after run_stop (`finish`), and the ranks' agreement on the outcome before any of
them exits.

`finish` runs on the rank that holds the log: ``measured_N.json`` (what the log cannot hold),
``config_N.yaml`` and ``env_N.json``; the command then writes ``summary_N.json``, read back from
the log (`mlhpc.run.command.summary_of`), and the CLI records the run in the results store.

`agree` is the last collective of a run (`mlhpc.run.command.run`): rank 0 has written every file of
the set (result, measured, summary, config, env) before it enters, and every rank leaves it
with the same status and signal, so that under torchrun, srun or mpiexec no rank exits
non-zero while rank 0 is still writing (a launcher stops the others when one rank fails).
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlhpc import runtime
from mlhpc.errors import MlhpcError
from mlhpc.run import checkpoint
from mlhpc.run.assemble import Parts
from mlhpc.log.writer import ComplianceLog, constants
from mlhpc.run import env as envinfo
from mlhpc.run import result as results
from mlhpc.run.result import RunFiles, RunResult
from mlhpc.run.job import Job
from mlhpc.run.step import allreduce_bytes_per_step, compile_mode, device_peak
from mlhpc.runtime import Runtime, all_reduce



@dataclass(frozen=True)
class Outcome:
    """How the timed run ended (the values logged in ``run_stop``): made once, where the loop
    stops (`mlhpc.run.train.train_loop`). ``complete``: the run did all it was asked without
    reaching a target, a storage-mode run's epochs (`mlhpc.run.emulate`): it exits 0."""

    status: str
    reason: str | None
    epoch: int
    signal: str | None = None
    complete: bool = False

    def run_stop_metadata(self) -> dict[str, Any]:
        """What ``run_stop`` carries: status, epoch, and the reason and signal when set (a
        signal: stopped with a checkpoint, which ``mlhpc run --resume`` may continue)."""
        meta: dict[str, Any] = {"status": self.status, constants.EPOCH_NUM: self.epoch}
        if self.reason:
            meta["reason"] = self.reason
        if self.signal:
            meta["signal"] = self.signal
        return meta


class RunInterrupted(MlhpcError):
    """A signal (SIGTERM, SIGINT) stopped the run before ``run_start``; the CLI exits with
    ``exit_status`` = 128 + the signal's number."""

    def __init__(self, message: str, signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = int(signum)
        self.exit_status = 128 + self.signum


def close_failed(claimed: Path | None, log: ComplianceLog, files: RunFiles | None,
                 exc: BaseException) -> None:
    """An attempt failed with ``exc`` after its log was opened. Before ``run_start``: its log
    moves to ``<out>/failed/result_N.log`` (the attempt's claim on a checkpoint, ``claimed``
    from `mlhpc.run.checkpoint.claim`, is released) and a user error
    names it; after: ``run_stop`` (aborted, the reason) ends the log. Errors of the library's own
    (`MlhpcError`) get the new path in their one-line message; anything else keeps its type."""
    if log.first(constants.RUN_START) is not None:
        if log.first(constants.RUN_STOP) is None:
            reason = " ".join(str(exc).split())[:300] or type(exc).__name__
            log.end(constants.RUN_STOP, metadata={"status": constants.ABORTED,
                                                  "reason": f"{type(exc).__name__}: {reason}"})
        return
    if claimed is not None:
        checkpoint.release(claimed)
    if files is None:
        return
    log.close()
    moved = set_aside(files)
    if moved is not None and isinstance(exc, MlhpcError) and exc.args:
        exc.args = (f"{exc.args[0]} (this attempt's log moved to {moved})", *exc.args[1:])


def set_aside(files: RunFiles) -> Path | None:
    """Move ``files.log`` to the first free ``failed/result_N[.K].log`` beside it (exclusive;
    an empty log, claimed but never written, is removed). Returns the new path or None."""
    src = files.log
    if not src.exists() or src.stat().st_size == 0:
        src.unlink(missing_ok=True)
        return None
    folder = files.out_dir / "failed"
    folder.mkdir(exist_ok=True)
    for k in itertools.count():
        dest = folder / (f"result_{files.index}.log" if k == 0 else f"result_{files.index}.{k}.log")
        try:
            os.link(src, dest)
        except FileExistsError:
            continue
        src.unlink()
        return dest
    return None


class Stop:
    """SIGTERM (what Slurm sends before a time limit) or SIGINT (Ctrl-C): before ``run_start`` it raises
    `RunInterrupted` (the attempt's log is set aside); from ``run_start`` on it sets ``signal``,
    checked between steps (a checkpoint is saved, run_stop logged). Installed for the ``with``
    block when this is the main thread; `start_timed` marks ``run_start``."""

    def __init__(self) -> None:
        self.signal: str | None = None
        self.timed = False
        self._previous: Any = None
        self._pid = os.getpid()

    def __call__(self, signum: int, frame: Any) -> None:
        if os.getpid() != self._pid:  # a forked worker (a pool making data) inherited the handler:
            signal.signal(signum, signal.SIG_DFL)  # it ends as the signal says, quietly
            os.kill(os.getpid(), signum)
            return
        self.signal = signal.Signals(signum).name
        self.check()

    def check(self) -> None:
        """Raise `RunInterrupted` when a signal came and run_start is not logged yet (also called
        just before run_start, in case library code caught the handler's exception)."""
        if self.signal and not self.timed:
            raise RunInterrupted(f"{self.signal} before run_start: nothing trained, no checkpoint",
                                 signal.Signals[self.signal])

    def start_timed(self) -> None:
        """``run_start`` is logged (after a last `check`): from now on a signal stops the run
        with a checkpoint instead of raising."""
        self.check()
        self.timed = True

    def __enter__(self) -> "Stop":
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, previous in (self._previous or {}).items():
            signal.signal(sig, previous)


def exit_status(result: RunResult) -> int:
    """The exit status a run's outcome stands for: 0 target reached, 1 not reached, 128 + N
    stopped by signal N (a checkpoint was saved); 0 too for a storage-mode run that ran every
    epoch (``complete``: it claims no target)."""
    if result.signal:
        return 128 + int(signal.Signals[result.signal])
    return 0 if result.status == constants.SUCCESS or result.complete else 1


def agree(result: RunResult, world: Runtime) -> RunResult:
    """Every rank of ``world`` leaves with the job's outcome: the highest exit status of any
    rank's (or instance's) run, and the signal that stopped any of them. Call it once rank 0
    has written every file of its run (`finish`): it is the run's last collective,
    so no rank exits before the files are there.

    From here on a SIGTERM (what torchrun sends the other ranks when one exits non-zero, and
    Slurm and mpiexec on a failed step) is ignored on a multi-rank job: the outcome is decided
    and written, and the rank goes on to exit with it rather than being killed part-way through
    printing. Returns ``result`` with ``exit_status`` (and ``signal``) set.
    """
    own = exit_status(result)
    if not world.distributed:
        result.exit_status = own
        return result
    signum = int(signal.Signals[result.signal]) if result.signal else 0
    status, signum_max = all_reduce([float(own), float(signum)], world, op="max")
    if signum_max and result.signal is None:
        result.signal = signal.Signals(int(signum_max)).name
    result.exit_status = int(status)
    runtime.barrier(world)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    return result


# ---- after run_stop: the run's side files ------------------------------------------------------

def finish(job: Job, files: RunFiles | None, parts: Parts, outcome: Outcome) -> RunResult:
    """Write the side file, the config and the env (each once, exclusively: the set was claimed
    with the log), on the rank that holds the log (``files``; None elsewhere). Returns this
    rank's `RunResult`; the command adds the summary read back from the log."""
    result = RunResult(outcome.status, outcome.reason, signal=outcome.signal, complete=outcome.complete)
    if files is None:
        return result
    results.write_json(files.measured, measured(job, files, parts))
    result.result_file = str(files.log)
    results.write_yaml(files.config, job.config.to_dict())
    world = job.world
    results.write_json(files.env, {**envinfo.collect(), "runtime": {
        "launcher": world.launcher, "world_size": world.world_size, "num_nodes": world.num_nodes,
        "local_world_size": world.local_world_size, "device": str(job.rt.device),
        "instances": job.config.train.instances}})
    return result


def measured(job: Job, files: RunFiles, parts: Parts) -> dict[str, Any]:
    """What the log cannot hold: the contents of ``measured_N.json``."""
    config, rt, model = job.config, job.rt, parts.model
    staged = parts.staged.to_dict() if parts.staged is not None else {}
    samples = parts.train_samples + parts.eval_samples  # the job's, as staged_bytes
    peak, peak_source = device_peak(rt.device, parts.step.precision)
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
            "allreduce_bytes_per_step": allreduce_bytes_per_step(model) if rt.distributed else 0,
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
