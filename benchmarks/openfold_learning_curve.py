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
from pathlib import Path

import torch

from mlhpc.config import load
from mlhpc.data.files import atomic_output
from mlhpc.data.inputs import read_input
from mlhpc_workloads import openfold
from mlhpc_workloads.openfold.data import OpenFoldDataset
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


def _save_average(model: torch.nn.Module, path: Path) -> None:
    """The weight average (`AveragedAlphaFold.average`) in place of the trained weights, with
    the network's buffers, as ``{"model": state dict}``; written under the project's temporary
    name, then renamed over ``path``."""
    state = {**model.net.state_dict(), **{name: value.clone() for name, value in model.average.items()}}
    _write({"model": state}, path)


def _order(seed: int, epoch: int, samples: int, batch: int) -> list[list[int]]:
    """The batches of one pass: a permutation drawn from ``(seed, epoch)`` alone, so a resumed
    run takes the same order; the last incomplete batch dropped."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(samples, generator=generator).tolist()
    return [order[i:i + batch] for i in range(0, samples - batch + 1, batch)]


def main() -> int:
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = load(args.config, tuple(args.set))
    torch.manual_seed(config.train.seed)
    train, validation = openfold.build_datasets(config, None, args.data)
    if args.overfit:
        train.entries = train.entries[:args.overfit]
        validation = OpenFoldDataset(args.data / "train", validation.sizes, False, 0, args.overfit)
    model = openfold.build_model(config.model)
    optimizer, schedule = openfold.build_optimizer(model, config, 0)
    loss_fn = openfold.build_loss(config)
    scored = torch.utils.data.DataLoader(validation, batch_size=8, collate_fn=validation.collate_fn)
    step, epoch, position, train_s, wall_before = 0, 0, 0, 0.0, 0.0
    if args.state is not None and args.state.exists():
        state = torch.load(io.BytesIO(read_input(args.state, STATE_BYTES, what="pre-training state")),
                           map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["torch_rng"])
        train._reads = int(state["reads"])
        step, epoch, position = int(state["step"]), int(state["epoch"]), int(state["position"])
        train_s, wall_before = float(state["train_s"]), float(state["wall_s"])
        print(json.dumps({"resumed": str(args.state), "step": step, "epoch": epoch}), flush=True)
    started = time.perf_counter()
    model.train()
    while step < args.steps:
        batches = _order(config.train.seed, epoch, len(train), config.train.global_batch_size)
        while position < len(batches) and step < args.steps:
            x, y = train.collate_fn([train[i] for i in batches[position]])
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            train_s += time.perf_counter() - t0
            step, position = step + 1, position + 1
            if step % args.every == 0 or step == args.steps:
                t0 = time.perf_counter()
                value = _evaluate(model, scored)
                wall_s = wall_before + time.perf_counter() - started
                print(json.dumps({"step": step, "epoch": epoch, "loss": round(loss.item(), 3),
                                  "lddt_ca": round(value, 4), "step_s": round(train_s / step, 3),
                                  "eval_s": round(time.perf_counter() - t0, 1),
                                  "wall_s": round(wall_s)}), flush=True)
                if args.save:
                    _save_average(model, Path(str(args.save).format(step=step)))
                if args.state is not None:
                    _write({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "schedule": schedule.state_dict(), "torch_rng": torch.get_rng_state(),
                            "reads": train._reads, "step": step, "epoch": epoch,
                            "position": position, "train_s": train_s, "wall_s": wall_s}, args.state)
        if position >= len(batches):
            epoch, position = epoch + 1, 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
