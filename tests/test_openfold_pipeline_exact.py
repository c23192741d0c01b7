"""The vectorised OpenFold input pipeline gives exactly what the character loops and one-hot
sums it replaced gave: each is compared, bit for bit, with a small copy of the former code
(the a3m row alignment, the MSA alphabet look-up, the clustering and the MSA profile) on
random rows and alignments, edge cases included."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from mlhpc_workloads.openfold import a3m, features
from mlhpc_workloads.openfold.residue_constants import MSA_LETTER_TO_INDEX, UNK_RESTYPE_INDEX

from mlhpc.errors import DataError

# ------------------------------------------------------------- the former code, for reference


def _align_loop(raw: str) -> tuple[str, list[int]]:
    """The former `a3m._align_one`: one character at a time."""
    raw = raw.removesuffix("*")
    aligned, counts, pending = [], [], 0
    for char in raw:
        if char.islower():
            pending += 1
        elif char.isupper() or char == "-":
            aligned.append(char)
            counts.append(pending)
            pending = 0
        elif char != ".":
            raise ValueError(char)
    return "".join(aligned), counts


def _msa_loop(sequences: tuple[str, ...]) -> np.ndarray:
    rows = [[MSA_LETTER_TO_INDEX.get(c, UNK_RESTYPE_INDEX) for c in s] for s in sequences]
    return np.asarray(rows, dtype=np.int64).reshape(len(sequences), -1)


def _one_hot(values: np.ndarray, classes: int) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[values]


def _clusters_einsum(centres, centre_del, rest, rest_del):
    """The former `features.cluster_profiles`: one-hot einsum and scatter-adds."""
    weights = np.ones(23, dtype=np.float32)
    weights[21:] = 0.0
    centre_1hot, rest_1hot = _one_hot(centres, 23), _one_hot(rest, 23)
    agreement = np.einsum("rnc,snc->rs", rest_1hot, centre_1hot * weights)
    assignment = agreement.argmax(axis=1) if len(rest) else np.zeros(0, dtype=np.int64)
    counts = 1e-6 + 1.0 + np.zeros(centres.shape, dtype=np.float32)
    profile_sum = centre_1hot.copy()
    deletion_sum = centre_del.astype(np.float32).copy()
    np.add.at(profile_sum, assignment, rest_1hot)
    np.add.at(deletion_sum, assignment, rest_del.astype(np.float32))
    np.add.at(counts, assignment, np.ones(rest.shape, dtype=np.float32))
    return profile_sum / counts[..., None], deletion_sum / counts


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# ------------------------------------------------------------------------ random a3m rows

UPPER, LOWER = "ACDEFGHIKLMNPQRSTVWYXBZUJO", "acdefghiklmnpqrstvwyxbzujo"


def _row(rng: np.random.Generator, width: int) -> str:
    """An a3m row of ``width`` match columns (letters and gaps) with insertion runs (lower
    case and '.') anywhere, at the start and the end included, sometimes a final '*'."""
    parts = []
    for column in range(width + 1):
        if rng.random() < 0.4:
            run = int(rng.integers(1, 9))
            parts.append("".join(rng.choice(list(LOWER + "."), run)))
        if column < width:
            parts.append("-" if rng.random() < 0.2 else str(rng.choice(list(UPPER))))
    return "".join(parts) + ("*" if rng.random() < 0.2 else "")


EDGE_ROWS = ["MKVL", "mkvlMKVL", "MKVLmkvl", "....MKVL....", "M-K-", "----", "aMbKcVdL*",
             "M..k.KV.l.L", "mmmmmmmmmmmmmmmmmmmmmmmmmMKVLq"]


def test_a3m_rows_align_as_the_character_loop_did():
    rng = np.random.default_rng(0)
    for width in (1, 4, 17, 256):
        rows = [_row(rng, width) for _ in range(60)] + (EDGE_ROWS if width == 4 else [])
        query = "".join(rng.choice(list(UPPER), width))
        msa = a3m.parse_a3m(a3m.format_a3m([str(k) for k in range(len(rows) + 1)], [query] + rows), "r.a3m")
        expected = [_align_loop(r) for r in [query] + rows]
        assert msa.sequences == tuple(e[0] for e in expected)
        assert _same_bits(msa.deletion_matrix, np.asarray([e[1] for e in expected], dtype=np.int32))
        assert _same_bits(msa.msa(), _msa_loop(msa.sequences))


def test_deletion_matrix_of_rows_without_match_columns_or_without_rows():
    rows = ["", "abc", "..a."]
    assert a3m.deletion_matrix(rows, 0).shape == (3, 0)
    assert a3m.deletion_matrix([], 5).shape == (0, 5)
    assert a3m.deletion_matrix(["abcD", "Dgg", ".D", "a.bD"], 1).tolist() == [[3], [0], [0], [2]]


def test_read_msa_counted_in_blocks_equals_one_parse(tmp_path: Path, monkeypatch):
    """Rows counted in several blocks (a block of a few rows' text) give the same matrix."""
    rng = np.random.default_rng(1)
    rows = ["MKVLAG"] + [_row(rng, 6) for _ in range(200)]
    text = a3m.format_a3m([str(k) for k in range(len(rows))], rows)
    path = tmp_path / "hits.a3m"
    path.write_text(text)
    whole = a3m.parse_a3m(text, "hits.a3m")
    monkeypatch.setattr(a3m, "_BLOCK_BYTES", 40)
    read = a3m.read_a3m(path, tmp_path)
    assert read.sequences == whole.sequences  # merged: each aligned row once
    kept = [whole.sequences.index(s) for s in read.sequences]
    assert _same_bits(read.deletion_matrix, whole.deletion_matrix[kept])
    assert len(a3m.read_a3m(path, tmp_path, max_rows=7).sequences) == 7


def test_letters_outside_the_alphabet_read_as_x_and_bad_characters_are_named():
    msa = a3m.Msa(("BZUJOX-A", "é?*#!ABC"), np.zeros((2, 8), np.int32), "m")
    assert _same_bits(msa.msa(), _msa_loop(msa.sequences))
    for row, bad in (("MK1L", "1"), ("MK*L", "*"), ("MK L", " "), ("MKéL", "é"), ("MKVL**", "*")):
        with pytest.raises(DataError, match=rf"t\.a3m: sequence 2: character '{re.escape(bad)}' is not an a3m letter"):
            a3m.parse_a3m(f">q\nMKVL\n>h\n{row}\n", "t.a3m")


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("centres_n, rest_n, columns", [(4, 0, 8), (5, 300, 12), (124, 400, 32),
                                                        (2, 50, 3)])
def test_cluster_profiles_equal_the_einsum_and_scatter_adds(centres_n, rest_n, columns):
    """Clusters of up to hundreds of members (the float32 count past 16, where 1e-6 is lost)."""
    rng = np.random.default_rng(centres_n + rest_n)
    centres = rng.integers(0, 23, (centres_n, columns))  # masked centres: 22 is the mask token
    rest = rng.integers(0, 22, (rest_n, columns))
    rest[: rest_n // 2] = centres[0, None]  # a crowded cluster, and ties between centres
    centres[-1] = centres[0]
    centre_del = rng.integers(0, 5, centres.shape).astype(np.int32)
    rest_del = rng.integers(0, 400, rest.shape).astype(np.int32)
    ours = features.cluster_profiles(centres, centre_del, rest, rest_del)
    theirs = _clusters_einsum(centres, centre_del, rest, rest_del)
    assert _same_bits(ours[0], theirs[0]) and _same_bits(ours[1], theirs[1])


@pytest.mark.parametrize("rows", [1, 3, 2296])
def test_msa_profile_equals_the_one_hot_mean(rows):
    msa = np.random.default_rng(rows).integers(0, 22, (rows, 40))
    msa[:, :3] = 21
    assert _same_bits(features.msa_profile(msa), _one_hot(msa, 22).mean(axis=0))
