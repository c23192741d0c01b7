"""Peak tensor memory of one OpenFold training step at the reference size, without the memory.

The network runs under torch's ``FakeTensorMode``: every operator computes shapes only, so a
93-million-parameter model at crop 256 with 124 MSA clusters, 1024 extra sequences and 4
templates steps on a laptop. A dispatch mode counts the bytes of every tensor storage the step
creates and frees (views share their storage; autograd's saved tensors stay counted until
freed); the peak of the live bytes is the figure. What it leaves out: allocator caching and
fragmentation, kernel-internal scratch buffers (oneDNN/MKL on a CPU, cuBLAS workspaces on a GPU),
the input batch itself (a few MB) and the interpreter. On a CUDA device it approximates
``torch.cuda.max_memory_allocated``; a CPU process's resident size is larger (see --calibrate).

The step is the reference's: training mode, the last recycling iteration with gradient
(earlier ones run without and free their activations), blocks checkpointed, no chunking,
fp32, Adam (its two moments count from the second step, so two steps run and the peak of both
is kept).

Usage:

    python benchmarks/openfold_memory.py                         # the reference, crop 256
    python benchmarks/openfold_memory.py --set evoformer_blocks=1 --set extra_msa_blocks=1
    python benchmarks/openfold_memory.py --crop 96 --clusters 32 --extra 256 --templates 2 \\
        --set evoformer_blocks=1 --set extra_msa_blocks=1 --set template_blocks=1 --calibrate

``--calibrate`` also runs the same step for real and prints the process's peak resident size
growth next to the counted figure (keep it small).
"""

from __future__ import annotations

import argparse
import ast
import resource
import sys
import time
import weakref
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from mlhpc_workloads.openfold.model import (
    AlphaFold,
    AlphaFoldConfig,
    openfold_loss,
    primitives,
)
from openfold_model_batch import make_batch

from mlhpc.text import echo


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of live tensor storages created under it; ``peak_bytes`` the most."""

    def __init__(self) -> None:
        super().__init__()
        self.live_bytes, self.peak_bytes, self._sizes = 0, 0, {}

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._sizes:
            return
        self._sizes[key] = storage.nbytes()
        self.live_bytes += self._sizes[key]
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._release, key)

    def _release(self, key: int) -> None:
        self.live_bytes -= self._sizes.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for item in tree_flatten(out)[0]:
            if isinstance(item, torch.Tensor):
                self._track(item)
        return out


def _steps(cfg: AlphaFoldConfig, batch: dict, steps: int) -> int:
    model = AlphaFold(cfg).train()
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
    for _ in range(steps):
        out = model(batch, 0)
        loss = openfold_loss(out, batch, cfg)[0]
        del out
        loss.backward()
        del loss
        optimiser.step()
        optimiser.zero_grad()
    return sum(p.numel() for p in model.parameters())


def counted_peak(cfg: AlphaFoldConfig, batch: dict) -> tuple[int, int]:
    """(parameters, peak live tensor bytes) of two training steps under FakeTensorMode."""
    init = primitives._init_weight
    primitives._init_weight = lambda weight, kind: None  # random init needs real data
    try:
        with FakeTensorMode() as mode:
            fake = {k: mode.from_tensor(v) for k, v in batch.items()}
            counter = LiveTensorBytes()
            with counter:
                params = _steps(cfg, fake, steps=2)
    finally:
        primitives._init_weight = init
    return params, counter.peak_bytes


def resident_growth_bytes(cfg: AlphaFoldConfig, batch: dict) -> int:
    """Growth of this process's peak resident size over two real training steps."""
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    _steps(cfg, batch, steps=2)
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--crop", type=int, default=256)
    parser.add_argument("--clusters", type=int, default=124)
    parser.add_argument("--extra", type=int, default=1024)
    parser.add_argument("--templates", type=int, default=4)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override an AlphaFoldConfig field of the reference")
    parser.add_argument("--calibrate", action="store_true")
    args = parser.parse_args()
    overrides = {k: ast.literal_eval(v) for k, v in (s.split("=", 1) for s in args.set)}
    cfg = AlphaFoldConfig.reference(**overrides)
    batch = make_batch(n_res=args.crop, n_seq=args.clusters, n_extra=args.extra,
                       n_templ=args.templates)
    start = time.perf_counter()
    params, peak = counted_peak(cfg, batch)
    echo(f"parameters {params:,}; crop {args.crop}, clusters {args.clusters}, extra "
         f"{args.extra}, templates {args.templates}, overrides {overrides or 'none'}")
    echo(f"peak live tensor bytes {peak / 2**30:.3f} GiB "
         f"(counted in {time.perf_counter() - start:.0f} s)")
    if args.calibrate:
        torch.set_num_threads(1)
        echo(f"real run: peak resident size grew {resident_growth_bytes(cfg, batch) / 2**30:.3f} GiB")


if __name__ == "__main__":
    main()
