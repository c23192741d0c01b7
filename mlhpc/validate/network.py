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


def gradient_rows(level: int, got: dict[str, torch.Tensor | None],
                  want: dict[str, torch.Tensor | None], tol: float, what: str) -> list[Check]:
    """The gradients ``got`` against ``want`` (`grads`: the same parameter names): all of them
    (one L2 relative error) and the worst parameter by name."""
    missing = [n for n in want if n not in got or (got[n] is None) != (want[n] is None)]
    if missing:
        return [Check(level, f"gradient of {missing[0]}", "-", None, tol, False,
                      f"{what}: a gradient on one side only ({len(missing)} parameters)")]
    pairs = [(n, got[n], w) for n, w in want.items() if w is not None]
    whole, _ = errors([p[1] for p in pairs], [p[2] for p in pairs])
    worst_name, worst = "-", 0.0
    for name, g, w in pairs:
        l2, _ = errors([g], [w])
        if not l2 <= worst:
            worst_name, worst = name, l2
    return [judged(level, "gradients (all parameters)", "L2 relative", whole, tol, what),
            judged(level, f"gradient of {worst_name} (worst)", "L2 relative", worst, tol, what)]


def level1(mat: Material) -> list[Check]:
    """Level 1 (module docstring)."""
    tol = TOLERANCES[mat.precision].network
    batch = mat.batch(list(range(BATCH_SAMPLES)))
    device_model, ref_model = mat.device_copy(), reference_copy(mat.model)
    out, loss = forward_backward(device_model, mat.loss_fn, batch, mat.seed,
                                 (mat.device, mat.precision))
    ref_out, ref_loss = forward_backward(ref_model, mat.loss_fn, batch, mat.seed, None)
    what = f"{BATCH_SAMPLES} samples, {mat.device} {mat.precision} against float64 on the CPU"
    out_l2, out_max = errors(floats(out), floats(ref_out))
    loss_l2, _ = errors([loss], [ref_loss])
    return [judged(1, "output", "L2 relative", out_l2, tol, what),
            judged(1, "output", "max relative", out_max, tol, what),
            judged(1, "loss", "relative", loss_l2, tol, what),
            *gradient_rows(1, grads(device_model), grads(ref_model), tol, what)]


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
