"""An AutoML worker: asks the study for a trial, runs it as an ordinary ``mlhpc run`` in its own
folder, tells the study how it ended, and goes on until the search's time budget ends.

Optuna's ask-and-tell interface (``study.ask()`` / ``study.tell()``) with TPE, the sampler
AIPerf's hyperparameter search uses, and a pruner on each trial's per-epoch evaluation for
AIPerf's early stop ("a trial stops when test accuracy has not improved for some epochs",
AIPerf's ``trial`` loop): `NoImprovement`. A trial's state:

- ``COMPLETE``: the run ended by itself (its target reached, or ``train.max_epochs``) or was
  stopped at the end of the budget, with at least one evaluation; its value the best metric;
- ``PRUNED``: the pruner stopped it;
- ``FAIL``: its config was refused (a combination of knobs the model does not take), the run
  failed (exit 2, a crash), it logged no evaluation, or its worker was stopped or killed.
"""

from __future__ import annotations

import math
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import optuna

from mlhpc import config as cfg
from mlhpc.automl.space import check_space, overrides_of, suggest
from mlhpc.automl.study import (
    StudyFile,
    fail_stale_trials,
    load_study,
    read_study_file,
    storage_spec,
)
from mlhpc.automl.trial import TrialRun, Watch, run_trial
from mlhpc.config import Config
from mlhpc.data.files import write_text_atomic
from mlhpc.data.statefiles import open_state_file
from mlhpc.data.trees import make_private_dir
from mlhpc.errors import ConfigError, OutputError
from mlhpc.runtime import single_process_env, usable_cpus

#: A trial's folder in the search's folder, by its Optuna trial number.
TRIAL_DIR = "trial_{number:04d}"
EventFn = Callable[[dict[str, Any]], None]


@dataclass
class WorkerResult:
    """What one worker did: its trials' ``(number, state)`` and the signal that stopped it."""

    trials: list[tuple[int, str]] = field(default_factory=list)
    signal: str | None = None


def worker_name() -> str:
    """``host:pid``, the worker a running trial belongs to (`mlhpc.automl.study.fail_stale_trials`)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def trial_threads(config: Config) -> int:
    """``automl.trial_threads``, or every core this worker may use."""
    assert config.automl is not None
    return config.automl.trial_threads or usable_cpus()


def rank_threads(config: Config) -> int:
    """Torch threads of each of a trial's ranks: the trial's threads shared by its ranks."""
    assert config.automl is not None
    return max(1, trial_threads(config) // config.automl.ranks_per_trial)


def samplers(config: Config) -> tuple[Any, Any]:
    """(sampler, pruner) as ``automl.sampler`` / ``automl.pruner`` name them."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the worker says what each trial did

    automl = config.automl
    assert automl is not None
    sampler = (optuna.samplers.TPESampler(n_startup_trials=automl.startup_trials, constant_liar=True)
               if automl.sampler == "tpe" else optuna.samplers.RandomSampler())
    inner = optuna.pruners.MedianPruner(n_startup_trials=2) if automl.pruner == "median" else None
    pruner = (optuna.pruners.NopPruner() if automl.pruner == "none"
              else NoImprovement(automl.patience_epochs, automl.min_improvement, inner))
    return sampler, pruner


class NoImprovement(optuna.pruners.BasePruner):
    """AIPerf's early stop as an Optuna pruner: stop a trial whose last ``patience`` evaluations
    are none better than its best before them by more than ``min_improvement`` (in the metric's
    units); with ``inner`` (Optuna's MedianPruner), also when that one prunes. Optuna's own
    ``PatientPruner`` stops only a trial that got worse, never one whose metric stays the same
    (a diverged run at a constant error trains on)."""

    def __init__(self, patience: int, min_improvement: float, inner: Any = None) -> None:
        self.patience, self.min_improvement, self.inner = patience, min_improvement, inner

    def prune(self, study: Any, trial: Any) -> bool:
        values = [v for _, v in sorted(trial.intermediate_values.items())]
        sign = 1.0 if study.direction == optuna.study.StudyDirection.MINIMIZE else -1.0
        if len(values) > self.patience:
            before = [sign * v for v in values[:-self.patience] if math.isfinite(v)]
            recent = [sign * v for v in values[-self.patience:] if math.isfinite(v)]
            if before and (not recent or min(recent) >= min(before) - self.min_improvement):
                return True
        return bool(self.inner is not None and self.inner.prune(study, trial))


def work(config: Config, asked_to_stop: Callable[[], str | None], on_event: EventFn) -> WorkerResult:
    """Run trials of ``config``'s search until its budget ends or ``asked_to_stop`` names a
    signal.

    Raises:
        ConfigError: no search prepared in ``output.dir`` (``study.json``), a bad search space,
            or a storage that cannot be opened.
    """
    space = check_space(config)
    study_file = read_study_file(Path(config.output.dir))
    sampler, pruner = samplers(config)
    study = load_study(study_file, storage_spec(config), sampler, pruner)
    result = WorkerResult()
    assert config.automl is not None
    while time.time() < study_file.deadline_unix_s and asked_to_stop() is None:
        for number in fail_stale_trials(study, config.automl.heartbeat_s):
            on_event({"kind": "stale", "trial": number})
        trial = study.ask()
        trial.set_user_attr("worker", worker_name())
        trial.set_user_attr("heartbeat_unix_s", time.time())
        state = _one_trial(config, study_file, study, trial, (space, asked_to_stop, on_event))
        result.trials.append((trial.number, state))
    result.signal = asked_to_stop()
    return result


def trial_config(config: Config, values: dict[str, Any], folder: Path) -> Config:
    """The trial's config: ``config`` without its ``automl`` section, writing into ``folder``,
    at the trial's threads, with the knob ``values``.

    Raises:
        ConfigError: the values are refused (a combination the model does not take).
    """
    tree = config.to_dict()
    tree.pop("automl", None)
    tree["output"] = {**tree.get("output", {}), "dir": str(folder)}
    tree["train"] = {**tree["train"], "threads": rank_threads(config)}
    return cfg.from_dict(tree, source=str(folder / "trial.yaml"), overrides=overrides_of(values))


def _one_trial(config: Config, study_file: StudyFile, study: Any, trial: Any, how: tuple) -> str:
    """Run ``trial`` and tell the study; returns its state's name."""
    import optuna

    space, asked_to_stop, on_event = how
    values = suggest(trial, space)
    folder = Path(config.output.dir) / TRIAL_DIR.format(number=trial.number)
    make_private_dir(folder, OutputError, "trial")
    on_event({"kind": "trial", "trial": trial.number, "values": values, "folder": str(folder)})
    try:
        tconfig = trial_config(config, values, folder)
    except ConfigError as exc:
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        _record(folder, {"number": trial.number, "state": "FAIL", "params": values, "error": str(exc)})
        on_event({"kind": "told", "trial": trial.number, "state": "FAIL", "why": str(exc)})
        return "FAIL"
    write_text_atomic(folder / "trial.yaml", cfg.dump(tconfig))
    run = _run(config, study_file, trial, folder, asked_to_stop)
    state, value = judge(run, study_file.direction)
    study.tell(trial, value if state == "COMPLETE" else None, state=optuna.trial.TrialState[state])
    _record(folder, {"number": trial.number, "state": state, "params": values, "value": value,
                     "exit_status": run.exit_status, "stopped": run.stopped, "evaluations": run.values})
    on_event({"kind": "told", "trial": trial.number, "state": state, "value": value,
              "evaluations": len(run.values), "exit_status": run.exit_status, "stopped": run.stopped})
    return state


def _run(config: Config, study_file: StudyFile, trial: Any, folder: Path,
         asked_to_stop: Callable[[], str | None]) -> TrialRun:
    """The trial's ``mlhpc run folder/trial.yaml`` as a single process of its own (the worker's
    launcher variables removed), its output in ``folder/output.txt``."""
    assert config.automl is not None
    env = single_process_env()
    env["OMP_NUM_THREADS"] = str(rank_threads(config))
    env["MLHPC_CAMPAIGN"] = study_file.study_name  # the store records each trial under the study's name

    def report(value: float, step: int) -> bool:
        trial.report(value, step)
        return trial.should_prune()

    watch = Watch(folder=folder, metric_key=study_file.metric_key,
                  deadline_unix_s=study_file.deadline_unix_s, heartbeat_s=config.automl.heartbeat_s,
                  report=report, beat=lambda: trial.set_user_attr("heartbeat_unix_s", time.time()),
                  asked_to_stop=asked_to_stop)
    output = open_state_file(folder / "output.txt", os.O_WRONLY | os.O_APPEND, what="trial output",
                             error=OutputError)
    try:
        return run_trial(trial_command(config, folder / "trial.yaml"), env, output, watch)
    finally:
        os.close(output)


def trial_command(config: Config, trial_yaml: Path) -> list[str]:
    """``mlhpc run TRIAL_YAML`` at the trial's scale: one process, or ``automl.ranks_per_trial``
    ranks started by ``torchrun --standalone`` (a rendezvous of its own on this node)."""
    assert config.automl is not None
    run = ["-m", "mlhpc", "run", str(trial_yaml)]
    ranks = config.automl.ranks_per_trial
    if ranks == 1:
        return [sys.executable, *run]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}", *run]


def judge(run: TrialRun, direction: str) -> tuple[str, float | None]:
    """The trial's Optuna state and value from how its run ended (see the module docstring)."""
    best = (min(run.values) if direction == "min" else max(run.values)) if run.values else None
    if run.stopped == "pruned":
        return "PRUNED", best
    if best is None:
        return "FAIL", None
    if run.stopped == "budget" or (run.stopped is None and run.exit_status in (0, 1)):
        return "COMPLETE", best
    return "FAIL", best


def _record(folder: Path, record: dict[str, Any]) -> None:
    """``folder/trial.json``: how the trial ended, for people and the report."""
    import json

    write_text_atomic(folder / "trial.json", json.dumps(record, indent=2, default=str) + "\n")
