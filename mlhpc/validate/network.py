"""Levels 1 and 2 of ``mlhpc validate`` (Deep500 ``lv1`` network and ``lv2`` training).

Level 1: one batch of real training samples through the whole model, forward, loss and
backward, on the device at the run's precision against a float64 copy on the CPU (the same
weights): L2 relative error of the outputs, of the loss, and of every parameter's gradient (the
worst parameter named), against `mlhpc.validate.checks.TOLERANCES` (network).

Level 2: ``steps`` optimizer steps of the workload's own optimizer and schedule
(`Workload.build_optimizer`) on the device against the same steps in float64 on the CPU (the
loss of every step within tolerance), and the same steps twice on the device: bit-identical, or
the spread shown as numbers (Deep500's non-determinism heatmap, as numbers: the max abs
difference of the losses and of the parameters between the reruns).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from mlhpc.validate.checks import (TOLERANCES, Check, SameDraws, autocast, cast, errors, floats,
                                   judged)
from mlhpc.validate.material import Material, float64_default, reference_copy

#: Samples in level 1's batch (and per step in level 2): small, yet a batch (batch statistics).
BATCH_SAMPLES = 2


def forward_backward(model: torch.nn.Module, loss_fn: Any, batch: tuple[Any, Any], seed: int,
                     on: tuple[torch.device, str] | None) -> tuple[Any, torch.Tensor]:
    """Forward, loss and backward of ``model`` on ``batch``: in float64 on the CPU (``on`` None,
    the reference) or on ``on = (device, precision)``; returns ``(output, loss)`` detached, on
    the CPU, the gradients left in the parameters."""
    if on is None:
        x, y = cast(batch, "cpu", torch.float64)
        with float64_default(), SameDraws(seed):
            out = model(x)
            loss = loss_fn(out, y)
    else:
        x, y = cast(batch, on[0])
        with autocast(on[1], on[0]), SameDraws(seed):
            out = model(x)
            loss = loss_fn(out, y)
    loss.backward()
    return cast(out, "cpu"), loss.detach().to("cpu", torch.float64)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """``{parameter name: its gradient}`` (None where it has none)."""
    return {name: p.grad for name, p in model.named_parameters()}


#: Float64 reruns with every weight rounded at the precision's unit roundoff (`sensitivity`).
SENSITIVITY_TRIALS = 3
#: A check's tolerance is at least this many times the change those reruns show.
SENSITIVITY_FACTOR = 4.0
#: A parameter's gradient smaller than this share of the whole gradient (L2) is judged against
#: that share: below it, its error cannot move a step (a gradient that is zero up to rounding,
#: such as a bias before a batch norm, has no relative error to speak of).
GRADIENT_FLOOR = 1e-3

#: What a forward and backward gives, by name: ``output``, ``loss``, ``gradient of <name>``.
Outcome = dict[str, list[torch.Tensor]]


def outcome(model: torch.nn.Module, loss_fn: Any, parts: list[tuple[Any, int]],
            on: tuple[torch.device, str] | None) -> Outcome:
    """Forward and backward of ``model`` over ``parts`` (``(batch, seed)`` micro-batches, their
    gradients averaged, as gradient accumulation and data parallel average them); `Outcome`."""
    outs: list[torch.Tensor] = []
    losses: list[torch.Tensor] = []
    for batch, seed in parts:
        out, loss = forward_backward(model, loss_fn, batch, seed, on)
        outs += floats(out)
        losses.append(loss)
    found: Outcome = {"output": outs, "loss": losses}
    for name, g in grads(model).items():
        found[f"gradient of {name}"] = [] if g is None else [g.detach().to("cpu", torch.float64)
                                                             / len(parts)]
    return found


def rounded_copy(module: torch.nn.Module, u: float, seed: int) -> torch.nn.Module:
    """A float64 copy of ``module`` whose every floating-point weight, and every output of
    every module it calls, is multiplied by ``1 +/- u`` (signs drawn with ``seed``): the values
    as rounding at unit roundoff ``u`` may leave them."""
    copy = reference_copy(module)
    gen = torch.Generator().manual_seed(seed)

    def jiggle(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            return t
        signs = torch.randint(0, 2, t.shape, generator=gen).to(t.dtype) * 2 - 1
        return t * (1 + u * signs.to(t.device))

    with torch.no_grad():
        for p in copy.parameters():
            p.copy_(jiggle(p))
    for m in copy.modules():
        if m is not copy:
            m.register_forward_hook(lambda _m, _a, out: pytree.tree_map(jiggle, out))
    return copy


def relative(got: Outcome, want: Outcome) -> dict[str, tuple[float, float]]:
    """Per name, Deep500's L2 relative and max relative errors (`errors`); a gradient's against
    at least `GRADIENT_FLOOR` of the whole gradient's norm."""
    names = [k for k in want if k.startswith("gradient of ") and want[k]]
    whole = sum(float(want[k][0].norm()) ** 2 for k in names) ** 0.5
    found = {}
    for key, tensors in want.items():
        if key.startswith("gradient of ") and tensors and got.get(key):
            diff = float((got[key][0].double() - tensors[0]).norm())
            found[key] = (diff / max(float(tensors[0].norm()), GRADIENT_FLOOR * whole, 1e-300),) * 2
        elif key in got and len(got[key]) == len(tensors):
            found[key] = errors(got[key], tensors)
    if names and all(got.get(k) for k in names):
        found["gradients (all parameters)"] = errors([got[k][0] for k in names],
                                                     [want[k][0] for k in names])
    return found


def sensitivity(mat: Material, compute: Any, want: Outcome) -> dict[str, float]:
    """The largest relative change of each result of ``compute(model)`` (an `Outcome`) over
    `SENSITIVITY_TRIALS` float64 reruns with the weights rounded at the precision's unit roundoff
    (`rounded_copy`): how ill-conditioned each result is (a ReLU or a batch norm of two nearly
    equal values turns a rounding into a large change). A machine cannot be asked to do better."""
    u = TOLERANCES[mat.precision].u
    worst: dict[str, float] = {}
    for t in range(SENSITIVITY_TRIALS):
        for key, (l2, top) in relative(compute(rounded_copy(mat.model, u, mat.seed + t)), want).items():
            worst[key] = max(worst.get(key, 0.0), l2, top)
    return worst


def compare_rows(level: int, got: Outcome, want: Outcome, sens: dict[str, float], tol: float,
                 what: str) -> list[Check]:
    """Rows of ``got`` against ``want``: the output, the loss, all gradients, and the gradient
    furthest over its tolerance, named; each tolerance at least `SENSITIVITY_FACTOR` times the
    change of `sensitivity`."""
    missing = [k for k in want if k.startswith("gradient of ") and bool(want[k]) != bool(got.get(k))]
    if missing:
        return [Check(level, missing[0], "-", None, tol, False,
                      f"{what}: a gradient on one side only ({len(missing)} parameters)")]
    errs = relative(got, want)

    def limit(key: str) -> float:  # a parameter's few trials are noisy: the whole gradient's too
        floor = sens.get("gradients (all parameters)", 0.0) if key.startswith("gradient of ") else 0.0
        return max(tol, SENSITIVITY_FACTOR * max(sens.get(key, 0.0), floor))

    def row(key: str, metric: str, error: float, name: str | None = None) -> Check:
        note = what if limit(key) == tol else (
            f"{what}; tolerance {SENSITIVITY_FACTOR:g} x the float64 result's change with the "
            f"weights and module outputs rounded ({limit(key) / SENSITIVITY_FACTOR:.3g}): "
            "ill-conditioned")
        return judged(level, name or key, metric, error, limit(key), note)

    rows = []
    if want["output"]:
        rows += [row("output", "L2 relative", errs["output"][0]),
                 row("output", "max relative", errs["output"][1])]
    rows.append(row("loss", "relative", errs["loss"][0]))
    keys = [k for k in want if k.startswith("gradient of ") and want[k]]
    if keys:
        rows.append(row("gradients (all parameters)", "L2 relative",
                        errs["gradients (all parameters)"][0]))
        worst = max(keys, key=lambda k: errs[k][0] / limit(k))
        rows.append(row(worst, "L2 relative", errs[worst][0], f"{worst} (worst)"))
    return rows


def level1(mat: Material) -> list[Check]:
    """Level 1 (module docstring); when a check fails, one more row names the first module (in
    call order) whose output departs from the reference by more than the tolerance (`first_off`)."""
    tol = TOLERANCES[mat.precision].network
    parts = [(mat.batch(list(range(BATCH_SAMPLES))), mat.seed)]
    got = outcome(mat.device_copy(), mat.loss_fn, parts, (mat.device, mat.precision))
    want = outcome(reference_copy(mat.model), mat.loss_fn, parts, None)
    sens = sensitivity(mat, lambda m: outcome(m, mat.loss_fn, parts, None), want)
    what = f"{BATCH_SAMPLES} samples, {mat.device} {mat.precision} against float64 on the CPU"
    rows = compare_rows(1, got, want, sens, tol, what)
    if any(r.passed is False for r in rows):
        rows.append(first_off(mat, parts[0][0], tol))
    return rows


def module_outputs(mat: Material, model: torch.nn.Module, batch: Any,
                   on: tuple[torch.device, str] | None) -> list[tuple[str, list[torch.Tensor]]]:
    """``(module name (type), its output's float tensors)`` of every module call of one forward,
    in call order."""
    names = {id(m): f"{n} ({type(m).__name__})" for n, m in model.named_modules() if m is not model}
    seen: list[tuple[str, list[torch.Tensor]]] = []

    def keep(module: torch.nn.Module, args: Any, out: Any) -> None:
        if id(module) in names:
            seen.append((names[id(module)], [t.detach().to("cpu", torch.float64) for t in floats(out)]))

    handles = [m.register_forward_hook(keep) for m in model.modules()]
    try:
        with torch.no_grad():
            forward_backward_free(model, batch, mat.seed, on)
    finally:
        for h in handles:
            h.remove()
    return seen


def forward_backward_free(model: torch.nn.Module, batch: Any, seed: int,
                          on: tuple[torch.device, str] | None) -> None:
    """One forward of ``model`` on ``batch``'s input, as `forward_backward` runs it."""
    if on is None:
        x, _ = cast(batch, "cpu", torch.float64)
        with float64_default(), SameDraws(seed):
            model(x)
    else:
        x, _ = cast(batch, on[0])
        with autocast(on[1], on[0]), SameDraws(seed):
            model(x)


def first_off(mat: Material, batch: Any, tol: float) -> Check:
    """The first module (in call order) whose output's L2 relative error exceeds ``tol``."""
    got = module_outputs(mat, mat.device_copy(), batch, (mat.device, mat.precision))
    want = module_outputs(mat, reference_copy(mat.model), batch, None)
    for (name, g), (_, w) in zip(got, want):
        if len(g) == len(w) and g:
            l2, _ = errors(g, w)
            if not l2 <= tol:
                return judged(1, f"first module off: {name}", "L2 relative", l2, tol,
                              "the first module, in call order, whose output departs")
    return Check(1, "first module off", "-", None, tol, None,
                 "no module's output departs by more than the tolerance")


def train_steps(mat: Material, model: torch.nn.Module, steps: int, reference: bool
                ) -> list[float]:
    """``steps`` optimizer steps of ``model`` (the workload's optimizer and schedule), step
    ``k`` on samples ``[2k, 2k + 1]`` with the draws of seed ``seed + k``; the losses."""
    build = mat.workload.build_optimizer
    if reference:
        with float64_default():
            optimizer, scheduler = build(model, mat.config, mat.steps_per_epoch())
    else:
        optimizer, scheduler = build(model, mat.config, mat.steps_per_epoch())
    losses = []
    for k in range(steps):
        batch = mat.batch([BATCH_SAMPLES * k + i for i in range(BATCH_SAMPLES)])
        on = None if reference else (mat.device, mat.precision)
        _, loss = forward_backward(model, mat.loss_fn, batch, mat.seed + k, on)
        if reference:
            with float64_default():
                optimizer.step()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if scheduler is not None:
            scheduler.step()
        losses.append(float(loss))
    return losses


def level2(mat: Material, steps: int) -> list[Check]:
    """Level 2 (module docstring)."""
    tol = TOLERANCES[mat.precision].network
    ref = train_steps(mat, reference_copy(mat.model), steps, reference=True)
    first_model, second_model = mat.device_copy(), mat.device_copy()
    first = train_steps(mat, first_model, steps, reference=False)
    second = train_steps(mat, second_model, steps, reference=False)
    rows = []
    for k, (got, want) in enumerate(zip(first, ref)):
        rel = abs(got - want) / abs(want) if want != 0 else abs(got - want)
        rows.append(judged(2, f"step {k + 1} loss", "relative", rel, tol,
                           f"{got:.9g} against {want:.9g} (float64)"))
    loss_spread = max(abs(a - b) for a, b in zip(first, second))
    param_spread = max((float((a.detach() - b.detach()).abs().max())
                        for a, b in zip(first_model.parameters(), second_model.parameters())
                        if a.numel()), default=0.0)
    identical = loss_spread == 0.0 and param_spread == 0.0
    scale = max(abs(v) for v in first) or 1.0
    note = ("bit-identical" if identical else
            f"not bit-identical: losses differ by up to {loss_spread:.3g}, parameters by up to "
            f"{param_spread:.3g} (max abs)")
    rows.append(judged(2, f"rerun of {steps} steps: losses", "max abs / loss",
                       loss_spread / scale, tol, note))
    rows.append(Check(2, f"rerun of {steps} steps: parameters", "max abs", param_spread, None,
                      None, note))
    return rows
