"""Structure-free baselines of the embedded data: what lDDT-Ca a predictor reaches without
reading a sequence, so that the mini task provably needs the network.

- ``helix``: every chain predicted as an ideal alpha helix of its length;
- ``mean by length``: every chain predicted as the mean C-alpha structure of the training chains
  of its length (superposed, `geometry.mean_structure`; the nearest length present when none
  has its own, cut to size).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .data import list_chains
from .geometry import helix_ca, mean_structure
from .lddt import lddt
from .mmcif import CA, read_chain


def ca_traces(split_dir: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(ca [N, 3] Angstrom, mask [N])`` of every chain of a split folder (`data.list_chains`).

    Raises:
        DataError: as `data.list_chains` and `mmcif.read_chain`.
    """
    traces = []
    for entry in list_chains(split_dir):
        chain = read_chain(entry.mmcif, entry.chain_id)
        traces.append((chain.atom_positions[:, CA].astype(np.float64), chain.atom_mask[:, CA]))
    return traces


def _score(predicted: np.ndarray, true: np.ndarray, mask: np.ndarray) -> float:
    return float(lddt(torch.from_numpy(predicted), torch.from_numpy(true), torch.from_numpy(mask)))


def helix_baseline(validation: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean lDDT-Ca of ideal helices against the validation chains."""
    return float(np.mean([_score(helix_ca(len(ca)), ca, mask) for ca, mask in validation]))


def mean_structure_baseline(train: list[tuple[np.ndarray, np.ndarray]],
                            validation: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Mean lDDT-Ca of the training set's mean structure by length against the validation
    chains (fully resolved training chains only)."""
    by_length: dict[int, list[np.ndarray]] = {}
    for ca, mask in train:
        if mask.all():
            by_length.setdefault(len(ca), []).append(ca)
    means = {n: mean_structure(group) for n, group in by_length.items()}
    scores = []
    for ca, mask in validation:
        n = len(ca)
        longer = [m for m in means if m >= n]
        nearest = min(longer, key=lambda m: m - n) if longer else max(means)
        predicted = means[nearest][:n]
        if len(predicted) < n:  # shorter than every training chain: extend by a helix
            predicted = np.concatenate([predicted, helix_ca(n)[len(predicted):]])
        scores.append(_score(predicted, ca, mask))
    return float(np.mean(scores))
