"""Embedded OpenFold mini data: synthetic protein chains whose fold follows from their sequence,
with alignments of homologues, written as mmCIF and a3m files so that the real readers run.

What is made:

1. Sequences from a segment grammar: helices (7-12 residues of A L E K M Q R), strands (4-7 of
   V I Y F W T C) and loops (2-4 of G N D P S H) alternate; each residue is swapped for a random
   amino acid with probability ``noise``.
2. Backbones from local sequence motifs: residue i's torsions (phi, psi) follow from its own
   class and its neighbours': a helix former beside another takes the alpha-helix torsions
   (-57, -47), an isolated one (-80, 150); a strand former beside another takes (-120, 130), an
   isolated one (-95, 5); each loop residue its own (G 80/10, N -90/0, D -70/-30, P -65/145,
   S -80/165, H -100/120). Chains are built with ideal geometry (`geometry.backbone`, C-beta
   from N/CA/C; no atom past C-beta) and kept only when compact (radius of gyration at most
   ``2.2 * N**0.38 * compactness`` Angstrom), free of clashes (C-alpha pairs three or more
   residues apart at least 4 Angstrom apart) and holding tertiary contacts (at least N/4 C-beta
   pairs six or more residues apart closer than 8 Angstrom): the fold is a function of the
   sequence, and distant residues touch.
3. Alignments: ``msa_depth`` homologues of each chain. A homologue keeps each residue's class
   (so it shares the fold); a position mutates within its class with probability
   ``mutation_rate``; each contact pair (C-beta closer than 8 Angstrom, six or more apart)
   mutates jointly with probability ``coupling_rate``, its second letter tied to the first by a
   shift fixed for the pair, so the columns of residues in contact co-vary. Homologues may lose
   their ends (gaps ``-``) and carry insertions (lower-case letters, counted as deletions).

Independence: chain ``i`` of split ``s`` draws from ``numpy.random.default_rng([seed, s, i])``
(training ``s = 0``, validation ``s = 1``): no two chains share a draw.

Layout (`data`'s): ``<split>/mmcif_files/<id>.cif`` and ``<split>/alignments/<id>_A/
synthetic_hits.a3m``, splits ``train`` and ``validation``; bytes identical for a seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from mlhpc.config import Section
from mlhpc.data.files import atomic_output
from mlhpc.data.pool import map_in_order
from mlhpc.errors import DataError
from mlhpc.workload import NO_PROGRESS, SynthProgress

from . import geometry
from .a3m import format_a3m
from .data import ALIGNMENT_DIR, MMCIF_DIR
from .synth_cif import format_mmcif

SPLITS = {"train": 0, "validation": 1}
HELIX, STRAND, LOOP = "ALEKMQR", "VIYFWTC", "GNDPSH"
_CLASS_OF = {**{c: 0 for c in HELIX}, **{c: 1 for c in STRAND}, **{c: 2 for c in LOOP}}
_LOOP_TORSIONS = {"G": (80.0, 10.0), "N": (-90.0, 0.0), "D": (-70.0, -30.0),
                  "P": (-65.0, 145.0), "S": (-80.0, 165.0), "H": (-100.0, 120.0)}
_TABLE = np.array([[ord(c) for c in (s * 2)[:7]] for s in (HELIX, STRAND, LOOP)], dtype=np.uint8)
_SIZES = np.array([len(HELIX), len(STRAND), len(LOOP)])
_CLASS_CODE = np.full(256, 2, dtype=np.int64)
_LOOP_CODE = np.zeros(256, dtype=np.int64)
for _letter, _cls in _CLASS_OF.items():
    _CLASS_CODE[ord(_letter)] = _cls
for _k, _letter in enumerate(LOOP):
    _LOOP_CODE[ord(_letter)] = _k
#: (phi, psi) of each motif: helix paired / isolated, strand paired / isolated, then each loop
#: letter in the order of LOOP.
_MOTIF_TORSIONS = np.array([geometry.HELIX_PHI_PSI, (-80.0, 150.0), (-120.0, 130.0), (-95.0, 5.0)]
                           + [_LOOP_TORSIONS[c] for c in LOOP])
_SEGMENTS = tuple(np.frombuffer(s.encode("ascii"), dtype="S1") for s in (HELIX, STRAND, LOOP))
_ALL_LETTERS = np.frombuffer((HELIX + STRAND + LOOP).encode("ascii"), dtype=np.uint8)
_CANDIDATES = 64  # chains built at once per rejection round


class SynthConfig(Section):
    """The ``synth`` section of an OpenFold config: what `synthesize` writes (module docstring)."""

    train_chains: int = Field(1000, ge=1, description="training chains")
    validation_chains: int = Field(100, ge=1, description="validation chains")
    min_length: int = Field(32, ge=16, description="shortest chain, residues")
    max_length: int = Field(48, ge=16, description="longest chain, residues")
    msa_depth: int = Field(64, ge=1, description="aligned sequences per chain, the query included")
    mutation_rate: float = Field(0.3, ge=0, le=1, description="per-position mutation probability "
                                 "of a homologue (within the residue's class)")
    coupling_rate: float = Field(0.5, ge=0, le=1, description="probability that a contact pair "
                                 "mutates jointly in a homologue")
    noise: float = Field(0.08, ge=0, le=1, description="probability that a residue of the "
                         "grammar is swapped for a random amino acid")
    compactness: float = Field(1.5, gt=0, description="radius-of-gyration limit, in units of "
                               "2.2 * N**0.38 Angstrom")
    workers: int = Field(2, ge=1, description="processes; the bytes do not depend on it")


def grammar_sequence(length: int, noise: float, rng: np.random.Generator) -> str:
    """A sequence of ``length`` residues from the segment grammar (step 1)."""
    segments = length // 6 + 2
    kinds = rng.integers(2, size=segments)
    sizes = np.where(kinds == 0, rng.integers(7, 13, segments), rng.integers(4, 8, segments))
    loops = rng.integers(2, 5, segments)
    classes = np.repeat(np.stack([kinds, np.full(segments, 2)], 1).ravel(),
                        np.stack([sizes, loops], 1).ravel())[:length]
    letters = _TABLE[classes, (rng.random(length) * _SIZES[classes]).astype(int)]
    swap = rng.random(length) < noise
    letters = np.where(swap, _ALL_LETTERS[rng.integers(len(_ALL_LETTERS), size=length)], letters)
    return letters.tobytes().decode("ascii")


def torsions(sequence: str) -> tuple[np.ndarray, np.ndarray]:
    """``(phi, psi)`` ``[N]`` degrees of each residue from its local motif (step 2)."""
    codes = np.frombuffer(sequence.encode("ascii"), dtype=np.uint8)
    cls = _CLASS_CODE[codes]
    prev = np.concatenate([[-1], cls[:-1]])
    nxt = np.concatenate([cls[1:], [-1]])
    paired = (prev == cls) | (nxt == cls)
    motif = np.where(cls == 2, 4 + _LOOP_CODE[codes], cls * 2 + (~paired))
    return _MOTIF_TORSIONS[motif, 0], _MOTIF_TORSIONS[motif, 1]


def acceptable(ca: np.ndarray, cb: np.ndarray, compactness: float) -> np.ndarray:
    """Step 2's filter on K chains (C-alpha and C-beta ``[K, N, 3]``): ``[K]`` bool, True for
    the compact, clash-free chains with tertiary contacts."""
    n = ca.shape[1]
    rg = np.sqrt(((ca - ca.mean(1, keepdims=True)) ** 2).sum(-1).mean(-1))
    apart = np.abs(np.arange(n)[:, None] - np.arange(n)[None])
    d_ca = np.linalg.norm(ca[:, :, None] - ca[:, None], axis=-1)
    clash = ((d_ca < 4.0) & (apart >= 3)).any(axis=(1, 2))
    d_cb = np.linalg.norm(cb[:, :, None] - cb[:, None], axis=-1)
    contacts = ((d_cb < 8.0) & (apart >= 6)).sum(axis=(1, 2)) // 2
    return (rg <= 2.2 * n ** 0.38 * compactness) & ~clash & (contacts >= n / 4)


def contact_pairs(cb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Index arrays ``(i, j)``, i < j - 5, of C-beta pairs closer than 8 Angstrom."""
    d = np.linalg.norm(cb[:, None] - cb[None], axis=-1)
    i, j = np.nonzero(np.triu(d < 8.0, k=6))
    return i, j


def fold_chain(cfg: SynthConfig, rng: np.random.Generator, max_rounds: int = 400
               ) -> tuple[str, np.ndarray]:
    """A sequence and its atoms ``[N, 5, 3]`` (N, CA, C, O, CB; Angstrom) passing `acceptable`.

    Raises:
        DataError: no candidate passed in ``max_rounds`` rounds (the compactness too strict).
    """
    length = int(rng.integers(cfg.min_length, cfg.max_length + 1))
    for _ in range(max_rounds):
        sequences = [grammar_sequence(length, cfg.noise, rng) for _ in range(_CANDIDATES)]
        angles = [torsions(s) for s in sequences]
        atoms = geometry.backbone(np.stack([a[0] for a in angles]), np.stack([a[1] for a in angles]))
        cb = geometry.c_beta(atoms[..., 0, :], atoms[..., 1, :], atoms[..., 2, :])
        passed = np.nonzero(acceptable(atoms[:, :, 1], cb, cfg.compactness))[0]
        if len(passed):
            k = int(passed[0])
            return sequences[k], np.concatenate([atoms[k], cb[k][:, None]], axis=1)
    raise DataError(f"synth: no compact chain of {length} residues found in {max_rounds} rounds; "
                    "raise synth.compactness")


def homologues(sequence: str, cb: np.ndarray, cfg: SynthConfig, rng: np.random.Generator
               ) -> list[str]:
    """``msa_depth - 1`` homologue rows in a3m form (step 3), the query excluded."""
    depth, n = cfg.msa_depth - 1, len(sequence)
    cls = np.array([_CLASS_OF[c] for c in sequence])
    size = np.array([len(_SEGMENTS[c]) for c in cls])
    index = np.array([_SEGMENTS[c].tolist().index(c_) for c, c_ in
                      zip(cls, np.frombuffer(sequence.encode("ascii"), dtype="S1"))])
    index = np.broadcast_to(index, (depth, n)).copy()
    mutate = rng.random((depth, n)) < cfg.mutation_rate
    index[mutate] = (rng.random((depth, n)) * size)[mutate].astype(int)
    pair_i, pair_j = contact_pairs(cb)
    shifts = rng.integers(0, 7, size=len(pair_i))
    coupled = rng.random((depth, len(pair_i))) < cfg.coupling_rate
    draws = rng.random((depth, len(pair_i)))
    for p, (i, j) in enumerate(zip(pair_i, pair_j)):
        k = (draws[:, p] * size[i]).astype(int)
        rows = coupled[:, p]
        index[rows, i] = k[rows]
        index[rows, j] = ((k + shifts[p]) % size[j])[rows]
    tables = [_SEGMENTS[c] for c in cls]
    return [_a3m_row([tables[p][row[p]].decode() for p in range(n)], rng) for row in index]


def _a3m_row(letters: list[str], rng: np.random.Generator) -> str:
    """Lost ends as gaps and, sometimes, an insertion (lower case) after a random position."""
    n = len(letters)
    if rng.random() < 0.3:
        lost = int(rng.integers(1, max(2, n // 8)))
        side = slice(0, lost) if rng.random() < 0.5 else slice(n - lost, n)
        letters[side] = ["-"] * len(letters[side])
    if rng.random() < 0.2:
        at = int(rng.integers(1, n))
        inserted = "".join(rng.choice(list("acdefghiklmnpqrstvwy"), int(rng.integers(1, 4))))
        letters[at - 1] = letters[at - 1] + inserted
    return "".join(letters)


def chain_name(split: str, index: int) -> str:
    """The id of chain ``index`` of ``split``: ``t00042``, ``v00007``."""
    return f"{split[0]}{index:05d}"


def make_chain(cfg: SynthConfig, seed: int, split: str, index: int) -> tuple[str, str, str]:
    """Chain ``index`` of ``split``: ``(id, mmCIF text, a3m text)``; deterministic."""
    rng = np.random.default_rng([seed, SPLITS[split], index])
    sequence, atoms = fold_chain(cfg, rng)
    rows = homologues(sequence, atoms[:, 4], cfg, rng)
    chain_id = chain_name(split, index)
    names = [chain_id] + [f"{chain_id}_h{k}" for k in range(len(rows))]
    return chain_id, format_mmcif(chain_id, sequence, atoms), format_a3m(names, [sequence] + rows)


def _chain_files(folder: Path, chain_id: str) -> tuple[Path, Path]:
    """A chain's alignment and structure files under split folder ``folder``, in writing order."""
    return (folder / ALIGNMENT_DIR / f"{chain_id}_A" / "synthetic_hits.a3m",
            folder / MMCIF_DIR / f"{chain_id}.cif")


def _write_chain(folder: Path, chain: tuple[str, str, str]) -> int:
    """Write one chain's a3m, then its mmCIF (the last file of a chain: its mark of done)."""
    chain_id, cif, msa = chain
    written = 0
    for path, text in zip(_chain_files(folder, chain_id), (msa, cif)):
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_output(path) as tmp:
            tmp.write_text(text, encoding="ascii")
        written += len(text)
    return written


_JOB: dict[str, Any] = {}


def _chain_job(job: tuple[str, int]) -> tuple[str, str, str]:
    return make_chain(_JOB["cfg"], _JOB["seed"], *job)


def synthesize(out_dir: Path, cfg: SynthConfig, seed: int,
               progress: SynthProgress = NO_PROGRESS) -> None:
    """Write the embedded OpenFold mini dataset under ``out_dir`` (module docstring).

    Each chain's files are written atomically, its mmCIF last; a chain whose mmCIF is there is
    kept, so a re-run writes only the missing chains (`mlhpc.data.embedded` makes the whole
    data set complete or absent). Of the plan's chains this rank writes ``progress.share``, in
    ``progress.workers`` processes (0: ``synth.workers``). ``progress``
    (`mlhpc.workload.SynthProgress`) hears ``plan(chains)`` then ``done(1)`` per chain.

    Raises:
        DataError: ``min_length`` above ``max_length``, no compact chain found, or ``out_dir``
            cannot be written.
    """
    if cfg.min_length > cfg.max_length:
        raise DataError(f"synth.min_length {cfg.min_length} exceeds synth.max_length {cfg.max_length}")
    out_dir = Path(out_dir)
    counts = {"train": cfg.train_chains, "validation": cfg.validation_chains}
    plan = [(split, i) for split in SPLITS for i in range(counts[split])]
    # this rank's chains of the whole plan; of those, the ones not yet written
    todo = [job for job in progress.share(plan) if not _chain_files(out_dir / job[0], chain_name(*job))[1].exists()]
    progress.plan(len(todo))
    _JOB.update(cfg=cfg, seed=seed)
    try:
        for (split, _), chain in zip(todo, _map(todo, progress.workers or cfg.workers)):
            _write_chain(out_dir / split, chain)
            progress.done(1)
    except OSError as exc:
        raise DataError(f"{exc.filename or out_dir}: cannot write the OpenFold synthetic dataset "
                        f"({exc.strerror or exc})") from None


def _map(jobs: list[tuple[str, int]], workers: int):
    """``_chain_job`` of each job, in order, in ``workers`` forked processes (1: here)."""
    yield from map_in_order(_chain_job, jobs, workers)
