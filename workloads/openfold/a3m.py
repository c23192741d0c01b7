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

A file is streamed, never read whole (`read_msa`): rows are parsed as they arrive and reading
stops once the merged alignment holds the rows the features can use (``max_rows``,
`features.FeatureSizes.msa_rows_read`); each further file's query is still read and compared.
One record (header and sequence lines) may hold at most `A3M_RECORD_BYTES`.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlhpc.data.inputs import input_chunks
from mlhpc.errors import DataError

from .residue_constants import MSA_LETTER_TO_INDEX, UNK_RESTYPE_INDEX

#: The largest a3m file opened (it is streamed and read only up to the rows used).
A3M_BYTES = 1 << 30
#: The most characters of one a3m record: an aligned row of the longest protein chain (titin,
#: 34,350 residues) with as many insertions again is under 70,000; 1 MiB is 15 times that.
A3M_RECORD_BYTES = 1 << 20

#: MSA alphabet index of each byte (`Msa.msa`): the letters of ``MSA_LETTER_TO_INDEX``, X else.
_MSA_INDEX = np.full(256, UNK_RESTYPE_INDEX, dtype=np.int64)
for _letter, _index in MSA_LETTER_TO_INDEX.items():
    _MSA_INDEX[ord(_letter)] = _index
#: `str.translate` tables: drop the insertions (lower case, '.'); drop every a3m letter.
_DROP_INSERTIONS = str.maketrans("", "", string.ascii_lowercase + ".")
_DROP_LETTERS = str.maketrans("", "", string.ascii_letters + "-.")
#: Text of the rows whose deletions are counted at once (`_Deletions`).
_BLOCK_BYTES = 1 << 22


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
        # one table look-up over every row's bytes; a non-ASCII letter becomes '?', read as X
        codes = np.frombuffer("".join(self.sequences).encode("ascii", "replace"), dtype=np.uint8)
        return _MSA_INDEX[codes].reshape(len(self.sequences), -1)


def parse_a3m(text: str, source: str) -> Msa:
    """One a3m alignment (module docstring).

    Raises:
        DataError: naming ``source`` (and the record): no record, text before the first ``>``,
            a character that is not a letter, ``-``, ``.`` or a final ``*``, a sequence whose
            match length differs from the query's, or a record over `A3M_RECORD_BYTES`.
    """
    rows = list(_rows(_records(enumerate(text.splitlines(), start=1), source), source))
    return Msa(tuple(r[0] for r in rows), deletion_matrix([r[1] for r in rows], len(rows[0][0])),
               source)


def deletion_matrix(rows: list[str], width: int) -> np.ndarray:
    """``[len(rows), width]`` int32: the lower-case letters of each a3m row (checked by
    `file_rows`: ``width`` match columns, letters, ``-`` and ``.`` only) just before each of
    its match columns; those after the last one are not counted.

    Vectorised over the rows at once: a running count of lower-case bytes over their joined
    text, taken at each match column (upper case or ``-``) and differenced along the row, the
    first column against the count before the row's first byte.
    """
    if not rows:
        return np.zeros((0, width), dtype=np.int32)
    codes = np.frombuffer("".join(rows).encode("ascii"), dtype=np.uint8)
    # inserted[k]: lower-case bytes among the first k bytes of the joined text
    inserted = np.concatenate([[0], np.cumsum(codes >= ord("a"), dtype=np.int64)])
    # upper case (65-90) and '-' (45) are the match columns; '.' (46) is neither
    match = np.flatnonzero((codes < ord("a")) & (codes != ord(".")))
    at_match = inserted[match + 1].reshape(len(rows), width)
    lengths = np.fromiter(map(len, rows), dtype=np.int64, count=len(rows))
    before = inserted[np.cumsum(lengths) - lengths]
    return np.diff(at_match, axis=1, prepend=before[:, None]).astype(np.int32)


class _Deletions:
    """`deletion_matrix` of rows arriving one at a time, counted in blocks of at most
    `_BLOCK_BYTES` of text, so that the temporaries stay small for any file."""

    def __init__(self) -> None:
        self.blocks: list[np.ndarray] = []
        self.pending: list[str] = []
        self.size = 0

    def add(self, row: str, width: int) -> None:
        self.pending.append(row)
        self.size += len(row)
        if self.size >= _BLOCK_BYTES:
            self.blocks.append(deletion_matrix(self.pending, width))
            self.pending, self.size = [], 0

    def matrix(self, width: int) -> np.ndarray:
        return np.concatenate(self.blocks + [deletion_matrix(self.pending, width)])


def _records(lines: Iterable[tuple[int, str]], source: str) -> Iterator[tuple[str, str]]:
    """``(name, sequence text)`` of each record, in order."""
    name, parts, size = None, [], 0
    for line_no, line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith(">"):
            if name is not None:
                yield name, "".join(parts)
            name, parts, size = line[1:].strip(), [], 0
        elif name is None:
            raise DataError(f"line {line_no}: sequence before the first '>' header "
                            "(not an a3m file?)", path=source)
        else:
            size += len(line)
            if size > A3M_RECORD_BYTES:
                raise DataError(f"line {line_no}: record {name[:40]!r} holds more than "
                                f"the {A3M_RECORD_BYTES} characters an a3m row may hold", path=source)
            parts.append(line)
    if name is None:
        raise DataError("no sequence (an a3m file holds '>' records, the query first)", path=source)
    yield name, "".join(parts)


def _rows(records: Iterable[tuple[str, str]], source: str) -> Iterator[tuple[str, str]]:
    """``(aligned row, row text)`` of each record (`_align_one`), each checked against the
    query."""
    width = None
    for number, (name, raw) in enumerate(records, start=1):
        aligned, text = _align_one(raw, source, number)
        if width is None and not aligned:
            raise DataError("the query sequence is empty", path=source)
        if width is not None and len(aligned) != width:
            raise DataError(f"sequence {number} ({name[:40]!r}) has {len(aligned)} match "
                            f"columns, the query {width}; every a3m row must align to the query", path=source)
        width = len(aligned) if width is None else width
        yield aligned, text


def _lines(chunks: Iterable[bytes], source: str) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of ASCII text arriving in pieces, none longer than
    `A3M_RECORD_BYTES`."""
    pending, number = b"", 0
    for chunk in chunks:
        if not chunk.isascii():
            raise DataError("not an ASCII a3m file", path=source)
        *lines, pending = (pending + chunk).split(b"\n")
        if len(pending) > A3M_RECORD_BYTES:
            raise DataError(f"line {number + len(lines) + 1} is longer than the "
                            f"{A3M_RECORD_BYTES} characters an a3m row may hold", path=source)
        for line in lines:
            number += 1
            yield number, line.decode("ascii")
    if pending:
        yield number + 1, pending.decode("ascii")


def file_rows(path: Path, root: Path | None = None) -> Iterator[tuple[str, str]]:
    """The rows of one a3m file as they are read, query first: ``(aligned row, row text)``, the
    text checked (a3m letters, the query's match columns) with its final ``*`` removed, for
    `deletion_matrix`; streamed through `mlhpc.data.inputs.input_chunks` (a regular file of at most
    `A3M_BYTES`, not reached through a link out of ``root``). Close it to stop reading early.

    Raises:
        DataError: as `open_input` and `parse_a3m`, or bytes that are not ASCII.
    """
    chunks = input_chunks(path, A3M_BYTES, root, "a3m alignment", DataError)
    with closing(chunks):
        yield from _rows(_records(_lines(chunks, str(path)), str(path)), str(path))


def _align_one(raw: str, source: str, number: int) -> tuple[str, str]:
    """``(match columns, checked text)`` of one a3m row: `str.translate` drops the insertions
    (lower case, ``.``); the text, its final ``*`` removed, is kept for `deletion_matrix`."""
    raw = raw.removesuffix("*")
    stray = raw.translate(_DROP_LETTERS)
    if stray:
        raise DataError(f"sequence {number}: character {stray[0]!r} is not an a3m "
                        "letter (A-Z, a-z, '-', '.')", path=source)
    return raw.translate(_DROP_INSERTIONS), raw


def read_a3m(path: Path, root: Path | None = None, max_rows: int | None = None) -> Msa:
    """`parse_a3m` of one file, streamed (`file_rows`), at most ``max_rows`` rows (None: all).

    Raises:
        DataError: as `file_rows`.
    """
    return read_msa([path], max_rows, root)


def read_msa(paths: list[Path], max_rows: int | None, root: Path | None = None) -> Msa:
    """The alignments of one chain merged as `merge` does, streamed: reading stops once the
    merged alignment holds ``max_rows`` rows (None: every row); every file's query is still
    read and compared with the first's.

    Raises:
        DataError: no file, as `file_rows`, or two files whose queries differ (naming both).
    """
    if not paths:
        raise DataError("no a3m alignment to merge")
    seen: set[str] = set()
    rows: list[str] = []
    deletions = _Deletions()
    for path in paths:
        with closing(file_rows(path, root)) as stream:
            for number, (sequence, text) in enumerate(stream):
                if number == 0 and rows and sequence != rows[0]:
                    raise DataError(f"its query differs from that of {paths[0]}", path=path)
                if max_rows is not None and len(rows) >= max_rows:
                    break
                if sequence not in seen:
                    seen.add(sequence)
                    rows.append(sequence)
                    deletions.add(text, len(rows[0]))
    return Msa(tuple(rows), deletions.matrix(len(rows[0])), ", ".join(map(str, paths)))


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
            raise DataError(f"its query differs from that of {msas[0].source}", path=msa.source)
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
