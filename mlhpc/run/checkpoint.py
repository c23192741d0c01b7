"""Checkpoints: where a stopped run re-enters, and the state that carries across attempts.

A run writes ``checkpoint_N.pt`` (N: its result file's index) when SIGTERM stops it (what Slurm
sends before a time limit) and every ``train.checkpoint_every_epochs``; ``mlhpc run --resume
RUN_FOLDER`` (or ``--resume RUN_FOLDER/checkpoint_N.pt``) continues from it with a new
``result_M.txt`` in that folder that logs a ``resume`` event. The file is a plain dict of tensors
and containers, saved atomically (temporary file + rename) and read back with
``torch.load(weights_only=True)``; every field is checked before any file is written.

The state is one mapping, name -> part with ``state_dict()`` / ``load_state_dict()``
(`Stateful`), registered once (`mlhpc.run.assemble.Parts.states`): ``model``, ``optimizer``,
``scheduler``, ``train_state`` (`TrainState`: config, epoch, step, evaluations, timed seconds) and
``rng`` (`TorchRandom`); `save` writes it and `restore` loads it, as torchtitan's
``CheckpointManager`` does (pytorch/torchtitan, torchtitan/components/checkpoint.py: ``states
(Dict[str, Any]): The states that need to be saved``, joined with ``MODEL: ModelWrapper(...),
OPTIMIZER: optimizers, DATALOADER: dataloader, LR_SCHEDULER: lr_schedulers``; loading skips
``exclude_from_loading``). Unlike torchtitan's, the file is one ``torch.save`` dict, and the
entries of ``train_state`` and ``rng`` lie at its top level (`TOP_LEVEL`), so every checkpoint
written before still loads. The sampler has no state of its own (its order is the seed and the
epoch, its position the step), and no run uses a gradient scaler (bf16 needs none).

What a resumed run is worth, by the MLPerf rules (mlcommons/training_policies, training_rules.adoc,
"Run Results", which hpc_training_rules.adoc follows as "MLPerf Training Rule 10"): "A run result
consists of a wall-clock timing measurement for a contiguous period" ... "The clock may not be
paused during the run."; and "A _run_ is a complete execution of an implementation on a system,
training a model from initialization to the quality target." Checkpoints themselves are allowed
("Check points can be created at the discretion of submitter. No check points are required to be
produced or retained.", "Quality measure"). A run stopped and resumed is therefore not a run
result: its log says so (the ``resume`` event, with ``earlier_attempts_s``: the timed seconds of
every attempt before it), `mlhpc report` keeps it and the stopped attempt apart from the scored
runs and shows the total time across attempts, and ``report --package`` refuses both.

Which checkpoint a ``--resume`` continues, and what it refuses, is `mlhpc.run.resume`'s: the
command reads the folder's logs and claims before the run starts. A resuming attempt claims its
checkpoint here (`claim`) once its log is open.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from mlhpc.config import Config
from mlhpc.errors import ConfigError, OutputError
from mlhpc.log.plausible import out_of_range
from mlhpc.text import clip

CHECKPOINT_PATTERN = "checkpoint_{}.pt"
#: The largest epoch, step or history length a checkpoint may hold (int32: a run of more is
#: not one a checkpoint came from).
MAX_COUNT = 2**31 - 1
#: The most timed seconds a checkpoint may carry (a year).
MAX_ELAPSED_S = 365 * 24 * 3600.0
CLAIM_PATTERN = "resumed_{}.json"
_REQUIRED = {"config": dict, "epoch": int, "step": int, "model": dict, "optimizer": dict,
             "scheduler": dict}


class Stateful(Protocol):
    """A part of the run a checkpoint carries: ``state_dict()`` gives what it saves and
    ``load_state_dict`` takes it back (torch.distributed.checkpoint.stateful.Stateful, as a
    module, an optimizer and a learning-rate schedule are)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> Any: ...


@dataclass
class TrainState:
    """The run's counters, as torchtitan's ``TrainState`` keeps the step and losses: where a
    resumed run re-enters and what it carries from the attempts before.

    Attributes:
        config: the run's config, saved as its dict (`Config.to_dict`) with its paths made
            absolute against the working folder (`absolute_paths`); never loaded back here
            (`mlhpc.run.resume.load_resume` builds the resumed run's config from the saved one).
        epoch: the epoch to (re)enter, 1-based.
        step: micro-steps of that epoch already done.
        history: ``[(epoch, metric value)]`` of the evaluations so far.
        result_file: the name of the log of the attempt that saved it.
        elapsed_s: seconds of timed run (run_start onwards) spent by that attempt and every
            attempt before it, up to the save.
    """

    config: Config
    epoch: int = 1
    step: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)
    result_file: str | None = None
    elapsed_s: float = 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"config": absolute_paths(self.config.to_dict(), Path.cwd()), "epoch": self.epoch,
                "step": self.step, "history": [list(h) for h in self.history],
                "result_file": self.result_file, "elapsed_s": self.elapsed_s}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take the counters of entries `checked` gave (the config stays the run's)."""
        self.epoch, self.step = state_dict["epoch"], state_dict["step"]
        self.history = list(state_dict["history"])
        self.result_file, self.elapsed_s = state_dict["result_file"], state_dict["elapsed_s"]


class TorchRandom:
    """torch's random state (``torch.get_rng_state()``, a uint8 tensor) as the entry
    ``torch_rng``; a checkpoint without one leaves the state as it is."""

    def state_dict(self) -> dict[str, Any]:
        return {"torch_rng": torch.get_rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("torch_rng") is not None:
            torch.set_rng_state(state_dict["torch_rng"])


#: Parts whose entries lie at the file's top level; every other part is saved under its name
#: (``model``, ``optimizer``, ``scheduler``). The layout of every checkpoint mlhpc has written.
TOP_LEVEL = ("train_state", "rng")


def entries(states: Mapping[str, Stateful]) -> dict[str, Any]:
    """The checkpoint file's dict of ``states`` (name -> part): each part's ``state_dict()``
    under its name, or merged at the top for those of `TOP_LEVEL`."""
    out: dict[str, Any] = {}
    for name, part in states.items():
        own = part.state_dict()
        if name in TOP_LEVEL:
            out.update(own)
        else:
            out[name] = own
    return out


def checked(state: Any, source: str = "checkpoint") -> dict[str, Any]:
    """A loaded checkpoint's entries, every one checked; the optional ones filled in
    (``history`` [], ``result_file`` None, ``elapsed_s`` 0.0, ``torch_rng`` None), ``history``
    as ``[(epoch, value)]`` and ``elapsed_s`` a float.

    Raises:
        ConfigError: not a dict, a required key missing or of the wrong type, a negative
            epoch/step, a malformed history; the message names ``source`` and the key.
    """
    if not isinstance(state, dict):
        raise ConfigError(f"{source}: not an mlhpc checkpoint (a {type(state).__name__}, not a dict)")
    for key, kind in _REQUIRED.items():
        if key not in state:
            raise ConfigError(f"{source}: not an mlhpc checkpoint (no '{key}' entry)")
        if not isinstance(state[key], kind) or isinstance(state[key], bool):
            raise ConfigError(f"{source}: {clip(repr(key), 40)} is a {type(state[key]).__name__}, "
                              f"expected a {kind.__name__}")
    if not (1 <= state["epoch"] <= MAX_COUNT and 0 <= state["step"] <= MAX_COUNT):
        raise ConfigError(f"{source}: 'epoch' {clip(state['epoch'], 40)} / 'step' {clip(state['step'], 40)} "
                          f"out of range (epoch 1 .. {MAX_COUNT}, step 0 .. {MAX_COUNT})")
    history, elapsed_s = _history(state, source), state.get("elapsed_s", 0.0)
    if not _number_in(elapsed_s, 0.0, MAX_ELAPSED_S):
        raise ConfigError(f"{source}: 'elapsed_s' {clip(elapsed_s, 40)} is not a number of seconds "
                          f"from 0 to {MAX_ELAPSED_S:g}")
    if not isinstance(state.get("result_file"), (str, type(None))):
        raise ConfigError(f"{source}: 'result_file' is a {type(state['result_file']).__name__}, not a name")
    rng = state.get("torch_rng")
    if rng is not None and not (isinstance(rng, torch.Tensor) and rng.dtype == torch.uint8
                                and rng.shape == torch.get_rng_state().shape):
        raise ConfigError(f"{source}: 'torch_rng' is not torch's RNG state (a uint8 tensor of "
                          f"{torch.get_rng_state().numel()} bytes)")
    _check_weights(state["model"], source)
    return {**{key: state[key] for key in _REQUIRED}, "history": history,
            "result_file": state.get("result_file"), "elapsed_s": float(elapsed_s), "torch_rng": rng}


def _number_in(value: Any, low: float, high: float) -> bool:
    return out_of_range(value, low, high) is None  # finite and within bounds (out_of_range)


def _history(state: dict[str, Any], source: str) -> list[tuple[int, float]]:
    """``state["history"]`` as ``[(epoch, metric value)]``: epochs 0 .. `MAX_COUNT` (0: the
    evaluation of the starting model, before the first step, `Workload.evaluate_at_start`, as
    OpenFold's), values finite. Raises ConfigError naming ``source``."""
    raw = state.get("history", [])
    if not isinstance(raw, list) or len(raw) > MAX_COUNT:
        raise ConfigError(f"{source}: 'history' is not a list of [epoch, value] pairs")
    history = []
    for entry in raw:
        if not (isinstance(entry, (list, tuple)) and len(entry) == 2 and type(entry[0]) is int
                and 0 <= entry[0] <= MAX_COUNT and _number_in(entry[1], -math.inf, math.inf)
                and math.isfinite(entry[1])):
            raise ConfigError(f"{source}: 'history' entry {clip(entry, 80)} is not [epoch 0 .. "
                              f"{MAX_COUNT}, finite value]")
        history.append((entry[0], float(entry[1])))
    return history


def _check_weights(model: dict[str, Any], source: str) -> None:
    """Raise ConfigError unless ``model`` is a state dict: names to tensors."""
    for name, value in model.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise ConfigError(f"{source}: 'model' entry {clip(name, 80)} is a {type(value).__name__}, "
                              "not a tensor (not a state dict)")


@dataclass
class Resume:
    """A checkpoint to continue from: its entries (`checked`) and the counters among them
    (``state``), the file it was read from, the folder the new attempt writes to, and the timed
    seconds of every earlier attempt (from their logs)."""

    saved: dict[str, Any]
    state: TrainState
    source: Path
    run_dir: Path
    earlier_attempts_s: float = 0.0

    @property
    def claim(self) -> Path:
        return self.run_dir / CLAIM_PATTERN.format(index_of(self.source))


def absolute_paths(tree: dict[str, Any], base: Path) -> dict[str, Any]:
    """``tree`` (a `Config.to_dict`) with ``data.path``, ``output.dir`` and ``data.staging.dest``
    made absolute against ``base``, so a resumed run reads what the first attempt read wherever
    it is started from."""
    out = json.loads(json.dumps(tree))
    for section, key in (("data", "path"), ("output", "dir")):
        value = out.get(section, {}).get(key)
        if isinstance(value, str) and not Path(value).is_absolute():
            out[section][key] = str(base / value)
    staging = out.get("data", {}).get("staging") or {}
    dest = staging.get("dest")
    if isinstance(dest, str) and not dest.startswith("{") and not Path(dest).is_absolute():
        staging["dest"] = str(base / dest)
    return out


def save(path: Path, states: Mapping[str, Stateful]) -> None:
    """Write the run's ``states`` (name -> part, `mlhpc.run.assemble.Parts.states`) to ``path``
    as one dict (`entries`), atomically (a reader never sees half a file; a failed write leaves
    no temporary file).

    Raises:
        OutputError: the file cannot be written (full file system, permissions).
    """
    from mlhpc.data.files import atomic_output

    try:
        with atomic_output(path) as tmp:  # the project's temporary name, no link followed
            torch.save(entries(states), tmp)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write checkpoint ({exc.strerror or exc})") from None


#: The most bytes a checkpoint file may hold (the suite's largest model with its optimizer
#: state takes a few GiB).
MAX_CHECKPOINT_BYTES = 64 << 30


def load(path: Path, source: str, root: Path | None = None) -> Any:
    """The contents of the checkpoint file ``path`` (a dict of tensors and plain containers),
    read with ``torch.load(weights_only=True)`` from `mlhpc.data.inputs.zip_input`: a regular
    file of at most `MAX_CHECKPOINT_BYTES` (a FIFO is refused at once, never waited on), inside
    ``root`` when given (a run folder: a link out of it is refused), and a ZIP archive whose
    members are all stored, as ``torch.save`` writes them, and lie inside the file, so the
    tensors read take at most the file's own bytes (a compressed member, which could inflate a
    small file to gigabytes, is refused before anything inflates).

    Raises:
        ConfigError: refused as above (naming ``path``), or not a file torch can read (the
            message starts with ``source``).
    """
    from mlhpc.data.inputs import ZipReading, zip_input

    stored = ZipReading(MAX_CHECKPOINT_BYTES, MAX_CHECKPOINT_BYTES, root, "checkpoint", ConfigError,
                        compressed=False)
    with zip_input(path, stored) as handle:
        try:
            return torch.load(handle, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises several types for a damaged or foreign file
            what = "an empty file" if os.fstat(handle.fileno()).st_size == 0 else type(exc).__name__
            raise ConfigError(f"{source}: cannot read checkpoint ({what})") from None


def restore(states: Mapping[str, Stateful], saved: dict[str, Any], source: str = "checkpoint",
            exclude: tuple[str, ...] = ()) -> None:
    """Load ``saved`` (entries `checked` gave) into each part of ``states`` but those named in
    ``exclude`` (torchtitan's ``checkpoint.exclude_from_loading``), in their order: a part
    saved under its name takes that entry, one of `TOP_LEVEL` the whole dict.

    Raises:
        ConfigError: the saved tensors do not fit what the config builds (names, shapes), naming
            ``source``.
    """
    for name, part in states.items():
        if name in exclude:
            continue
        try:
            part.load_state_dict(saved if name in TOP_LEVEL else saved[name])
        except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            first = clip(" ".join(str(exc).split()))
            raise ConfigError(f"{source}: the saved state does not fit the model its config builds "
                              f"({first})") from None


def index_of(path: Path) -> str:
    """N of ``checkpoint_N.pt``: the index of the run set it belongs to."""
    return path.name[len("checkpoint_"):-len(".pt")]


def claim(resume: Resume, log: Path) -> Path:
    """Mark ``resume``'s checkpoint as resumed by ``log`` (``resumed_N.json``, created
    exclusively: of two resumes of one checkpoint, one wins). Returns the claim this attempt
    holds (`release` gives it up).

    A claim present when ``--resume`` was given is refused by `select`, naming the log that
    made it; one found here was made since, by a resume started at the same moment, which may
    not have written its record yet, so it is not read.

    Raises:
        ConfigError: the checkpoint was claimed by another resume meanwhile.
        OutputError: the claim cannot be written.
    """
    record = {"checkpoint": resume.source.name, "resumed_by": log.name,
              "time_unix_s": time.time(), "pid": os.getpid()}
    try:
        fd = os.open(resume.claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise ConfigError(f"--resume {resume.source}: already resumed by another run started "
                          f"meanwhile ({resume.claim.name})") from None
    except OSError as exc:
        raise OutputError(f"{resume.claim}: cannot write ({exc.strerror or exc})") from None
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record) + "\n")
    return resume.claim


def release(claimed: Path) -> None:
    """Undo `claim` (the resuming attempt failed before run_start: the checkpoint stays open);
    ``claimed``: what `claim` returned."""
    claimed.unlink(missing_ok=True)
