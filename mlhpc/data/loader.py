"""The harness's side of the dataset protocol: batching and on-device decoding.

A workload's datasets (`mlhpc.workload.Workload.build_datasets`) are `mlhpc.workload.WorkloadDataset`
objects; every loop of the harness (training, evaluation, FLOP counting, ``mlhpc profile``) calls
their hooks through this module, and only those:

- ``collate_fn``: the DataLoader's ``collate_fn``. A dataset that fills whole batches in
  ``__getitems__`` (one copy per sample, into shared memory inside a worker) returns them as they
  are instead of letting torch's default_collate stack single items.
- ``device_transform(x) -> x``: applied to each batch's input after it has been moved to the
  training device, so decoding runs vectorised where the model runs and the loader moves compact
  stored dtypes.
- ``batch_len(x) -> int``: the number of samples in a batch input that is not a plain tensor
  (a graph batch is a dict of tensors whose first dimensions count atoms and edges).

Batches may be tensors or mappings / tuples of tensors (`move`). A run's loaders are
`DeviceLoader`s: each batch arrives on the training device already decoded, so the loop, the
evaluation and the step never move or decode one. `channels_first` and `PerChannel` are the pieces
the workloads' decoders share.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from mlhpc.errors import MlhpcError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.workload import WorkloadDataset


def make_loader(dataset: "WorkloadDataset", batch_size: int, *, device: torch.device | str = "cpu",
                **options: Any) -> DataLoader:
    """A DataLoader over ``dataset`` with its ``collate_fn``, pinned host memory when
    ``device`` is CUDA, and persistent workers when ``num_workers > 0``.

    Args:
        options: DataLoader's own ``sampler``, ``shuffle``, ``drop_last`` and ``num_workers``.

    Raises:
        TypeError: an option DataLoader does not take here.
    """
    unknown = set(options) - {"sampler", "shuffle", "drop_last", "num_workers"}
    if unknown:
        raise TypeError(f"make_loader: unknown option {sorted(unknown)[0]!r}")
    device = torch.device(device)
    workers = int(options.get("num_workers", 0))
    host_side: Any = dataset if workers == 0 else _Carrying(dataset)
    return DataLoader(host_side, batch_size=batch_size, sampler=options.get("sampler"),
                      shuffle=bool(options.get("shuffle", False)),
                      drop_last=bool(options.get("drop_last", False)), num_workers=workers,
                      collate_fn=dataset.collate_fn if workers == 0 else _CarriedCollate(dataset.collate_fn),
                      pin_memory=device.type == "cuda", persistent_workers=workers > 0)


class _Carried:
    """An `MlhpcError` raised in a loader worker, sent to the main process as its batch: torch
    re-raises a worker's exception from its traceback's text alone (the type rebuilt from one
    string), which loses the subject the error holds as fields (`mlhpc.errors.Where`: the file,
    key, sample, which `mlhpc.run.assemble.name_source` re-points from a staged copy to its
    source). Pickled whole, the error keeps them; `DeviceLoader` raises it."""

    def __init__(self, error: MlhpcError) -> None:
        self.error = error


class _Carrying(Dataset):
    """The workload's dataset as a worker reads it: an `MlhpcError` comes back as `_Carried`."""

    def __init__(self, dataset: Any) -> None:
        self.carried_from = dataset

    def __len__(self) -> int:
        return len(self.carried_from)

    def __getitem__(self, index: int) -> Any:
        try:
            return self.carried_from[index]
        except MlhpcError as exc:
            return _Carried(exc)

    def __getitems__(self, indices: list[int]) -> Any:
        """The workload dataset's own ``__getitems__`` (`mlhpc.workload.WorkloadDataset`)."""
        try:
            return self.carried_from.__getitems__(indices)
        except MlhpcError as exc:
            return [_Carried(exc)]


class _CarriedCollate:
    """The dataset's ``collate_fn`` in a worker: a batch holding a `_Carried` is that error."""

    def __init__(self, collate: Callable[[Any], Any]) -> None:
        self.collate = collate

    def __call__(self, items: Any) -> Any:
        if isinstance(items, list):
            carried = next((item for item in items if isinstance(item, _Carried)), None)
            if carried is not None:
                return carried
        return self.collate(items)


def move(value: Any, device: torch.device) -> Any:
    """``value`` on ``device``: a tensor, or a mapping / tuple / list of them (a graph batch is a
    dict of tensors), moved leaf by leaf; anything else is returned as it is."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=True)
    if isinstance(value, Mapping):
        return {key: move(item, device) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(move(item, device) for item in value)
    return value


def to_device(batch: tuple[Any, Any], device: torch.device,
              transform: Callable[[Any], Any]) -> tuple[Any, Any]:
    """``(transform(x), y)`` on ``device``; the copies are asynchronous from pinned memory.
    ``x`` and ``y`` are tensors or structures of tensors (`move`)."""
    x, y = batch
    return transform(move(x, device)), move(y, device)


def first_batch(dataset: "WorkloadDataset", device: torch.device | str = "cpu") -> tuple[Any, Any]:
    """A batch of the dataset's first sample, collated as its loader collates, on ``device``
    and decoded (``device_transform``) as a `DeviceLoader` gives it. Reads the dataset."""
    return to_device(dataset.collate_fn([dataset[0]]), torch.device(device), dataset.device_transform)


class DeviceLoader:
    """A `DataLoader`'s batches on the training device: each batch ``(x, y)`` drawn from ``host``
    is moved to ``device`` (asynchronous copies from pinned memory, `move`) and its input decoded
    by ``transform`` (the dataset's ``device_transform``) as it is drawn.

    Attributes:
        host: the DataLoader (sampler, batch size, workers, pinned memory).
        device: the training device.
        transform: ``x -> x`` on the device.
    """

    def __init__(self, host: DataLoader, device: torch.device | str,
                 transform: Callable[[Any], Any]) -> None:
        self.host, self.device, self.transform = host, torch.device(device), transform

    def __len__(self) -> int:
        return len(self.host)

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        for batch in self.host:
            if isinstance(batch, _Carried):  # a worker's error, its subject kept
                raise batch.error
            yield to_device(batch, self.device, self.transform)

    def resumed(self, skip: int) -> "DeviceLoader":
        """The sampler's current pass after its first ``skip`` batches (a resume inside a pass):
        a loader of the same dataset, batch size and workers over the indices left."""
        host, carrying = self.host, self.host.dataset  # the workload's, wrapped where workers read it
        dataset = carrying.carried_from if isinstance(carrying, _Carrying) else carrying
        rest = _SkipSampler(host.sampler, skip * int(host.batch_size or 1))
        return DeviceLoader(make_loader(dataset, int(host.batch_size or 1), sampler=rest,  # type: ignore[arg-type]
                                        drop_last=host.drop_last, num_workers=host.num_workers,
                                        device=self.device), self.device, self.transform)


def device_loader(dataset: "WorkloadDataset", batch_size: int, *, device: torch.device | str,
                  **options: Any) -> DeviceLoader:
    """`make_loader` over ``dataset`` whose batches arrive on ``device`` decoded by the
    dataset's ``device_transform`` (`DeviceLoader`).

    Raises:
        TypeError: as `make_loader`.
    """
    host = make_loader(dataset, batch_size, device=device, **options)
    return DeviceLoader(host, device, dataset.device_transform)


class _SkipSampler(Sampler[int]):
    """The indices of ``base`` for this pass after the first ``skip``."""

    def __init__(self, base: Any, skip: int) -> None:
        self.base, self.skip = base, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.base), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.base) - self.skip)


def channels_first(batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(view, out)`` for decoding a channels-last batch ``(B, *spatial, C)``: ``view`` is the
    batch permuted to ``(B, C, *spatial)`` (no copy), ``out`` a new contiguous float32 tensor of
    that shape on the batch's device for an ``out=`` operation to write into."""
    spatial = range(1, batch.ndim - 1)
    view = batch.permute(0, batch.ndim - 1, *spatial)
    return view, torch.empty(view.shape, dtype=torch.float32, device=batch.device)


class PerChannel:
    """Per-channel ``(x - shift) * scale`` on channels-first batches ``(B, C, ...)``.

    Args:
        shift, scale: float ``(C,)`` (array-like); kept on the CPU and copied once to each device
            a batch arrives on.
    """

    def __init__(self, shift: Any, scale: Any) -> None:
        self._cpu = (torch.as_tensor(shift, dtype=torch.float32).reshape(-1),
                     torch.as_tensor(scale, dtype=torch.float32).reshape(-1))
        self._on: dict[tuple[torch.device, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def apply(self, source: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out = (source - shift) * scale``, broadcast over channel dim 1; ``out`` may be
        ``source`` itself. Returns ``out``."""
        key = (out.device, out.ndim)
        if key not in self._on:
            shape = (1, -1) + (1,) * (out.ndim - 2)
            self._on[key] = tuple(t.reshape(shape).to(out.device) for t in self._cpu)
        shift, scale = self._on[key]
        return torch.sub(source, shift, out=out).mul_(scale)
