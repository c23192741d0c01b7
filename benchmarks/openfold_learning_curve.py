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
point (the reference's own remedy for a long climb) can be made from the embedded data.

DATA is a folder holding train/ and validation/ (`mlhpc data synth openfold --out DATA --config
CONFIG`). One JSON line per evaluation: step, epoch, last loss, mean lDDT-Ca, mean seconds per
step so far (training only), seconds of that evaluation, seconds since the start.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

import torch

from mlhpc.config import load
from mlhpc.data.files import part_path
from mlhpc_workloads import openfold
from mlhpc_workloads.openfold.data import OpenFoldDataset
from mlhpc_workloads.openfold.lddt import lddt_ca_stats


def _evaluate(model: torch.nn.Module, loader: torch.utils.data.DataLoader) -> float:
    model.eval()
    total = count = 0.0
    with torch.no_grad():
        for x, y in loader:
            s, n = lddt_ca_stats(model(x), y)
            total, count = total + float(s), count + float(n)
    model.train()
    return total / count


def _save_average(model: torch.nn.Module, path: Path) -> None:
    """The weight average (`AveragedAlphaFold.average`) in place of the trained weights, with
    the network's buffers, as ``{"model": state dict}``; written under the project's temporary
    name, then renamed over ``path``."""
    state = {**model.net.state_dict(), **{name: value.clone() for name, value in model.average.items()}}
    part = part_path(path)
    torch.save({"model": state}, part)
    os.replace(part, path)


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
                        "model.init_checkpoint file")
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
    batches = torch.utils.data.DataLoader(train, batch_size=config.train.global_batch_size, shuffle=True,
                                          collate_fn=train.collate_fn, drop_last=True)
    scored = torch.utils.data.DataLoader(validation, batch_size=8, collate_fn=validation.collate_fn)
    step, started, train_s = 0, time.perf_counter(), 0.0
    model.train()
    for epoch in itertools.count():
        for x, y in batches:
            t0 = time.perf_counter()
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            train_s += time.perf_counter() - t0
            step += 1
            if step % args.every == 0 or step == args.steps:
                t0 = time.perf_counter()
                value = _evaluate(model, scored)
                print(json.dumps({"step": step, "epoch": epoch, "loss": round(loss.item(), 3),
                                  "lddt_ca": round(value, 4), "step_s": round(train_s / step, 3),
                                  "eval_s": round(time.perf_counter() - t0, 1),
                                  "wall_s": round(time.perf_counter() - started)}), flush=True)
                if args.save:
                    _save_average(model, args.save)
            if step >= args.steps:
                return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
