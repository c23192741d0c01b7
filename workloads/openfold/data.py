"""OpenFold training data on disk and as batches: PDB mmCIF files with OpenProteinSet alignments.

Layout of one split folder (the reference's ``pdb_mmcif/mmcif_files`` and its alignment folder,
one folder per chain named ``<pdb_id>_<chain_id>`` as OpenProteinSet names them)::

    <split>/mmcif_files/<pdb_id>.cif            (or .cif.gz)
    <split>/alignments/<pdb_id>_<chain_id>/*.a3m   (or in its a3m/ sub-folder, as OpenProteinSet)
    <split>/alignments/<pdb_id>_<chain_id>/*.hhr   (optional templates, or in its hhr/ sub-folder)

A sample is a chain: one alignment folder and the chain of that id in ``<pdb_id>.cif``. Its
alignments are merged in the reference's order (``uniref90_hits``, ``bfd_uniclust_hits``,
``mgnify_hits``, then any other ``*.a3m`` by name) and the query must be the chain's sequence.

Every file is read through `mlhpc.data.inputs` with the split folder as its tree: a folder or
file reached through a symbolic link out of it (an alignment folder, its ``a3m/`` or ``hhr/``,
an a3m, hhr or mmCIF file) is refused with one line, when the chains are listed and again when
the file is opened; names read from the data (an ``.hhr`` hit's template) are names, never paths
(`templates.parse_hhr`). The run (`OpenFoldDataset`) and ``mlhpc data check``
(`formats.OpenFoldDataTools`) read through these same functions.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlhpc.data.trees import is_under, resolved
from mlhpc.errors import DataError
from mlhpc.workload import SampleLocation, WorkloadDataset

from . import a3m, mmcif, templates
from .features import FeatureSizes, RawChain, chain_features

MMCIF_DIR = "mmcif_files"
ALIGNMENT_DIR = "alignments"
MMCIF_SUFFIXES = (".cif", ".cif.gz")
A3M_ORDER = ("uniref90_hits.a3m", "bfd_uniclust_hits.a3m", "mgnify_hits.a3m")
#: The inputs of the batch interface; every other key of a batch is a target.
INPUT_KEYS = ("aatype", "residue_index", "seq_mask", "target_feat", "msa_feat", "msa_mask",
              "extra_msa", "extra_has_deletion", "extra_deletion_value", "extra_msa_mask",
              "template_aatype", "template_all_atom_positions", "template_all_atom_mask",
              "template_mask", "template_pseudo_beta", "template_pseudo_beta_mask")


@dataclass(frozen=True)
class ChainEntry:
    """Where one sample's files are: its mmCIF file, chain id and a3m files, and ``root``, the
    split folder they were found in (no file is read through a link out of it)."""

    mmcif: Path
    chain_id: str
    a3m_files: tuple[Path, ...]
    root: Path


def inside(path: Path, root: Path, what: str) -> Path:
    """``path`` itself when its real path lies inside the data tree ``root``.

    Raises:
        DataError: ``path`` is (or lies below) a symbolic link out of ``root`` (one line).
    """
    target = resolved(path)
    if not is_under(target, resolved(root)):
        raise DataError(f"{what} is reached through a symbolic link out of the data "
                        f"tree {root} (to {target}); refused: copy it into the tree", path=path)
    return path


def mmcif_path(split_dir: Path, pdb_id: str) -> Path | None:
    """``<split>/mmcif_files/<pdb_id>.cif`` (or ``.cif.gz``) when it exists. ``pdb_id`` is a
    name (a folder's, or checked by `templates.parse_hhr`), never a path.

    Raises:
        DataError: the file is reached through a link out of ``split_dir``.
    """
    for suffix in MMCIF_SUFFIXES:
        path = Path(split_dir) / MMCIF_DIR / f"{pdb_id}{suffix}"
        if path.is_file():
            return inside(path, split_dir, "mmCIF file")
    return None


def _named(folder: Path, suffix: str, root: Path, what: str) -> list[Path]:
    """The files ``*<suffix>`` of ``folder`` (its ``a3m/`` or ``hhr/`` sub-folder when there is
    one), by name, each checked to lie inside ``root``."""
    sub = folder / suffix.lstrip(".")
    folder = inside(sub, root, f"{what} folder") if sub.is_dir() else folder
    return sorted(inside(p, root, what) for p in folder.glob(f"*{suffix}") if p.is_file())


def a3m_files(chain_dir: Path, root: Path) -> tuple[Path, ...]:
    """The ``*.a3m`` files of one chain's alignment folder (or its ``a3m/``), reference order.

    Raises:
        DataError: the folder or a file is reached through a link out of ``root``.
    """
    found = {p.name: p for p in _named(chain_dir, ".a3m", root, "a3m alignment")}
    known = [found.pop(name) for name in A3M_ORDER if name in found]
    return tuple(known + [found[name] for name in sorted(found)])


def hhr_files(chain_dir: Path, root: Path) -> tuple[Path, ...]:
    """The ``*.hhr`` files of one chain's alignment folder (or its ``hhr/``), by name.

    Raises:
        DataError: the folder or a file is reached through a link out of ``root``.
    """
    return tuple(_named(chain_dir, ".hhr", root, "hhr file"))


def chain_entry(split_dir: Path, chain_dir: Path) -> ChainEntry:
    """The sample of one alignment folder ``<pdb_id>_<chain_id>`` of a split.

    Raises:
        DataError: the folder's name is not ``<pdb_id>_<chain_id>``, it holds no ``*.a3m``,
            its mmCIF file is missing, or a folder or file is reached through a link out of
            ``split_dir``.
    """
    inside(chain_dir, split_dir, "alignment folder")
    pdb_id, _, chain_id = chain_dir.name.rpartition("_")
    if not pdb_id or not chain_id:
        raise DataError("an alignment folder is named <pdb_id>_<chain_id>", path=chain_dir)
    files = a3m_files(chain_dir, split_dir)
    if not files:
        raise DataError("no *.a3m alignment", path=chain_dir)
    cif = mmcif_path(split_dir, pdb_id)
    if cif is None:
        raise DataError(f"no {MMCIF_DIR}/{pdb_id}.cif for this alignment", path=chain_dir)
    return ChainEntry(cif, chain_id, files, Path(split_dir))


def list_chains(split_dir: Path) -> list[ChainEntry]:
    """Every chain of a split folder (layout in the module docstring), sorted by folder name.

    Raises:
        DataError: no ``mmcif_files/`` or ``alignments/`` folder, or one reached through a link
            out of the split, no chain, or as `chain_entry`.
    """
    split_dir = Path(split_dir)
    for name in (MMCIF_DIR, ALIGNMENT_DIR):
        if not (split_dir / name).is_dir():
            raise DataError(f"no {name}/ folder (an OpenFold split holds "
                            f"{MMCIF_DIR}/ and {ALIGNMENT_DIR}/)", path=split_dir)
        inside(split_dir / name, split_dir, f"{name}/ folder")
    entries = [chain_entry(split_dir, chain_dir)
               for chain_dir in sorted((split_dir / ALIGNMENT_DIR).iterdir())
               if not chain_dir.name.startswith(".") and chain_dir.is_dir()]
    if not entries:
        raise DataError("no chain alignment folder", path=split_dir / ALIGNMENT_DIR)
    return entries


def training_set_identity(split_dir: Path) -> str:
    """What identifies a split's chains independently of their files' bytes: the sha256 (hex) of
    one ``<mmCIF stem>_<chain id>:<full sequence>`` line per chain of ``split_dir``, sorted, joined
    with newlines (a coordinate printed with another last digit on another machine does not
    change it). A starting checkpoint records the identity of the chains it was trained on
    (``model.init_checkpoint_data_identity``).

    Raises:
        DataError: as `list_chains` and `mmcif.read_chain`.
    """
    lines = sorted(f"{e.mmcif.name.split('.')[0]}_{e.chain_id}:{mmcif.read_chain(e.mmcif, e.chain_id, e.root).sequence}"
                   for e in list_chains(split_dir))
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def _templates(entry: ChainEntry, length: int, max_templates: int) -> tuple[dict, ...]:
    """The template features of a chain from the ``.hhr`` files beside its alignments, the
    template structures read from the same split's ``mmcif_files/``."""
    if not max_templates or not entry.a3m_files:
        return ()
    chain_dir = entry.a3m_files[0].parent
    chain_dir = chain_dir.parent if chain_dir.name == "a3m" else chain_dir
    hits = [hit for path in hhr_files(chain_dir, entry.root)
            for hit in templates.read_hhr(path, entry.root)]
    pdb_id = chain_dir.name.rpartition("_")[0]
    return tuple(templates.chain_templates(hits, length, pdb_id,
                                           lambda other: mmcif_path(entry.root, other),
                                           max_templates, entry.root))


def read_raw(entry: ChainEntry, max_templates: int = 0, max_msa_rows: int | None = None) -> RawChain:
    """The parsed chain, its merged alignment (its first ``max_msa_rows`` rows, None: all;
    `features.FeatureSizes.msa_rows_read`) and (with ``max_templates``) its templates, every
    file read inside ``entry.root``.

    Raises:
        DataError: as `mmcif.read_chain`, `a3m.read_msa` and `templates.read_hhr`, or an
            alignment whose query is not the chain's sequence (naming the a3m file).
    """
    chain = mmcif.read_chain(entry.mmcif, entry.chain_id, entry.root)
    msa = a3m.read_msa(list(entry.a3m_files), max_msa_rows, entry.root)
    if msa.sequences[0] != chain.sequence:
        raise DataError(f"the query ({len(msa.sequences[0])} residues) is "
                        f"not the sequence of {chain.source} ({len(chain.sequence)} residues)", path=entry.a3m_files[0])
    return RawChain(chain.aatype, chain.residue_index, chain.atom_positions, chain.atom_mask,
                    msa.msa(), msa.deletion_matrix, chain.resolution_A,
                    _templates(entry, len(chain.aatype), max_templates))


def check_length(entry: ChainEntry, residues: int, bound: int | None) -> None:
    """Refuse a validation chain longer than ``bound`` residues (None: no bound), before any
    training: evaluated whole, its pair activations grow as residues squared and its triangle
    attention as residues cubed (docs/openfold.md, "What is refused").

    Raises:
        DataError: one line naming the chain's mmCIF file, chain id and length.
    """
    if bound is not None and residues > bound:
        raise DataError(f"validation chain {entry.chain_id} has {residues} residues, "
                        f"over model.val_max_sequence_length {bound} (the longest chain evaluated "
                        "whole; the reference's validation chains hold at most 700): leave it out "
                        "of the validation split", path=entry.mmcif)


class OpenFoldDataset(WorkloadDataset):
    """Map-style dataset of the chains of one split folder.

    ``dataset[i]`` -> ``(inputs, features)``, dicts of tensors: chain ``i``'s features
    (`features.chain_features`, no batch axis) and the `INPUT_KEYS` among them. Training draws
    a new crop, MSA sample and BERT mask at every read (from a generator seeded by torch's
    seed, the index and a read counter: reproducible for a ``train.seed``); evaluation
    (``train=False``) keeps the whole chain and draws from a generator seeded by ``seed`` and
    the index only, so every evaluation sees the same features. Each read takes the first
    ``sizes.msa_rows_read`` aligned rows of the chain.

    Raises:
        DataError: naming the file (constructor: as `list_chains`, and for evaluation a chain
            longer than ``sizes.val_max_sequence_length``, `check_length`, its length read
            from its first a3m's query; reads: as `read_raw`).
    """

    def __init__(self, split_dir: Path, sizes: FeatureSizes, train: bool,
                 seed: int = 0, limit: int | None = None) -> None:
        self.entries = list_chains(split_dir)
        if limit is not None and limit > len(self.entries):
            raise DataError(f"{len(self.entries)} chains, the config asks for {limit}", path=split_dir)
        self.entries = self.entries[:limit] if limit is not None else self.entries
        self.sizes = sizes if train else FeatureSizes(None, sizes.max_msa_clusters,
                                                      sizes.max_extra_msa, sizes.max_templates,
                                                      sizes.val_max_sequence_length)
        if not train and sizes.val_max_sequence_length is not None:
            for entry in self.entries:
                query = a3m.read_msa([entry.a3m_files[0]], 1, entry.root).sequences[0]
                check_length(entry, len(query), sizes.val_max_sequence_length)
        self.train, self.seed, self._reads = train, seed, 0

    def __len__(self) -> int:
        return len(self.entries)

    def _rng(self, index: int) -> np.random.Generator:
        if not self.train:
            return np.random.default_rng([self.seed, index])
        self._reads += 1
        return np.random.default_rng([torch.initial_seed() % (1 << 63), index, self._reads])

    def __getitem__(self, index: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(inputs, features)``: the `INPUT_KEYS` and every feature of chain ``index``."""
        if not 0 <= index < len(self.entries):
            raise IndexError(f"chain {index} of {len(self.entries)}")
        raw = read_raw(self.entries[index], self.sizes.max_templates, self.sizes.msa_rows_read)
        features = chain_features(raw, self.sizes, self._rng(index))
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)).reshape(v.shape)
                   for k, v in features.items()}
        return {k: tensors[k] for k in INPUT_KEYS}, tensors

    def locate(self, index: int) -> SampleLocation:
        """The mmCIF file of chain ``index`` and the chain's place among that file's samples."""
        entry = self.entries[index]
        return SampleLocation(entry.mmcif, sum(1 for e in self.entries[:index] if e.mmcif == entry.mmcif))

    def collate_fn(self, samples: list[tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]]
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """`collate` of the samples' features."""
        return collate([features for _, features in samples])

    def batch_len(self, x: dict[str, torch.Tensor]) -> int:
        """Chains in a collated batch input: samples/s are chains/s."""
        return int(x["aatype"].shape[0])


def collate(samples: list[dict[str, torch.Tensor]]
            ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Batch B chains: each feature zero-padded to the largest shape among them (residues, MSA
    rows, extra rows), masks marking what is real, and stacked on a new first axis.

    Returns:
        ``(inputs, batch)``: ``inputs`` holds the `INPUT_KEYS` (what the model sees); ``batch``
        holds every feature, inputs and targets (``all_atom_positions [B, N, 37, 3]``,
        ``all_atom_mask [B, N, 37]``, ``true_msa [B, S, N]`` int64, ``bert_mask [B, S, N]``,
        ``resolution [B]``), what the loss and the metric read.
    """
    batch: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        shape = [max(v.shape[d] for v in values) for d in range(values[0].dim())]
        padded = [torch.nn.functional.pad(v, _pad_widths(v.shape, shape)) for v in values]
        batch[key] = torch.stack(padded)
    return {k: batch[k] for k in INPUT_KEYS}, batch


def _pad_widths(have: torch.Size, want: list[int]) -> list[int]:
    """``torch.nn.functional.pad`` widths (last axis first) padding ``have`` up to ``want``."""
    widths: list[int] = []
    for size, target in zip(reversed(have), reversed(want)):
        widths += [0, target - size]
    return widths
