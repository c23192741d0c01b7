"""What every level of ``mlhpc validate`` shares: a check's row (`Check`), the tolerances per
precision (`TOLERANCES`), Deep500's error metrics (`errors`: L2 relative and max relative error,
deep500 ``lv0/validation/metrics.py``), casting a batch or an output tree (`cast`, `floats`), the
autocast of a precision (`autocast`) and random draws made the same on both sides
(`SameDraws`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

PRECISIONS = ("fp32", "bf16", "fp16")


@dataclass(frozen=True)
class Tolerance:
    """The relative error a check at one precision may show: ``u`` (unit roundoff of the format
    the device computes in) times a factor per kind of check (see `TOLERANCES`)."""

    u: float
    operator_factor: float
    network_factor: float

    @property
    def operator(self) -> float:
        """One module's forward (L2 relative and max relative error)."""
        return self.u * self.operator_factor

    @property
    def network(self) -> float:
        """The whole network: outputs, loss, gradients, and a few training steps' losses."""
        return self.u * self.network_factor


#: Tolerances per precision, ``u x factor``. Why these factors:
#: - fp32 (u = 2^-24 = 6e-8; no rounding of inputs, every sum accumulated in fp32): a module's
#:   sums run over K terms (K up to ~10^3 for a convolution or a feature dimension) and its error
#:   grows as sqrt(K) u to K u; 2^10 covers K u for K = 1024. A network chains tens of modules,
#:   each multiplying the relative error by its condition number, and a gradient sums over the
#:   batch and every position: 2^14 (1e-3).
#: - bf16 (u = 2^-8 = 4e-3) and fp16 (u = 2^-11 = 5e-4) under autocast: inputs and weights are
#:   rounded to the format (u each) and products accumulated in fp32, so one module's error is a
#:   few u whatever K: 2^3; a network chains that rounding at every module and its gradients
#:   with it: 2^5 (bf16 0.125, fp16 0.016).
TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(u=2.0 ** -24, operator_factor=2.0 ** 10, network_factor=2.0 ** 14),
    "bf16": Tolerance(u=2.0 ** -8, operator_factor=2.0 ** 3, network_factor=2.0 ** 5),
    "fp16": Tolerance(u=2.0 ** -11, operator_factor=2.0 ** 3, network_factor=2.0 ** 5),
}
#: The numerical Jacobian's step (central differences in float64) and the agreement asked of the
#: analytic gradient: truncation error ~eps^2 and rounding ~u64/eps = 1e-10 leave 1e-4 for kinks
#: (ReLU, max pooling) a step may cross (torch.autograd.gradcheck's defaults: eps 1e-6, rtol 1e-3).
JACOBIAN_EPS = 1e-6
JACOBIAN_TOLERANCE = 1e-4


@dataclass
class Check:
    """One row of a level's table.

    Attributes:
        level: 0 operators, 1 network, 2 training, 3 distributed.
        name: what was checked (``forward Conv3d``, ``gradient of conv.0.weight``, ``step 2 loss``).
        metric: the error's name (``L2 relative``, ``max relative``, ``max abs``).
        error: the error measured (None: skipped).
        tolerance: the largest error that passes (None: information only).
        passed: True / False; None for a skipped check or a row of information.
        note: why it was skipped, or what it compared.
        rank: the rank that measured it (a job started by a launcher), else 0.
    """

    level: int
    name: str
    metric: str
    error: float | None
    tolerance: float | None
    passed: bool | None
    note: str = ""
    rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judged(level: int, name: str, metric: str, error: float, tolerance: float, note: str = ""
           ) -> Check:
    """A `Check` that passes when ``error`` is finite and at most ``tolerance``."""
    ok = bool(error == error and error <= tolerance)  # NaN fails
    return Check(level, name, metric, float(error), tolerance, ok, note)


def skipped(level: int, name: str, reason: str) -> Check:
    return Check(level, name, "-", None, None, None, reason)


def errors(got: list[torch.Tensor], want: list[torch.Tensor]) -> tuple[float, float]:
    """Deep500's metrics of ``got`` against the reference ``want`` (tensors paired in order,
    flattened and joined, in float64 on the CPU): the L2 relative error ``||got - want|| /
    ||want||`` and the max relative error ``max|got - want| / max|want|`` (normwise, so that
    reference values near zero do not blow it up). A zero reference gives the absolute error.

    Raises:
        ValueError: the two lists differ in length or a pair in shape.
    """
    if len(got) != len(want):
        raise ValueError(f"{len(got)} tensors against {len(want)} in the reference")
    if not want:
        return 0.0, 0.0
    for g, w in zip(got, want):
        if g.shape != w.shape:
            raise ValueError(f"shape {tuple(g.shape)} against {tuple(w.shape)} in the reference")
    a = torch.cat([g.detach().to("cpu", torch.float64).reshape(-1) for g in got])
    b = torch.cat([w.detach().to("cpu", torch.float64).reshape(-1) for w in want])
    diff = a - b
    if not torch.isfinite(a).all():
        return float("nan"), float("nan")
    norm, peak = float(b.norm()), float(b.abs().max()) if b.numel() else 0.0
    l2 = float(diff.norm()) / norm if norm > 0 else float(diff.norm())
    top = float(diff.abs().max()) if diff.numel() else 0.0
    return l2, (top / peak if peak > 0 else top)


def floats(tree: Any) -> list[torch.Tensor]:
    """The floating-point tensors of ``tree`` (a tensor, or dicts / lists / tuples of them), in
    pytree order."""
    return [t for t in pytree.tree_leaves(tree)
            if isinstance(t, torch.Tensor) and t.is_floating_point()]


def cast(tree: Any, device: torch.device | str, dtype: torch.dtype | None = None) -> Any:
    """``tree`` with every tensor moved to ``device`` (detached, copied), floating-point ones
    cast to ``dtype`` when given."""
    def one(t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        t = t.detach()
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype, copy=True)
        return t.to(device=device, copy=True)
    return pytree.tree_map(one, tree)


def autocast(precision_name: str, device: torch.device) -> AbstractContextManager:
    """torch.autocast to bf16 or fp16 on ``device``; nothing for fp32."""
    if precision_name == "fp32":
        return nullcontext()
    dtype = torch.bfloat16 if precision_name == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


_DROPOUTS = {torch.nn.functional.dropout: False, torch.nn.functional.dropout1d: True,
             torch.nn.functional.dropout2d: True, torch.nn.functional.dropout3d: True}
_DRAWS = {torch.rand, torch.randn, torch.randint, torch.rand_like, torch.randn_like,
          torch.randint_like, torch.bernoulli}


class SameDraws(TorchFunctionMode):
    """Within the block, dropout and torch's random draws (rand, randn, randint, their ``_like``
    forms, bernoulli) come from one CPU generator seeded with ``seed``, drawn in float64 and cast
    to the dtype and device asked: a model's training-mode randomness is then the same on the
    device as in the float64 reference, so that the two compute the same function.
    Follows Deep500's rule that a reference and a candidate see the same inputs and state."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _DROPOUTS:
            return self._dropout(func, *args, **kwargs)
        if func in _DRAWS:
            return self._draw(func, args, kwargs)
        return func(*args, **kwargs)

    def _dropout(self, func: Any, x: torch.Tensor, p: float = 0.5, training: bool = True,
                 inplace: bool = False) -> torch.Tensor:
        if not training or p == 0.0:
            return x
        shape = tuple(x.shape[:2]) + (1,) * (x.dim() - 2) if _DROPOUTS[func] else tuple(x.shape)
        keep = torch.rand(shape, generator=self.generator, dtype=torch.float64) >= p
        mask = (keep.to(torch.float64) / (1.0 - p)).to(device=x.device, dtype=x.dtype)
        return x.mul_(mask) if inplace else x * mask

    def _draw(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        like = args[0] if func in (torch.rand_like, torch.randn_like, torch.randint_like,
                                   torch.bernoulli) else None
        device = kwargs.pop("device", None) or (like.device if like is not None else None)
        dtype = kwargs.pop("dtype", None) or (like.dtype if like is not None else None)
        kwargs.pop("generator", None)
        if func is torch.bernoulli:
            probs = args[0].detach().to("cpu", torch.float64)
            out = (torch.rand(probs.shape, generator=self.generator, dtype=torch.float64) < probs)
        elif like is not None:
            base = {torch.rand_like: torch.rand, torch.randn_like: torch.randn,
                    torch.randint_like: torch.randint}[func]
            rest = args[1:] + (tuple(like.shape),)
            out = base(*rest, generator=self.generator,
                       **({"dtype": torch.float64} if base is not torch.randint else {}))
        elif func is torch.randint:
            out = func(*args, generator=self.generator, **kwargs)
        else:
            out = func(*args, generator=self.generator, dtype=torch.float64, **kwargs)
        return out.to(device=device or "cpu", dtype=dtype or (
            out.dtype if func is torch.randint else torch.get_default_dtype()))
