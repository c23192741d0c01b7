"""Multiple sequence alignments in the a3m format (HHblits/HHsuite; the ``.a3m`` files of
OpenProteinSet that the OpenFold reference trains on).

The format, as AlphaFold's ``parsers.parse_a3m`` reads it: FASTA records; the first is the
query. Upper-case letters and ``-`` are match columns (the query's residues, or a gap there);
lower-case letters are insertions relative to the query, dropped from the alignment and counted
instead: ``deletion_matrix[i, j]`` is the number of lower-case letters of sequence ``i`` just
before its match column ``j``. ``.`` (a gap in an insertion column, left by a2m tools) is dropped
and not counted; a trailing ``*`` ends a sequence. Every sequence must have the query's number of
match columns.

Several files of one chain (``uniref90_hits.a3m``, ``bfd_uniclust_hits.a3m``,
``mgnify_hits.a3m``) are merged as the reference's ``make_msa_features`` does: in order, each
aligned sequence kept once (its first occurrence), the query first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlhpc.data.inputs import read_input
from mlhpc.errors import DataError

from .residue_constants import MSA_LETTER_TO_INDEX, UNK_RESTYPE_INDEX


@dataclass(frozen=True)
class Msa:
    """An alignment of S sequences over the query's N match columns.

    Attributes:
        sequences: the S aligned rows (upper case and ``-``, N characters each), query first.
        deletion_matrix: ``[S, N]`` int32 lower-case letters before each match column.
        source: the file(s) read, for messages.
    """

    sequences: tuple[str, ...]
    deletion_matrix: np.ndarray
    source: str

    def msa(self) -> np.ndarray:
        """``[S, N]`` int64 in the MSA alphabet (0..19 residues, 20 X, 21 gap); letters outside
        it read as X (20), as the reference's ``HHBLITS_AA_TO_ID`` does."""
        rows = [[MSA_LETTER_TO_INDEX.get(c, UNK_RESTYPE_INDEX) for c in s] for s in self.sequences]
        return np.asarray(rows, dtype=np.int64).reshape(len(self.sequences), -1)


def parse_a3m(text: str, source: str) -> Msa:
    """One a3m alignment (module docstring).

    Raises:
        DataError: naming ``source`` (and the record): no record, text before the first ``>``,
            a character that is not a letter, ``-``, ``.`` or a final ``*``, or a sequence whose
            match length differs from the query's.
    """
    records = _records(text, source)
    sequences: list[str] = []
    deletions: list[list[int]] = []
    for number, (name, raw) in enumerate(records, start=1):
        aligned, counts = _align_one(raw, source, number)
        if sequences and len(aligned) != len(sequences[0]):
            raise DataError(f"{source}: sequence {number} ({name[:40]!r}) has {len(aligned)} match "
                            f"columns, the query {len(sequences[0])}; every a3m row must align "
                            "to the query")
        sequences.append(aligned)
        deletions.append(counts)
    if not sequences[0]:
        raise DataError(f"{source}: the query sequence is empty")
    matrix = np.asarray(deletions, dtype=np.int32).reshape(len(sequences), len(sequences[0]))
    return Msa(tuple(sequences), matrix, source)


def _records(text: str, source: str) -> list[tuple[str, str]]:
    records: list[tuple[str, list[str]]] = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(">"):
            records.append((line[1:].strip(), []))
        elif not records:
            raise DataError(f"{source}: line {line_no}: sequence before the first '>' header "
                            "(not an a3m file?)")
        else:
            records[-1][1].append(line)
    if not records:
        raise DataError(f"{source}: no sequence (an a3m file holds '>' records, the query first)")
    return [(name, "".join(lines)) for name, lines in records]


def _align_one(raw: str, source: str, number: int) -> tuple[str, list[int]]:
    """The match columns of one a3m row and the deletions before each."""
    raw = raw.removesuffix("*")
    aligned: list[str] = []
    counts: list[int] = []
    pending = 0
    for char in raw:
        if char.islower():
            pending += 1
        elif char.isupper() or char == "-":
            aligned.append(char)
            counts.append(pending)
            pending = 0
        elif char != ".":
            raise DataError(f"{source}: sequence {number}: character {char!r} is not an a3m "
                            "letter (A-Z, a-z, '-', '.')")
    return "".join(aligned), counts


def read_a3m(path: Path, max_bytes: int = 1 << 30) -> Msa:
    """`parse_a3m` of one file (UTF-8 / ASCII).

    Raises:
        DataError: the file cannot be read, is not a regular file, is larger than ``max_bytes``
            (`mlhpc.data.inputs.read_input`), or as `parse_a3m`.
    """
    raw = read_input(path, max_bytes, what="a3m alignment")
    try:
        text = raw.decode("ascii")
    except UnicodeDecodeError:
        raise DataError(f"{path}: not an ASCII a3m file") from None
    return parse_a3m(text, str(path))


def merge(msas: list[Msa]) -> Msa:
    """The alignments of one chain as one (module docstring): rows in order, each aligned
    sequence kept at its first occurrence.

    Raises:
        DataError: no alignment, or two whose queries differ (naming both files).
    """
    if not msas:
        raise DataError("no a3m alignment to merge")
    query = msas[0].sequences[0]
    seen: set[str] = set()
    rows: list[str] = []
    deletions: list[np.ndarray] = []
    for msa in msas:
        if msa.sequences[0] != query:
            raise DataError(f"{msa.source}: its query differs from that of {msas[0].source}")
        for sequence, counts in zip(msa.sequences, msa.deletion_matrix):
            if sequence not in seen:
                seen.add(sequence)
                rows.append(sequence)
                deletions.append(counts)
    return Msa(tuple(rows), np.stack(deletions), ", ".join(m.source for m in msas))


def format_a3m(names: list[str], rows: list[str]) -> str:
    """a3m text of named rows (already in a3m form: lower-case insertions); the first is the
    query. The writer of the embedded data."""
    return "".join(f">{name}\n{row}\n" for name, row in zip(names, rows))
