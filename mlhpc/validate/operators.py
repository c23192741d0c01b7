"""Level 0, operators (Deep500 ``lv0``): every distinct module type of the model that holds
parameters or computes in its own forward, and every custom ``torch.autograd.Function`` the
model calls, checked on the input it really sees.

Found generically: one forward of a one-sample training batch (float32, on the CPU) with a
forward pre-hook on every module records each type's first call (its arguments), a
``TorchFunctionMode`` attributes each torch call to the innermost module running (so a container
that only calls its children is left out), and ``torch.autograd.Function.apply`` is wrapped to
record each custom Function's first call. Each is then checked twice:

- forward: on the device at the run's precision against float64 on the CPU, the same weights
  and inputs (`mlhpc.validate.checks.errors`: L2 relative and max relative error);
- backward: the analytic gradient of ``<w, f(x)>`` (``w`` random, fixed) against central
  differences in float64, as Deep500's ``lv0/validation/gradient.py`` builds its numerical
  Jacobian; over every input and parameter element when they are few (`FULL_JACOBIAN_ELEMENTS`,
  with ``torch.autograd.gradcheck`` on the full Jacobian too), else over `SAMPLED_ELEMENTS`
  elements drawn at random (a module of 10^4 inputs would need 2 x 10^4 forwards).
"""

from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from mlhpc.validate.checks import (JACOBIAN_EPS, JACOBIAN_TOLERANCE, TOLERANCES, Check, SameDraws,
                                   errors, floats, judged, skipped)
from mlhpc.validate.material import (Material, device_forward, float64_default, reference_copy,
                                     reference_forward)

#: Inputs and parameters (elements) up to which the whole Jacobian is checked (and gradcheck run).
FULL_JACOBIAN_ELEMENTS = 256
#: Elements sampled for the numerical Jacobian of a larger operator.
SAMPLED_ELEMENTS = 24
#: A module holding more than this share of the model's parameters is the network itself (a
#: wrapper's child): its Jacobian is not an operator's (recycled inputs have their gradients
#: stopped, so central differences and autograd rightly disagree); level 1 checks it whole.
WHOLE_NETWORK_SHARE = 0.9
#: Torch calls that only read a tensor's metadata: they do not make a module one that computes.
_METADATA = {"__get__", "size", "dim", "numel", "is_floating_point", "__len__", "stride",
             "is_contiguous", "element_size", "ndimension"}


class _Recorder(TorchFunctionMode):
    """Marks the module running (innermost) as computing whenever torch is called."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[torch.nn.Module] = []
        self.computing: set[int] = set()

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        if self.stack and getattr(func, "__name__", "") not in _METADATA:
            self.computing.add(id(self.stack[-1]))
        return func(*args, **(kwargs or {}))


def record(mat: Material) -> tuple[dict[type, tuple[str, torch.nn.Module, Any]],
                                   dict[type, Any]]:
    """One forward of a one-sample batch on a float32 CPU copy of the model: ``{module type:
    (its name in the model, the instance, (args, kwargs) of its first call)}`` for the types
    that hold parameters of their own or compute, and ``{Function subclass: (args, kwargs)}`` of
    the custom autograd Functions called (those defined outside torch)."""
    model = copy.deepcopy(mat.model)
    names = {id(m): n for n, m in model.named_modules()}
    firsts: dict[type, tuple[str, torch.nn.Module, Any]] = {}
    functions: dict[type, Any] = {}
    recorder = _Recorder()

    def pre(module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        recorder.stack.append(module)
        if module is not model and type(module) not in firsts:
            firsts[type(module)] = (names.get(id(module), "?"), module,
                                    _detached((args, kwargs)))

    def post(module: torch.nn.Module, args: Any, output: Any) -> None:
        if recorder.stack and recorder.stack[-1] is module:
            recorder.stack.pop()

    handles = [m.register_forward_pre_hook(pre, with_kwargs=True) for m in model.modules()]
    handles += [m.register_forward_hook(post, always_call=True) for m in model.modules()]
    original = torch.autograd.Function.apply.__func__  # type: ignore[attr-defined]

    def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
        if not cls.__module__.startswith("torch") and cls not in functions:
            functions[cls] = _detached((args, kwargs))
        return original(cls, *args, **kwargs)

    x, _ = mat.batch([0])
    torch.autograd.Function.apply = classmethod(apply)  # type: ignore[method-assign,assignment]
    try:
        with recorder, SameDraws(mat.seed):
            model(x)
    finally:
        torch.autograd.Function.apply = classmethod(original)  # type: ignore[method-assign,assignment]
        for h in handles:
            h.remove()
    kept = {t: f for t, f in firsts.items()
            if id(f[1]) in recorder.computing or any(True for _ in f[1].parameters(recurse=False))}
    return kept, functions


def _detached(tree: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def level0(mat: Material) -> list[Check]:
    """Level 0: a forward and a backward check per operator (module type or custom Function),
    named ``forward <Type> (<name in the model>)`` / ``backward <Type> (...)``."""
    modules, functions = record(mat)
    total = sum(p.numel() for p in mat.model.parameters())
    rows: list[Check] = []
    for kind, (name, module, (args, kwargs)) in sorted(modules.items(), key=lambda kv: kv[1][0]):
        label = f"{kind.__name__} ({name})"
        rows += _check(mat, label, module, args, kwargs, _share(module, total))
    for cls, (args, kwargs) in functions.items():
        rows += _check(mat, f"{cls.__name__} (autograd.Function)", cls.apply, args, kwargs)
    if not rows:
        rows.append(skipped(0, "operators", "the model calls no module with parameters or computation"))
    return rows


def _check(mat: Material, label: str, op: Any, args: Any, kwargs: Any, share: float = 0.0
           ) -> list[Check]:
    tol = TOLERANCES[mat.precision].operator
    is_module = isinstance(op, torch.nn.Module)
    try:
        fn = mat.device_copy(op) if is_module else op
        got = floats(device_forward(fn, args, kwargs, mat.seed, mat.device, mat.precision))
        ref_fn = reference_copy(op) if is_module else op
        want = floats(reference_forward(ref_fn, args, kwargs, mat.seed))
        l2, top = errors(got, want)
    except (RuntimeError, ValueError, TypeError) as exc:
        return [Check(0, f"forward {label}", "-", None, tol, False, _said(exc))]
    rows = [judged(0, f"forward {label}", "L2 relative", l2, tol),
            judged(0, f"forward {label}", "max relative", top, tol)]
    rows.append(_backward(mat, label, op, args, kwargs, share))
    return rows


def _share(module: torch.nn.Module, total: int) -> float:
    """The share of the model's parameters ``module`` holds (with its children)."""
    return sum(p.numel() for p in module.parameters()) / total if total else 0.0


def _said(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]


def _backward(mat: Material, label: str, op: Any, args: Any, kwargs: Any, share: float
              ) -> Check:
    """The numerical Jacobian check of ``op`` in float64 on the CPU (module docstring)."""
    name = f"backward {label}"
    module = reference_copy(op) if isinstance(op, torch.nn.Module) else None
    params = dict(module.named_parameters()) if module is not None else {}
    leaves, spec = pytree.tree_flatten(
        pytree.tree_map(lambda t: t.detach().to("cpu", torch.float64).contiguous()
                        if isinstance(t, torch.Tensor) and t.is_floating_point() else t, (args, kwargs)))
    slots = [i for i, t in enumerate(leaves) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    wrt = [leaves[i] for i in slots] + [p.detach() for p in params.values()]
    if not wrt:
        return skipped(0, name, "no floating-point input or parameter (integer indices): "
                                "nothing to differentiate")
    if share > WHOLE_NETWORK_SHARE:
        return skipped(0, name, f"holds {share:.0%} of the model's parameters: the network itself "
                                "(a wrapper's child), checked whole at level 1")

    def f(*xs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        inputs = list(leaves)
        for i, x in zip(slots, xs):
            inputs[i] = x
        a, k = pytree.tree_unflatten(inputs, spec)
        call = (lambda *aa, **kk: torch.func.functional_call(
            module, dict(zip(params, xs[len(slots):])), aa, kk)) if module is not None else op
        with float64_default(), SameDraws(mat.seed):
            return tuple(floats(call(*a, **k)))

    try:
        error, how = _jacobian_error(f, wrt, mat.seed)
    except (RuntimeError, ValueError, TypeError) as exc:
        return skipped(0, name, f"not differentiable here: {_said(exc)}")
    return judged(0, name, "max relative (Jacobian)", error, JACOBIAN_TOLERANCE, how)


def _jacobian_error(f: Callable[..., tuple[torch.Tensor, ...]], wrt: list[torch.Tensor], seed: int
                    ) -> tuple[float, str]:
    """``max |numerical - analytic| / max |numerical|`` of the gradient of ``<w, f(x)>`` over
    the elements checked, and how they were chosen."""
    xs = [t.clone().requires_grad_(True) for t in wrt]
    outs = f(*xs)
    gen = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64) for o in outs]
    if not any(o.requires_grad for o in outs):
        raise ValueError("the output does not depend on the inputs")
    total = sum((o * w).sum() for o, w in zip(outs, weights) if o.requires_grad)
    grads = torch.autograd.grad(total, xs, allow_unused=True)
    analytic = torch.cat([(g if g is not None else torch.zeros_like(x)).reshape(-1)
                          for g, x in zip(grads, xs)])
    sizes = [x.numel() for x in xs]
    count = sum(sizes)
    full = count <= FULL_JACOBIAN_ELEMENTS
    picks = range(count) if full else torch.randperm(count, generator=gen)[:SAMPLED_ELEMENTS].tolist()
    bases = [x.detach().clone() for x in xs]
    numeric, chosen = [], []
    for flat in picks:
        which, at = _locate(flat, sizes)
        values = []
        for sign in (1.0, -1.0):
            moved = [b.clone() for b in bases]
            moved[which].view(-1)[at] += sign * JACOBIAN_EPS
            with torch.no_grad():
                values.append(sum(float((o * w).sum()) for o, w in zip(f(*moved), weights)))
        numeric.append((values[0] - values[1]) / (2 * JACOBIAN_EPS))
        chosen.append(flat)
    num = torch.tensor(numeric, dtype=torch.float64)
    ana = analytic.detach()[chosen]
    scale = float(num.abs().max()) if num.numel() else 0.0
    diff = float((num - ana).abs().max()) if num.numel() else 0.0
    error = diff / scale if scale > 0 else diff
    if full:
        ok = torch.autograd.gradcheck(f, tuple(x.detach().clone().requires_grad_(True) for x in xs),
                                      eps=JACOBIAN_EPS, atol=1e-5, rtol=1e-3, raise_exception=False)
        how = f"all {count} elements; torch.autograd.gradcheck {'passed' if ok else 'FAILED'}"
        return (error if ok else max(error, float("inf"))), how
    return error, (f"{SAMPLED_ELEMENTS} of {count} elements drawn at random (the whole Jacobian "
                   f"would take {2 * count} forwards)")


def _locate(flat: int, sizes: list[int]) -> tuple[int, int]:
    for i, n in enumerate(sizes):
        if flat < n:
            return i, flat
        flat -= n
    raise IndexError(flat)
