"""Checkpoints: where a stopped run re-enters, and the state that carries across attempts.

A run writes ``checkpoint_N.pt`` (N: its result file's index) when SIGTERM stops it (what Slurm
sends before a time limit) and every ``train.checkpoint_every_epochs``; ``mlhpc run --resume
RUN_FOLDER`` continues from the newest one with a new ``result_M.txt`` that logs a ``resume``
event. The file is a plain dict of tensors and containers, saved atomically (temporary file +
rename) and read back with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mlhpc.config import Config, from_dict
from mlhpc.errors import ConfigError

CHECKPOINT_PATTERN = "checkpoint_{}.pt"


@dataclass
class CheckpointState:
    """Everything a resumed run takes from the one it continues.

    Attributes:
        config: the resolved config as a dict (`Config.to_dict`).
        epoch: the epoch to (re)enter, 1-based.
        step: micro-steps of that epoch already done.
        history: ``[(epoch, metric value)]`` of the evaluations so far.
        result_file: the name of the log of the attempt that saved it.
        elapsed_s: seconds of timed run (run_start onwards) spent by that attempt and every
            attempt before it.
        model / optimizer / scheduler: their ``state_dict()``.
        torch_rng: ``torch.get_rng_state()`` (uint8 tensor).
    """

    config: dict[str, Any]
    epoch: int
    step: int
    history: list[tuple[int, float]] = field(default_factory=list)
    result_file: str | None = None
    elapsed_s: float = 0.0
    model: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    torch_rng: torch.Tensor | None = None

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["history"] = [list(h) for h in self.history]
        return out

    @classmethod
    def from_dict(cls, state: dict[str, Any]) -> "CheckpointState":
        return cls(config=state["config"], epoch=int(state["epoch"]), step=int(state["step"]),
                   history=[(int(e), float(v)) for e, v in state.get("history", [])],
                   result_file=state.get("result_file"), elapsed_s=float(state.get("elapsed_s", 0.0)),
                   model=state["model"], optimizer=state["optimizer"], scheduler=state["scheduler"],
                   torch_rng=state.get("torch_rng"))


@dataclass
class Resume:
    """A checkpoint to continue from: its state and the file it was read from."""

    state: CheckpointState
    source: Path


def capture(config: Config, parts: Any, epoch: int, step: int, history: list[tuple[int, float]],
            result_file: str | None, elapsed_s: float) -> CheckpointState:  # 7: one per state field
    """The state to save: ``parts`` holds ``model``, ``optimizer`` and ``scheduler``."""
    return CheckpointState(
        config=config.to_dict(), epoch=epoch, step=step, history=list(history),
        result_file=result_file, elapsed_s=elapsed_s, model=parts.model.state_dict(),
        optimizer=parts.optimizer.state_dict(), scheduler=parts.scheduler.state_dict(),
        torch_rng=torch.get_rng_state())


def save(path: Path, state: CheckpointState) -> None:
    """Write ``state`` to ``path`` atomically (a reader never sees half a file)."""
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save(state.to_dict(), tmp)
    os.replace(tmp, path)


def restore(state: CheckpointState, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Load the saved weights, optimizer and scheduler state and the torch RNG."""
    model.load_state_dict(state.model)
    optimizer.load_state_dict(state.optimizer)
    scheduler.load_state_dict(state.scheduler)
    if state.torch_rng is not None:
        torch.set_rng_state(state.torch_rng)


def find(run_dir: Path) -> Path:
    """The newest ``checkpoint_N.pt`` in ``run_dir``.

    Raises:
        ConfigError: the folder or a checkpoint in it does not exist.
    """
    if not run_dir.is_dir():
        raise ConfigError(f"--resume {run_dir}: not a run folder")
    found = sorted(run_dir.glob("checkpoint_*.pt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise ConfigError(f"--resume {run_dir}: no checkpoint_N.pt in this folder (a run writes one "
                          "when stopped by SIGTERM or every train.checkpoint_every_epochs)")
    return found[-1]


def load_resume(run_dir: Path) -> tuple[Config, Resume]:
    """The config and saved state to continue the run stopped in ``run_dir``.

    The checkpoint is loaded with ``weights_only=True`` (tensors and plain containers only).

    Raises:
        ConfigError: no checkpoint, or one that cannot be read.
    """
    path = find(run_dir)
    try:
        raw = torch.load(path, map_location="cpu", weights_only=True)
        state = CheckpointState.from_dict(raw)
    except Exception as exc:  # torch raises several types for a damaged or foreign file
        raise ConfigError(f"--resume {path}: cannot read checkpoint ({type(exc).__name__})") from None
    config = from_dict(state.config, source=f"{path} (config)")
    return config, Resume(state, path)
