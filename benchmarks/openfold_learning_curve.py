"""Learning curve of an OpenFold config outside the harness: optimizer steps against the mean
lDDT-Ca of the weight average on the validation chains, with the seconds per step.

It builds what `mlhpc run` builds (the workload's ``build_datasets``, ``build_model``,
``build_optimizer``, ``build_loss``) and trains with a plain loop, one process. The harness adds
no work per step that would change the curve, and this way the curve can be read every few
steps instead of once per epoch. ``--overfit K`` trains on the first K training chains and
scores on those same chains: a check that the network can learn the structures at all.

Usage:

    python benchmarks/openfold_learning_curve.py configs/openfold-mini.yaml DATA --steps 800 --every 100
    python benchmarks/openfold_learning_curve.py configs/openfold-mini.yaml DATA --overfit 8 --steps 200 --every 50
    python benchmarks/openfold_learning_curve.py configs/openfold-mini.yaml DATA --steps 3000 --save init.pt

``--save PATH`` writes, after each evaluation, the weight average just scored as an `AlphaFold`
state dict under ``"model"``: what ``model.init_checkpoint`` reads, so a partly trained starting
point (the reference's own remedy for a long climb) can be made from the embedded data. PATH may
hold ``{step}`` (e.g. ``init-{step:05d}.pt``) to keep one file per evaluation.

``--state PATH`` makes the run resumable (the pre-training of the mini starting checkpoint takes
hours of a 2-core machine): after each evaluation the network, its weight average, Adam's moments,
the schedule, the step, the place in the epoch's order, the training set's read counter and
torch's random state are written there (temporary name, then renamed); a later call with the same
``--state`` continues from that step with the same batch order. Read back with
``torch.load(weights_only=True)``: no code from the file runs.

    nice -n 19 python benchmarks/openfold_learning_curve.py configs/openfold-mini.yaml DATA \
        --steps 20000 --every 250 --threads 2 --state pretrain/state.pt \
        --save 'pretrain/init-{step:05d}.pt' >> pretrain/curve.jsonl

DATA is a folder holding train/ and validation/ (`mlhpc data synth openfold --out DATA --config
CONFIG`). One JSON line per evaluation: step, epoch, last loss, mean lDDT-Ca, mean seconds per
step so far (training only), seconds of that evaluation, seconds since the start.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlhpc.config import load
from mlhpc.data.files import atomic_output
from mlhpc.data.inputs import read_input
from mlhpc.text import echo
from mlhpc_workloads import openfold
from mlhpc_workloads.openfold.data import OpenFoldDataset, training_set_identity
from mlhpc_workloads.openfold.lddt import lddt_ca_stats

#: The largest resumable state read (the mini network, its average and Adam's moments: a few MB).
STATE_BYTES = 1 << 30


def _evaluate(model: torch.nn.Module, loader: torch.utils.data.DataLoader) -> float:
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for x, y in loader:
            s, n = lddt_ca_stats(model(x), y)
            total, count = total + float(s), count + float(n)
    model.train()
    return total / count


def _write(payload: dict, path: Path) -> None:
    """``torch.save`` through the project's one atomic writer (`atomic_output`: a temporary
    name created ``O_EXCL | O_NOFOLLOW`` in a folder that is not a link, renamed over ``path``),
    so a planted link is never written through and a killed writer leaves the old file."""
    with atomic_output(path) as part:
        torch.save(payload, part)


def _save_average(model: torch.nn.Module, path: Path, identity: str, step: int) -> None:
    """The weight average (`AveragedAlphaFold.average`) in place of the trained weights, with
    the network's buffers, as ``{"model": state dict, "data_identity": ..., "step": ...}``
    (``data_identity``: `training_set_identity` of the chains trained on);
    written under the project's temporary name, then renamed over ``path``."""
    state = {**model.net.state_dict(), **{name: value.clone() for name, value in model.average.items()}}
    _write({"model": state, "data_identity": identity, "step": step}, path)


def _order(seed: int, epoch: int, samples: int, batch: int) -> list[list[int]]:
    """The batches of one pass: a permutation drawn from ``(seed, epoch)`` alone, so a resumed
    run takes the same order; the last incomplete batch dropped."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(samples, generator=generator).tolist()
    return [order[i:i + batch] for i in range(0, samples - batch + 1, batch)]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("data", type=Path)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--every", type=int, default=100, help="evaluate every this many steps")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--overfit", type=int, default=0, help="train and score on K training chains")
    parser.add_argument("--set", action="append", default=[], help="config override, e.g. optimizer.lr=3e-3")
    parser.add_argument("--save", type=Path, help="after each evaluation, the weight average as a "
                        "model.init_checkpoint file ({step} in the name: one file per evaluation)")
    parser.add_argument("--state", type=Path, help="resumable state, written after each "
                        "evaluation and continued from when it exists")
    return parser.parse_args()


@dataclass
class Trainer:
    """The network, its optimizer, schedule and loss, the training set, and where the run is:
    ``step`` (optimizer steps), ``epoch`` and ``position`` (batches of that epoch's order done),
    training seconds and wall seconds before this process."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    schedule: Any
    loss_fn: Any
    train: Any
    step: int = 0
    epoch: int = 0
    position: int = 0
    train_s: float = 0.0
    wall_before_s: float = 0.0

    def state_dict(self, wall_s: float) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "schedule": self.schedule.state_dict(), "torch_rng": torch.get_rng_state(),
                "reads": self.train._reads, "step": self.step, "epoch": self.epoch,
                "position": self.position, "train_s": self.train_s, "wall_s": wall_s}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["torch_rng"])
        self.train._reads = int(state["reads"])
        self.step, self.epoch, self.position = int(state["step"]), int(state["epoch"]), int(state["position"])
        self.train_s, self.wall_before_s = float(state["train_s"]), float(state["wall_s"])

    def train_step(self, indices: list[int]) -> float:
        x, y = self.train.collate_fn([self.train[i] for i in indices])
        t0 = time.perf_counter()
        loss = self.loss_fn(self.model(x), y)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.schedule.step()
        self.train_s += time.perf_counter() - t0
        self.step, self.position = self.step + 1, self.position + 1
        return loss.item()


def main() -> int:
    args = _arguments()
    torch.set_num_threads(args.threads)
    config = load(args.config, tuple(args.set))
    torch.manual_seed(config.train.seed)
    train, validation = openfold.build_datasets(config, None, args.data)
    if args.overfit:
        train.entries = train.entries[:args.overfit]
        validation = OpenFoldDataset(args.data / "train", validation.sizes, False, 0, args.overfit)
    model = openfold.build_model(config.model)
    run = Trainer(model, *openfold.build_optimizer(model, config, 0), openfold.build_loss(config), train)
    scored = torch.utils.data.DataLoader(validation, batch_size=8, collate_fn=validation.collate_fn)
    if args.state is not None and args.state.exists():
        run.load_state_dict(torch.load(io.BytesIO(read_input(args.state, STATE_BYTES, what="pre-training state")),
                                       map_location="cpu", weights_only=True))
        echo(json.dumps({"resumed": str(args.state), "step": run.step, "epoch": run.epoch}))
    started, identity = time.perf_counter(), ""
    model.train()
    while run.step < args.steps:
        batches = _order(config.train.seed, run.epoch, len(train), config.train.global_batch_size)
        while run.position < len(batches) and run.step < args.steps:
            loss = run.train_step(batches[run.position])
            if run.step % args.every == 0 or run.step == args.steps:
                t0 = time.perf_counter()
                value = _evaluate(model, scored)
                wall_s = run.wall_before_s + time.perf_counter() - started
                echo(json.dumps({"step": run.step, "epoch": run.epoch, "loss": round(loss, 3),
                                 "lddt_ca": round(value, 4), "step_s": round(run.train_s / run.step, 3),
                                 "eval_s": round(time.perf_counter() - t0, 1), "wall_s": round(wall_s)}))
                if args.save:
                    identity = identity or training_set_identity(args.data / "train")
                    _save_average(model, Path(str(args.save).format(step=run.step)), identity, run.step)
                if args.state is not None:
                    _write(run.state_dict(wall_s), args.state)
        if run.position >= len(batches):
            run.epoch, run.position = run.epoch + 1, 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
