"""Embedded OC20-like mini data: rattled metal slabs with adsorbates, labelled by ASE's EMT.

What is made, in the spirit of OC20's S2EF task (Chanussot et al. 2021, ACS Catal. 11, 6059):

1. Bases. For every (metal, facet, site, adsorbate) of the config: an fcc(111) or fcc(100) slab
   (``ase.build.fcc111/fcc100``, ``slab_size`` atoms, ``vacuum_A`` above and below, periodic in
   all three directions as OC20's cells are), the adsorbate put on the site
   (``ase.build.add_adsorbate``, bottom atom first), the bottom ``fixed_layers`` fixed
   (``FixAtoms``), relaxed with EMT and BFGS to ``relax_fmax_eV_per_A``. OC20 tags: 0 for the
   fixed subsurface atoms, 1 for the free slab atoms, 2 for the adsorbate.
2. Samples. Each sample picks a base at random and moves every free atom by an isotropic
   Gaussian displacement of ``rattle_A`` Angstrom per component (fixed atoms stay, as in OC20's
   relaxations); its energy (eV) and forces (eV/A, ``apply_constraint=False`` as the reference's
   ``AtomsToGraphs`` reads them) come from ASE's EMT calculator (``ase.calculators.emt``, the
   effective-medium theory of Jacobsen, Stoltze and Norskov 1996, with ASE's parameters for H,
   C, N, O).

Independence: sample ``i`` of split ``s`` draws from its own generator seeded by
``(seed, s, i)`` (numpy ``SeedSequence``), training ``s = 0`` and validation ``s = 1``, so no
training and validation sample share a random draw; they share only the relaxed bases (the same
catalysts, adsorbates and sites, as OC20's ``val_id`` shares its distribution with training).

Layout (the reference's folders, ``configs/mlperf_hpc.yml``: ``.../s2ef/2M/train`` and
``.../s2ef/all/val_id``, each a folder of ``*.lmdb``)::

    <out_dir>/train/data.0000.lmdb ...        (records: `lmdb_io`, the OCP LMDB format)
    <out_dir>/validation/data.0000.lmdb ...

The folder names hold ``train`` and ``val`` (as the reference's do) and are the split names the
harness's data commands use. Bytes are identical for a seed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from mlhpc.workload import NO_PROGRESS, SynthProgress
from mlhpc.config import Section
from mlhpc.data.pool import map_in_order
from mlhpc.errors import DataError

from . import lmdb_io

TRAIN_DIR = "train"
VALIDATION_DIR = "validation"
_SPLITS = {TRAIN_DIR: 0, VALIDATION_DIR: 1}
_SITES = {"111": ("ontop", "bridge", "fcc", "hcp"), "100": ("ontop", "bridge", "hollow")}
#: Adsorbates, bottom atom first, with their bond lengths (Angstrom) along +z.
_MOLECULES = {"H": ("H", ()), "C": ("C", ()), "N": ("N", ()), "O": ("O", ()),
              "OH": ("OH", (0.97,)), "CO": ("CO", (1.15,)), "NH": ("NH", (1.04,))}
_EMT_METALS = ("Al", "Cu", "Ag", "Au", "Ni", "Pd", "Pt")


class SynthConfig(Section):
    """The ``synth`` section of an OC20 config: what `synthesize` writes (module docstring)."""

    train_samples: int = Field(2000, ge=1, description="training structures")
    validation_samples: int = Field(400, ge=1, description="validation structures")
    files_per_split: int = Field(2, ge=1, description="*.lmdb files per split")
    metals: list[str] = Field(default_factory=lambda: list(_EMT_METALS), min_length=1,
                              description="slab metals (ASE EMT: Al, Cu, Ag, Au, Ni, Pd, Pt)")
    adsorbates: list[str] = Field(default_factory=lambda: ["H", "C", "N", "O", "OH", "CO"], min_length=1,
                                  description="adsorbates placed on a site of the slab")
    facets: list[str] = Field(default_factory=lambda: ["111", "100"], min_length=1,
                              description="fcc facets of the slabs")
    slab_size: tuple[int, int, int] = Field((2, 2, 4), description="atoms along a, b and layers")
    fixed_layers: int = Field(2, ge=0, description="bottom layers held fixed (tag 0)")
    vacuum_A: float = Field(7.0, gt=0.0, description="vacuum above and below the slab, Angstrom")
    adsorbate_height_A: float = Field(1.6, gt=0.0, description="adsorbate height over its site, Angstrom")
    relax_fmax_eV_per_A: float = Field(0.01, gt=0.0, description="force tolerance of the EMT "
                                       "relaxation of each base structure, eV/Angstrom")
    rattle_A: float = Field(0.010, ge=0.0, description="standard deviation of the random "
                            "displacement of free atoms, Angstrom")
    get_edges: bool = Field(False, description="store edge_index / cell_offsets (radius 6 A, 50 neighbours)")
    workers: int = Field(2, ge=1, description="processes; the bytes do not depend on it")


def _check(cfg: SynthConfig) -> None:
    for metal in cfg.metals:
        if metal not in _EMT_METALS:
            raise DataError(f"synth.metals: {metal!r} has no EMT parameters (use {', '.join(_EMT_METALS)})")
    for ads in cfg.adsorbates:
        if ads not in _MOLECULES:
            raise DataError(f"synth.adsorbates: {ads!r} unknown (use {', '.join(_MOLECULES)})")
    for facet in cfg.facets:
        if facet not in _SITES:
            raise DataError(f"synth.facets: {facet!r} unknown (use 111 or 100)")
    if cfg.fixed_layers >= cfg.slab_size[2]:
        raise DataError(f"synth.fixed_layers: {cfg.fixed_layers} leaves no free layer of {cfg.slab_size[2]}")


def base_keys(cfg: SynthConfig) -> list[tuple[str, str, str, str]]:
    """Every (metal, facet, site, adsorbate) of the config, in a fixed order."""
    return [(m, f, s, a) for m in cfg.metals for f in cfg.facets for s in _SITES[f] for a in cfg.adsorbates]


def _adsorbate(name: str) -> Any:
    from ase import Atoms

    symbols, bonds = _MOLECULES[name]
    z = np.concatenate([[0.0], np.cumsum(bonds)]) if bonds else np.zeros(1)
    return Atoms(symbols, positions=[(0.0, 0.0, h) for h in z])


def relaxed_base(cfg: SynthConfig, key: tuple[str, str, str, str]) -> Any:
    """The relaxed slab + adsorbate of one base (``ase.Atoms`` with FixAtoms, OC20 tags).

    Deterministic: no random draw, BFGS from the ideal slab."""
    from ase.build import add_adsorbate, fcc100, fcc111
    from ase.calculators.emt import EMT
    from ase.constraints import FixAtoms
    from ase.optimize import BFGS

    metal, facet, site, ads = key
    build = fcc111 if facet == "111" else fcc100
    slab = build(metal, size=tuple(cfg.slab_size), vacuum=cfg.vacuum_A, periodic=True)
    layer = slab.get_tags().copy()  # ase: 1 for the top layer .. layers for the bottom one
    n_slab = len(slab)
    add_adsorbate(slab, _adsorbate(ads), cfg.adsorbate_height_A, site)
    fixed = np.zeros(len(slab), dtype=bool)
    fixed[:n_slab] = layer > cfg.slab_size[2] - cfg.fixed_layers
    tags = np.full(len(slab), 2, dtype=np.int64)
    tags[:n_slab] = np.where(fixed[:n_slab], 0, 1)
    slab.set_tags(tags)
    slab.set_constraint(FixAtoms(mask=fixed))
    slab.calc = EMT()
    BFGS(slab, logfile=None).run(fmax=cfg.relax_fmax_eV_per_A, steps=500)
    slab.calc = None
    return slab


def _label(atoms: Any, get_edges: bool) -> dict[str, Any]:
    """One record in the reference's names (`lmdb_io.encode_record`) from labelled atoms."""
    from ase.calculators.emt import EMT

    from .prepare import atoms_to_record

    atoms.calc = EMT()
    atoms.get_potential_energy()
    return atoms_to_record(atoms, get_edges)


def make_sample(cfg: SynthConfig, bases: list[Any], seed: int, split: str, index: int) -> dict[str, Any]:
    """Sample ``index`` of ``split``: a record dict (reference names, `lmdb_io.encode_record`)
    of a randomly chosen relaxed base with its free atoms rattled by ``cfg.rattle_A``.

    Deterministic in ``(seed, split, index)`` for the same bases."""
    rng = np.random.default_rng([seed, _SPLITS[split], index])
    base_no = int(rng.integers(len(bases)))
    atoms = bases[base_no].copy()
    fixed = atoms.constraints[0].get_indices() if atoms.constraints else np.zeros(0, dtype=int)
    step = rng.normal(0.0, cfg.rattle_A, size=(len(atoms), 3))
    step[fixed] = 0.0
    atoms.positions = atoms.positions + step
    record = _label(atoms, cfg.get_edges)
    record["sid"], record["fid"] = base_no, index
    return record


_WORKER: dict[str, Any] = {}


def _init_worker(cfg: SynthConfig, bases: list[Any], seed: int) -> None:
    _WORKER.update(cfg=cfg, bases=bases, seed=seed)


def _sample_job(job: tuple[str, int]) -> dict[str, Any]:
    return make_sample(_WORKER["cfg"], _WORKER["bases"], _WORKER["seed"], *job)


def _base_job(job: tuple[SynthConfig, tuple[str, str, str, str]]) -> Any:
    return relaxed_base(*job)


def _map(fn: Any, jobs: list[Any], workers: int, init: tuple[Any, ...] | None = None,
         done: Any = None) -> list[Any]:
    """``[fn(j) for j in jobs]`` in order, in ``workers`` forked processes (1: here); ``done``
    (optional) is called with no argument after each result arrives."""
    tick = done or (lambda: None)
    results = map_in_order(fn, jobs, workers, initializer=_init_worker if init else None,
                           initargs=init or ())
    return [_then(result, tick) for result in results]


def _then(result: Any, tick: Any) -> Any:
    tick()
    return result


def _file_plan(cfg: SynthConfig, out_dir: Path) -> list[tuple[str, Path, list[int]]]:
    """Every ``*.lmdb`` file of the data set: ``(split, path, sample indices)``, the samples of
    a split cut into ``files_per_split`` runs of consecutive indices."""
    plan = []
    for split in _SPLITS:
        count = cfg.train_samples if split == TRAIN_DIR else cfg.validation_samples
        for number, chunk in enumerate(np.array_split(np.arange(count), min(cfg.files_per_split, count))):
            plan.append((split, out_dir / split / f"data.{number:04d}.lmdb", chunk.tolist()))
    return plan


def synthesize(out_dir: Path, cfg: SynthConfig, seed: int,
               progress: SynthProgress = NO_PROGRESS) -> None:
    """Write the embedded OC20 mini dataset under ``out_dir`` (layout in the module docstring).

    Each ``*.lmdb`` file is written atomically; one already there is kept, so a re-run writes
    only the missing files (`mlhpc.data.embedded` makes the whole data set complete or absent).
    Of the plan's files this rank writes ``progress.share``, in ``progress.workers`` processes
    (0: ``synth.workers``); every rank relaxes the bases. ``progress``
    (`mlhpc.workload.SynthProgress`) hears ``plan(samples)`` (the size depends on the structures
    drawn) before the bases are relaxed and ``done(1)`` after each structure.

    Raises:
        DataError: an unknown metal, adsorbate or facet, or ``out_dir`` cannot be written.
    """
    _check(cfg)
    out_dir = Path(out_dir)
    # this rank's files of the whole plan; of those, the ones not yet written
    todo = [job for job in progress.share(_file_plan(cfg, out_dir)) if not job[1].exists()]
    if not todo:
        return
    progress.plan(sum(len(indices) for _, _, indices in todo))
    workers = progress.workers or cfg.workers
    try:
        bases = _map(_base_job, [(cfg, key) for key in base_keys(cfg)], workers)
        for split, path, indices in todo:
            records = _map(_sample_job, [(split, i) for i in indices], workers,
                           init=(cfg, bases, seed), done=progress.done)
            path.parent.mkdir(parents=True, exist_ok=True)
            lmdb_io.write_lmdb(path, records)
    except OSError as exc:
        raise DataError(f"{exc.filename or out_dir}: cannot write the OC20 synthetic dataset "
                        f"({exc.strerror or exc})") from None
