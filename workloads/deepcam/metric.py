"""DeepCAM quality metric: mean intersection-over-union over the 3 classes, averaged over samples.

Follows the reference's ``compute_score`` (mlcommons/hpc, deepcam/src/deepCam/utils/metric.py):
per sample and class, IoU = TP / (TP + FP + FN); a class absent from both the prediction and the
label (0 / 0) counts as IoU 1; the per-sample score is the mean over classes and the reported
``eval_accuracy`` the mean over samples. The prediction is the arg-max of the logits. The MLPerf
HPC quality target is 0.82 (hpc 3.0.0 compliance rules, closed_deepcam.yaml).
"""

from __future__ import annotations

import torch
from torch import Tensor

from mlhpc.workload import QualityMetric

TARGET_IOU = 0.82


def per_sample_iou(prediction: Tensor, label: Tensor, num_classes: int = 3) -> Tensor:
    """Mean IoU over ``num_classes`` classes, one value per sample.

    Args:
        prediction: int (N, H, W) predicted classes.
        label: int (N, H, W) true classes in ``[0, num_classes)``.

    Returns:
        float64 (N,) tensor; a class absent from both ``prediction`` and ``label`` of a sample
        contributes IoU 1 to that sample.
    """
    n = label.shape[0]
    pred = prediction.reshape(n, -1)
    true = label.reshape(n, -1)
    scores = torch.zeros(n, dtype=torch.float64, device=label.device)
    for cls in range(num_classes):
        p, t = pred == cls, true == cls
        inter = (p & t).sum(dim=1).to(torch.float64)
        union = (p | t).sum(dim=1).to(torch.float64)
        scores += torch.where(union > 0, inter / union.clamp_min(1.0), torch.ones_like(union))
    return scores / num_classes


def iou_batch_stats(logits: Tensor, label: Tensor) -> tuple[Tensor, Tensor]:
    """(sum of per-sample mean IoU, number of samples) for one batch.

    Args:
        logits: float (N, C, H, W) network output.
        label: int (N, H, W) true classes.

    Returns:
        two 0-d float64 tensors on ``label``'s device; summed over every batch of every rank they
        give ``eval_accuracy = sum / count`` exactly.
    """
    scores = per_sample_iou(logits.argmax(dim=1), label, num_classes=logits.shape[1])
    return scores.sum(), torch.tensor(float(label.shape[0]), dtype=torch.float64, device=label.device)


METRIC = QualityMetric(key="eval_accuracy", target=TARGET_IOU, direction="max",
                       batch_stats=iou_batch_stats)
