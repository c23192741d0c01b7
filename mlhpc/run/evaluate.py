"""Evaluation: the quality metric over the whole validation set, exact across ranks.

Each rank evaluates its own slice of the validation set (`ShardSampler`: no sample twice, none
padded) and returns ``(sum, count)`` from the workload's `QualityMetric.batch_stats`; the sums
are all-reduced before dividing, so R ranks give the metric of one rank on every sample.
"""

from __future__ import annotations

from typing import Iterable

import torch

from mlhpc.runtime import Runtime, all_reduce
from mlhpc.workload import QualityMetric

__all__ = ["evaluate"]


def evaluate(model: torch.nn.Module, batches: Iterable, metric: QualityMetric, rt: Runtime,
             autocast) -> float:
    """The metric (``sum / count`` over every rank's batches) of ``model`` in eval mode.

    ``batches`` yields ``(x, y)`` on the device, decoded (`mlhpc.data.loader.DeviceLoader`);
    ``autocast`` the step's precision context (`mlhpc.run.step.autocast`). Returns a float (NaN-free
    unless the model's outputs are).
    """
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=rt.device)
    count = torch.zeros((), dtype=torch.float64, device=rt.device)
    with torch.no_grad(), autocast:
        for x, y in batches:
            s, n = metric.batch_stats(model(x), y)
            total += s
            count += n
    total_sum, count_sum = all_reduce([total.item(), count.item()], rt)
    return total_sum / max(count_sum, 1.0)
