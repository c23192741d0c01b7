"""Structural templates from HHsearch result files (``.hhr``, OpenProteinSet's
``pdb70_hits.hhr``), as AlphaFold's ``parsers.parse_hhr`` and template featuriser read them.

An ``.hhr`` file lists hits (``No k`` blocks): a ``>`` line naming the template (``<pdb_id>_
<chain_id>``), then alignment blocks whose ``Q <name> <start> <residues> <end>`` and ``T <name>
<start> <residues> <end>`` lines align query and template residues (1-based, ``-`` a gap). A hit
becomes template features for the query: each aligned query residue takes the atoms of its
template residue (the template chain read from its mmCIF file, `mmcif.read_chain`), the others
stay masked with the gap type 21. Hits of the query's own PDB entry, and hits whose mmCIF file
is not at hand, are skipped; the first ``max_templates`` remaining are used, in file order.

A hit's name is read from the data, so it is a name, never a path: it must be a PDB entry and
chain id (letters, digits, ``_`` and ``-``, at most 64 characters, `HIT_NAME`); anything else (a
``/``, ``..``, an absolute path, a NUL) is refused with one line naming the ``.hhr`` file and
the hit. Every file is read inside the data tree it was found in (``root``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlhpc.data.inputs import read_text_input
from mlhpc.errors import DataError

from .mmcif import read_chain
from .residue_constants import ATOM_ORDER, MSA_GAP_INDEX

HHR_BYTES = 1 << 28
#: A template's name in an ``.hhr`` file: ``<pdb_id>_<chain_id>`` (pdb70's, e.g. ``1abc_A``;
#: extended PDB ids, ``pdb_00001abc``, and chain ids of up to 4 characters fit).
HIT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_ALIGNED = re.compile(r"^([QT]) (\S+)\s+(\d+) ([A-Za-z-]+)\s+(\d+) \(\d+\)\s*$")


#: The largest residue number an alignment line may give: far above any chain mlhpc reads (the
#: mmCIF cap allows a few million atoms), small enough for int64 pair arithmetic.
MAX_RESIDUE_NUMBER = 10_000_000


@dataclass(frozen=True)
class TemplateHit:
    """One hit: ``name`` (``<pdb_id>_<chain_id>``) and ``pairs`` ``[M, 2]`` int64, the 0-based
    (query residue, template residue) of every aligned pair."""

    name: str
    pairs: np.ndarray


def _pairs(query: str, template: str, q_start: int, t_start: int) -> list[tuple[int, int]]:
    pairs, q, t = [], q_start - 1, t_start - 1
    for a, b in zip(query, template):
        if a != "-" and b != "-":
            pairs.append((q, t))
        q += a != "-"
        t += b != "-"
    return pairs


def parse_hhr(text: str, source: str) -> list[TemplateHit]:
    """The hits of an ``.hhr`` text, in file order.

    Raises:
        DataError: naming ``source`` and the hit: a hit without a ``>`` line, or whose query and
            template lines differ in length.
    """
    hits: list[TemplateHit] = []
    name, pairs, query = None, [], None
    for line in text.splitlines() + ["No end"]:
        if line.startswith("No ") and (name is not None or pairs):
            if name is None:
                raise DataError("a hit without a '>' line", path=source)
            hits.append(TemplateHit(name, np.asarray(pairs, dtype=np.int64).reshape(-1, 2)))
            name, pairs = None, []
        elif line.startswith(">"):
            name = _hit_name(line, source, len(hits) + 1)
        match = _ALIGNED.match(line)
        if match and match.group(2) not in ("ss_pred", "ss_dssp", "Consensus"):
            if match.group(1) == "Q":
                query = match
            elif query is None or len(match.group(4)) != len(query.group(4)):
                raise DataError(f"hit {name!r}: template and query lines differ in length", path=source)
            else:
                starts = (_residue_number(query.group(3), source, name),
                          _residue_number(match.group(3), source, name))
                pairs += _pairs(query.group(4), match.group(4), *starts)
    return hits


def _residue_number(text: str, source: str, name: str | None) -> int:
    """A 1-based residue number of an alignment line, within 1 .. `MAX_RESIDUE_NUMBER`."""
    if not text.isascii() or not text.isdecimal() or len(text) > 9 or not 1 <= int(text) <= MAX_RESIDUE_NUMBER:
        raise DataError(f"hit {name!r}: residue number {text[:20]!r} is not within "
                        f"1 .. {MAX_RESIDUE_NUMBER}", path=source)
    return int(text)


def _hit_name(line: str, source: str, number: int) -> str:
    """The template name of a hit's ``>`` line, checked to be a name (`HIT_NAME`)."""
    words = line[1:].split()
    name = words[0] if words else ""
    if not HIT_NAME.fullmatch(name):
        raise DataError(f"hit {number}: template name {name[:80]!r} is not a PDB entry "
                        "and chain id (<pdb_id>_<chain_id>: letters, digits, '_' or '-'); names "
                        "read from data are never paths", path=source)
    return name


def read_hhr(path: Path, root: Path | None = None) -> list[TemplateHit]:
    """`parse_hhr` of a file, read through `mlhpc.data.inputs` (at most `HHR_BYTES`, not reached
    through a link out of ``root``). Raises DataError (unreadable file, or as `parse_hhr`)."""
    text = read_text_input(path, HHR_BYTES, root, "hhr file", DataError)
    return parse_hhr(text, str(path))


def hit_features(hit: TemplateHit, query_length: int, mmcif: Path,
                 root: Path | None = None) -> dict[str, np.ndarray]:
    """One template's features over the query's residues (N = ``query_length``):
    ``template_aatype [N]`` int64, ``template_all_atom_positions [N, 37, 3]`` Angstrom,
    ``template_all_atom_mask [N, 37]``, ``template_pseudo_beta [N, 3]`` (C-beta, C-alpha for
    glycine), ``template_pseudo_beta_mask [N]``.

    Raises:
        DataError: as `mmcif.read_chain` (``root``: the data tree), or an aligned pair outside
            the query or template.
    """
    chain = read_chain(mmcif, hit.name.rpartition("_")[2], root)
    pairs = hit.pairs
    if len(pairs) and (pairs[:, 0].max() >= query_length or pairs[:, 1].max() >= len(chain.aatype)):
        raise DataError(f"template {hit.name} aligned beyond the query or the chain", path=mmcif)
    aatype = np.full(query_length, MSA_GAP_INDEX, dtype=np.int64)
    positions = np.zeros((query_length, 37, 3), dtype=np.float32)
    mask = np.zeros((query_length, 37), dtype=np.float32)
    q, t = pairs[:, 0], pairs[:, 1]
    aatype[q], positions[q], mask[q] = chain.aatype[t], chain.atom_positions[t], chain.atom_mask[t]
    glycine = aatype == 7
    beta = np.where(glycine, ATOM_ORDER["CA"], ATOM_ORDER["CB"])
    rows = np.arange(query_length)
    return {"template_aatype": aatype, "template_all_atom_positions": positions,
            "template_all_atom_mask": mask, "template_pseudo_beta": positions[rows, beta],
            "template_pseudo_beta_mask": mask[rows, beta]}


def chain_templates(hits: list[TemplateHit], query_length: int, query_pdb_id: str,
                    find_mmcif: Callable[[str], Path | None], limit: int,
                    root: Path | None = None) -> list[dict[str, np.ndarray]]:
    """The features of the first ``limit`` usable hits (module docstring); ``find_mmcif`` maps a
    hit's PDB id (a checked name) to its mmCIF file in the data tree ``root``, or None."""
    found = []
    for hit in hits:
        pdb_id = hit.name.rpartition("_")[0]
        path = find_mmcif(pdb_id) if pdb_id and pdb_id.lower() != query_pdb_id.lower() else None
        if path is not None and len(hit.pairs):
            found.append(hit_features(hit, query_length, path, root))
        if len(found) == limit:
            break
    return found
