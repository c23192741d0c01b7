"""The harness's side of the dataset protocol: batching and on-device decoding.

A workload's datasets (`mlhpc.workload.Workload.build_datasets`) are map-style torch Datasets.
Two optional attributes let a dataset take over the hot path, and every loop of the harness
(training, evaluation, FLOP counting, ``mlhpc profile``) honours them through this module:

- ``collate_fn``: the DataLoader's ``collate_fn``. A dataset that fills whole batches in
  ``__getitems__`` (one copy per sample, into shared memory inside a worker) returns them as they
  are instead of letting torch's default_collate stack single items.
- ``device_transform(x) -> x``: applied to each batch's input after it has been moved to the
  training device, so decoding (CosmoFlow's ``log(counts + 1)`` and standardisation) runs
  vectorised where the model runs and the loader moves compact stored dtypes (int16).

Datasets without them get torch's defaults: default_collate and the identity.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


def make_loader(dataset: Dataset, batch_size: int, *, sampler: Optional[Sampler] = None,
                shuffle: bool = False, drop_last: bool = False, num_workers: int = 0,
                device: torch.device | str = "cpu") -> DataLoader:
    """A DataLoader over ``dataset`` with its own ``collate_fn`` (if any), pinned host memory when
    ``device`` is CUDA, and persistent workers when ``num_workers > 0``."""
    device = torch.device(device)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, shuffle=shuffle,
                      drop_last=drop_last, num_workers=num_workers,
                      collate_fn=getattr(dataset, "collate_fn", None),
                      pin_memory=device.type == "cuda", persistent_workers=num_workers > 0)


def device_transform(dataset: Dataset) -> Callable[[torch.Tensor], torch.Tensor]:
    """The dataset's ``device_transform``, or the identity."""
    transform = getattr(dataset, "device_transform", None)
    return transform if callable(transform) else _identity


def to_device(batch: tuple[Any, Any], device: torch.device,
              transform: Callable[[torch.Tensor], torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(transform(x), y)`` on ``device``; the copies are asynchronous from pinned memory."""
    x, y = batch
    x = transform(torch.as_tensor(x).to(device, non_blocking=True))
    return x, torch.as_tensor(y).to(device, non_blocking=True)


def _identity(x: torch.Tensor) -> torch.Tensor:
    return x
