"""OC20 S2EF data as the model reads it: a map-style dataset over a folder of OCP ``*.lmdb``
files, and the collate function that batches structures into one disjoint graph.

Folders (mlcommons/hpc ``open_catalyst/configs/mlperf_hpc.yml``: ``.../s2ef/2M/train`` and
``.../s2ef/all/val_id``): under the data folder, one sub-folder whose name holds ``train`` and one
whose name holds ``val``, each holding ``*.lmdb`` files (format: `lmdb_io`). Batching follows
``ocpmodels/datasets/lmdb_dataset.py`` ``data_list_collater`` (torch_geometric ``Batch``: atoms
concatenated, ``edge_index`` shifted by the atoms before each structure, ``neighbors`` the edges
per structure), written without torch_geometric.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from mlhpc.errors import DataError
from mlhpc.workload import SampleLocation, WorkloadDataset

from .lmdb_io import LmdbFolder


def find_split_dirs(data_dir: Path) -> tuple[Path, Path]:
    """The training and validation folders of ``data_dir``: the single sub-folder whose name
    holds ``train`` and the single one whose name holds ``val`` (case-insensitive; hidden names
    skipped).

    Raises:
        DataError: ``data_dir`` missing, no such folder, more than one candidate for a split,
            one name holding both words, or a candidate that is a link leading out of
            ``data_dir``.
    """
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        raise DataError("data folder not found (expected train and val folders of *.lmdb)", path=data_dir)
    root = data_dir.resolve()
    found: dict[str, list[Path]] = {"train": [], "val": []}
    for entry in sorted(data_dir.iterdir()):
        name = entry.name.lower()
        if entry.name.startswith(".") or not entry.is_dir():
            continue
        words = [w for w in found if w in name]
        if len(words) == 2:
            raise DataError("the name holds both 'train' and 'val'; rename the folder", path=entry)
        if words and entry.is_symlink() and root not in entry.resolve().parents:
            raise DataError(f"symbolic link leads outside {data_dir}; copy the folder instead", path=entry)
        for word in words:
            found[word].append(entry)
    for word, folders in found.items():
        if not folders:
            raise DataError(f"no folder whose name holds {word!r} (expected *.lmdb folders)", path=data_dir)
        if len(folders) > 1:
            names = ", ".join(p.name for p in folders)
            raise DataError(f"several folders hold {word!r} ({names}); keep one", path=data_dir)
    return found["train"][0], found["val"][0]


class Oc20Dataset(WorkloadDataset):
    """Map-style dataset of the structures in a folder of OCP ``*.lmdb`` files (sorted by name,
    records concatenated as ``LmdbDataset`` does).

    ``dataset[i]`` -> dict (N atoms, E stored edges): ``atomic_numbers`` int64 (N,), ``pos``
    float32 (N, 3) Angstrom, ``cell`` float32 (1, 3, 3) Angstrom, ``natoms`` int64 (),
    ``tags`` int64 (N,), ``fixed`` bool (N,), ``forces`` float32 (N, 3) eV/A, ``energy``
    float32 () eV, and when stored ``edge_index`` int64 (2, E), ``cell_offsets`` int64 (E, 3).
    ``collate_fn`` batches a list of them (`collate`).

    LMDB environments are opened lazily in each process (DataLoader workers included), never
    shared across a fork; record counts are read in the constructor.

    Raises:
        DataError: naming the file (constructor: missing folder, no ``*.lmdb``, unreadable or
            truncated file) and the key (``__getitem__``: a bad record, `lmdb_io.validate_record`).
    """

    def __init__(self, folder: Path, limit: int | None = None) -> None:
        self.records = LmdbFolder(folder)
        self.folder = Path(folder)
        if limit is not None and limit > len(self.records):
            raise DataError(f"{len(self.records)} structures, the config asks for {limit}", path=folder)
        self.length = len(self.records) if limit is None else limit

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.length:
            raise IndexError(f"structure {index} of {self.length}")
        return self.records[index]

    def locate(self, index: int) -> SampleLocation:
        """The ``*.lmdb`` file of structure ``index`` and its key there."""
        file_no, key = self.records.position(index)
        return SampleLocation(self.records.files[file_no], key)

    @staticmethod
    def collate_fn(samples: list[dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """`collate`."""
        return collate(samples)

    @staticmethod
    def batch_len(x: dict[str, torch.Tensor]) -> int:
        """Structures in a collated batch input (its ``natoms`` entries): the harness's samples,
        so samples/s are structures/s."""
        return int(x["natoms"].numel())


def collate(samples: list[dict[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Batch B structures (N atoms, E edges in all) into one disjoint graph.

    Returns:
        ``(x, y)``. x: ``atomic_numbers`` int64 (N,), ``pos`` float32 (N, 3), ``cell`` float32
        (B, 3, 3), ``natoms`` int64 (B,), ``batch`` int64 (N,) structure of each atom, ``tags``
        int64 (N,), ``fixed`` bool (N,); and when every structure has stored edges,
        ``edge_index`` int64 (2, E) shifted by the atoms of the structures before it,
        ``cell_offsets`` int64 (E, 3), ``neighbors`` int64 (B,) edges per structure. y:
        ``forces`` float32 (N, 3) eV/A, ``energy`` float32 (B,) eV, ``fixed`` bool (N,)
        (free atoms, on which the loss and the metric are taken, are ``fixed == 0``).
    """
    natoms = torch.stack([s["natoms"] for s in samples]).to(torch.int64)
    cat = {k: torch.cat([s[k] for s in samples]) for k in ("atomic_numbers", "pos", "tags", "fixed", "forces")}
    x: dict[str, Any] = {
        "atomic_numbers": cat["atomic_numbers"], "pos": cat["pos"],
        "cell": torch.cat([s["cell"].reshape(1, 3, 3) for s in samples]),
        "natoms": natoms, "batch": torch.repeat_interleave(torch.arange(len(samples)), natoms),
        "tags": cat["tags"], "fixed": cat["fixed"]}
    if all("edge_index" in s for s in samples):
        first_atom = torch.cumsum(natoms, 0) - natoms
        x["edge_index"] = torch.cat([s["edge_index"] + a for s, a in zip(samples, first_atom)], dim=1)
        x["cell_offsets"] = torch.cat([s["cell_offsets"] for s in samples])
        x["neighbors"] = torch.tensor([s["edge_index"].shape[1] for s in samples], dtype=torch.int64)
    y = {"forces": cat["forces"], "energy": torch.stack([s["energy"] for s in samples]),
         "fixed": cat["fixed"]}
    return x, y
