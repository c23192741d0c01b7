"""The departures from a reference run that every bundled workload states the same way: each
model and optimizer key that differs from the reference section, the global batch size and the
quality target. A workload adds its own data lines (synthetic data, grid, sample counts) before.

Knows no workload: the reference sections, batch size and metric are passed in.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from mlhpc.workload import QualityMetric


def section_differences(section: str, value: BaseModel, reference: BaseModel) -> list[str]:
    """``section.key=value (reference R)`` for each key of two pydantic sections that differs,
    in the field order of ``value``."""
    ref = reference.model_dump()
    return [f"{section}.{key}={val!r} (reference {ref.get(key)!r})"
            for key, val in value.model_dump().items() if ref.get(key) != val]


def training_departures(config: Any, model: BaseModel, optimizer: BaseModel,
                        global_batch_size: int, metric: QualityMetric) -> list[str]:
    """How ``config``'s ``model``, ``optimizer`` and ``train`` sections depart from the reference
    ones, one line each: every differing model and optimizer key, then
    ``train.global_batch_size=B (reference R)`` and ``target KEY <= T (reference R)`` (``>=``
    for a metric maximised), the target only when the config sets one of its own.

    Args:
        config: the resolved `mlhpc.config.Config`.
        model, optimizer: the reference model and optimizer sections (their defaults).
        global_batch_size: the reference global batch size, in samples.
        metric: the workload's quality metric; its ``target`` is the reference target.
    """
    notes = section_differences("model", config.model, model)
    notes += section_differences("optimizer", config.optimizer, optimizer)
    if config.train.global_batch_size != global_batch_size:
        notes.append(f"train.global_batch_size={config.train.global_batch_size} "
                     f"(reference {global_batch_size})")
    target = config.train.target
    if target is not None and target != metric.target:
        relation = "<=" if metric.direction == "min" else ">="
        notes.append(f"target {metric.key} {relation} {target} (reference {metric.target})")
    return notes
