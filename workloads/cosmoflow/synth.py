"""Embedded CosmoFlow data: synthetic dark-matter universes written in the official HDF5 layout.

The MLPerf HPC CosmoFlow dataset (``cosmoUniverse_2019_05_4parE``, ExaLearn / NERSC) holds N-body
simulations of (512 Mpc/h)^3 with 512^3 dark-matter particles, histogrammed on a 512^3 grid at four
redshifts; the files store ``full`` = int16 particle counts ``(512, 512, 512, 4)`` and
``unitPar`` = the four cosmological parameters (Omega_m, sigma_8, n_s, H0) mapped to [-1, 1]. The
benchmark trains on 128^3 x 4 sub-cubes cut from them (mlcommons/hpc ``cosmoflow/prepare.py``);
every universe is its own simulation, so validation cubes share no initial conditions with
training cubes.

Running an N-body code is out of reach here. Two generators (`fields`), chosen by
``synth.field``, share steps 1-2:

1. draw (Omega_m, sigma_8, n_s, H0) uniformly from the configured ranges;
2. the linear matter power spectrum P(k) at z = 0 from colossus (Eisenstein & Hu 1998 transfer
   function, normalised to sigma_8), for a flat LambdaCDM cosmology with that draw, and the
   linear growth factor D(z) (D(0) = 1).

``field: lognormal`` (the default; configs/cosmoflow-mini.yaml) follows Coles & Jones 1991
(MNRAS 248, 1), the same statistics as the N-body fields to first order:

3. a Gaussian random field g with that P(k) on an S^3 grid of side ``box_size_mpc_h``
   (powerbox); per redshift channel the log-density is D(z) g, so the density
   1 + delta = exp(D(z) g) / <exp(D(z) g)> is log-normal and the four channels are snapshots of
   one universe; dividing by the box mean keeps the number of particles per box fixed, as in an
   N-body run;
4. particle counts ~ Poisson(mean_particles_per_cell * (1 + delta)), stored as int16.

``field: 2lpt`` (configs/cosmoflow-mini-2lpt.yaml) is the approximation that N-body
initial-condition codes use (2LPTic, Crocce, Pueblas & Scoccimarro 2006, MNRAS 373, 369), carried
to the output redshifts:

3. a Gaussian linear density field delta_L with that P(k) on the particles' Lagrangian grid
   (N_p^3 points in a periodic box of side ``box_size_mpc_h``; numpy FFTs of white noise);
4. the particles move by Lagrangian perturbation theory: x = q + D(z) psi1(q) + D2(z) psi2(q),
   with the Zel'dovich (1970) displacement psi1 = grad(laplacian^-1 delta_L) in Fourier space
   (i k / k^2 delta_L) and, for ``lpt_order: 2``, the second-order displacement psi2 from
   laplacian phi2 = sum_{i<j} (phi_ii phi_jj - phi_ij^2) with D2 = -3/7 D^2 Omega_m(z)^(-1/143)
   (Bouchet et al. 1995); particles keep their identity across the four redshift channels, so the
   channels are snapshots of one universe;
5. ``full`` = the number of particles in each of the S^3 cells (nearest-grid-point counts, as the
   reference's histograms), int16.
   Unlike the log-normal field, the result is non-Gaussian in the way N-body fields are:
   particles stream along the displacement, shell-cross into sheets and filaments and empty the
   voids, and the counts are discrete, so not all the information is in the power spectrum.

Initial phases (both fields): with ``phase_realizations: null`` every universe, training or
validation, draws its own phases, as in the reference. With ``phase_realizations: n`` the samples
cycle through n phase realisations shared by both splits (a phase-matched suite, cf. Garrison et
al. 2018, Abacus Cosmos): the validation set is then NOT independent of training, and a
power-spectrum ridge regression (``benchmarks/baseline_powerspectrum.py``) reaches the reference
target 0.124 on the mini config's data without a network; see configs/cosmoflow-mini.yaml for
the figures measured and why the mini benchmark still uses it.

Reproducibility: every sample's random numbers come from ``numpy.random.SeedSequence((seed,
split, index))`` (and, for shared phases, ``SeedSequence((seed, 2, index % n))``) alone, so a
sample does not depend on how many samples, files or worker processes there are, and the files
are bit-identical for one seed (h5py writes no timestamps here); ``field: lognormal`` writes the
same bytes as the generator before ``field`` existed. Files are written under a temporary name
and renamed, so an interrupted run leaves no half file that looks complete; a re-run writes only
the missing files.
"""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np

from mlhpc.runtime import usable_cpus
from mlhpc.workload import NO_PROGRESS, SynthProgress
from mlhpc.data.files import atomic_output, write_text_atomic
from mlhpc.data.inputs import read_text_input
from mlhpc.data.pool import map_in_order
from mlhpc.errors import DataError

from .fields import SPLITS, displacements, draw_parameters, normalise, synthesize_sample
from .synth_config import SynthConfig

__all__ = ["SPLITS", "SynthConfig", "displacements", "draw_parameters", "normalise", "synthesize",
           "synthesize_sample"]

#: The four targets, in ``unitPar`` / ``physPar`` order.
PARAMETER_NAMES = ("Omega_m", "sigma_8", "n_s", "H0")
PARAMETER_UNITS = ("1", "1", "1", "km/s/Mpc")
FILE_PATTERN = "univ_{index:06d}.h5"
FINGERPRINT_NAME = "synth.json"


def _fingerprint(cfg: SynthConfig, seed: int) -> dict:
    """The settings that decide the bytes. Keys a field does not use are left out, so the record
    of a ``lognormal`` dataset is the one written before ``field`` existed and that of a ``2lpt``
    dataset the one written before ``phase_realizations`` applied to it; the two fields still
    never match (``lpt_order`` is present for ``2lpt`` only)."""
    skip = {"train_samples", "eval_samples", "workers", "field"}
    if cfg.field == "lognormal":
        skip.add("lpt_order")
    elif cfg.phase_realizations is None:
        skip.add("phase_realizations")
    keep = cfg.model_dump(mode="json", exclude=skip)
    return {"seed": seed, **keep}


def _file_plan(cfg: SynthConfig, split: str) -> list[tuple[int, int]]:
    """``[(first_sample, n_samples), ...]`` per file of ``split``."""
    total = cfg.train_samples if split == "train" else cfg.eval_samples
    step = cfg.samples_per_file
    return [(first, min(step, total - first)) for first in range(0, total, step)]


def _write_file(path: Path, cfg: SynthConfig, seed: int, split: str, first: int, count: int) -> None:
    samples = [synthesize_sample(cfg, seed, split, first + i) for i in range(count)]
    full = np.stack([s[0] for s in samples])
    unit = np.stack([s[1] for s in samples])
    phys = np.stack([s[2] for s in samples])
    if cfg.samples_per_file == 1:
        full, unit, phys = full[0], unit[0], phys[0]
    # the temporary created O_EXCL | O_NOFOLLOW (never written through a planted link), with
    # the bits an h5py-created file has (0666 less the umask); removed when writing fails
    with atomic_output(path, 0o666) as partial, h5py.File(partial, "w", track_order=False) as f:
        f.create_dataset("full", data=full, track_times=False)
        f.create_dataset("unitPar", data=unit, track_times=False)
        f.create_dataset("physPar", data=phys, track_times=False)
        f.attrs["parameter_names"] = list(PARAMETER_NAMES)
        f.attrs["physPar_units"] = list(PARAMETER_UNITS)
        f.attrs["parameter_ranges"] = cfg.ranges()
        f.attrs["unitPar_definition"] = "2 * (physPar - low) / (high - low) - 1"
        f.attrs["full_definition"] = "dark-matter particle counts per cell, axes (x, y, z, redshift)"
        f.attrs["redshifts"] = np.asarray(cfg.redshifts, dtype=np.float64)
        f.attrs["box_size_mpc_h"] = cfg.box_size_mpc_h
        f.attrs["cell_size_mpc_h"] = cfg.box_size_mpc_h / cfg.cube_size
        f.attrs["mean_particles_per_cell"] = cfg.mean_particles_per_cell
        f.attrs["omega_b"] = cfg.omega_b
        f.attrs["first_sample"] = first
        f.attrs["seed"] = seed
        f.attrs["split"] = split
        if cfg.field == "lognormal":  # the attributes written before 2LPT existed, byte for byte
            f.attrs["generator"] = ("mlhpc log-normal exp(D(z) g), g Gaussian (powerbox) with colossus "
                                    "Eisenstein-Hu linear P(k), D(z) growth, Poisson counts")
        else:
            f.attrs["lpt_order"] = cfg.lpt_order
            f.attrs["particles_per_side"] = cfg.particles_per_side()
            if cfg.phase_realizations is not None:
                f.attrs["phase_realizations"] = cfg.phase_realizations
            f.attrs["generator"] = ("mlhpc Lagrangian perturbation theory (Zel'dovich / 2LPT) displacement "
                                    "of particles from a Gaussian field with colossus Eisenstein-Hu linear "
                                    "P(k), D(z) growth, nearest-grid-point counts")


def _needs_writing(path: Path, count: int, sharded: bool) -> bool:
    if not path.exists():
        return True
    if not sharded:
        return False
    try:  # a last, partial shard from a smaller earlier run must grow
        with h5py.File(path, "r") as f:
            return f["full"].shape[0] != count
    except (OSError, KeyError):
        return True


def _run_task(task: tuple[Path, SynthConfig, int, str, int, int]) -> None:
    _write_file(*task)


def synthesize(out_dir: Path, cfg: SynthConfig, seed: int,
               progress: SynthProgress = NO_PROGRESS) -> None:
    """Write the embedded CosmoFlow dataset under ``out_dir`` in the official layout.

    Layout: ``out_dir/train/univ_NNNNNN.h5`` and ``out_dir/validation/univ_NNNNNN.h5``
    (NNNNNN = index of the file's first sample), each holding ``full`` int16 ``(S, S, S, 4)``,
    ``unitPar`` float32 ``(4,)`` and ``physPar`` float32 ``(4,)``, or with a leading sample axis
    ``(n, ...)`` when ``cfg.samples_per_file > 1``; attributes document units and ranges.
    ``out_dir/synth.json`` records the seed and generator settings. Files already present are
    kept, so a re-run (or a larger ``train_samples``) writes only what is missing. Work is
    spread over a process pool; the bytes written do not depend on it.

    ``progress`` (`mlhpc.workload.SynthProgress`) hears ``plan(samples, bytes)`` before the first
    file is written (bytes estimated by `estimated_bytes`) and ``done(k)`` after each file; of
    the plan's files this rank writes ``progress.share`` (every rank writes the same
    ``synth.json``), with ``progress.workers`` processes when it sets them.

    Raises:
        DataError: ``out_dir`` holds a dataset synthesised with another seed or other settings
            (the message names the first differing key), or it cannot be written.
    """
    out_dir = Path(out_dir)
    fingerprint = _fingerprint(cfg, seed)
    record = out_dir / FINGERPRINT_NAME
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        if record.exists():
            try:
                previous = json.loads(read_text_input(record, root=out_dir, what="synthesis record"))
            except (ValueError, DataError):
                raise DataError(f"{record}: not a readable synthesis record; delete the folder "
                                f"or choose another data.path") from None
            for key in sorted(set(fingerprint) | set(previous)):
                if previous.get(key) != fingerprint.get(key):
                    raise DataError(
                        f"{record}: data were synthesised with {key}={previous.get(key)!r}, the "
                        f"config asks for {fingerprint.get(key)!r}; delete {out_dir} or choose "
                        f"another data.path")
        else:
            write_text_atomic(record, json.dumps(fingerprint, indent=1, sort_keys=True) + "\n")
        plan = []
        for split in SPLITS:
            folder = out_dir / split
            folder.mkdir(exist_ok=True)
            plan.extend((folder / FILE_PATTERN.format(index=first), cfg, seed, split, first, count)
                        for first, count in _file_plan(cfg, split))
        # this rank's files of the whole plan; of those, the ones not yet written
        tasks = [task for task in progress.share(plan)
                 if _needs_writing(task[0], task[-1], cfg.samples_per_file > 1)]
    except OSError as exc:
        raise DataError(f"{out_dir}: cannot write the synthetic dataset ({exc.strerror or exc})") from None
    progress.plan(sum(task[-1] for task in tasks), estimated_bytes(cfg, [task[-1] for task in tasks]))
    _execute(tasks, progress.workers or cfg.workers, progress)


#: HDF5 header, dataset headers and attributes of one ``lognormal`` file, in bytes (measured
#: with h5py 3 on one-sample files of 8^3 and 16^3 cubes: 10,208 bytes beside the counts and
#: parameters; a ``2lpt`` file's attributes differ by a few bytes).
FILE_OVERHEAD_BYTES = 10_208


def estimated_bytes(cfg: SynthConfig, file_samples: list[int]) -> int:
    """Bytes that files holding ``file_samples`` samples each take: int16 ``(S, S, S, 4)``
    counts and two float32 ``(4,)`` vectors per sample plus `FILE_OVERHEAD_BYTES` per file."""
    per_sample = cfg.cube_size ** 3 * 4 * 2 + 2 * 4 * 4
    return sum(n * per_sample + FILE_OVERHEAD_BYTES for n in file_samples)


def _execute(tasks: list, workers: int, progress: SynthProgress) -> None:
    workers = min(workers or usable_cpus(), len(tasks))
    try:
        if workers <= 1 or len(tasks) < 4:
            for task in tasks:
                _run_task(task)
                progress.done(task[-1])
            return
        # spawn: the parent may hold torch / OpenMP threads that fork would copy half-started.
        for task, _ in zip(tasks, map_in_order(_run_task, tasks, workers, start="spawn")):
            progress.done(task[-1])
    except OSError as exc:
        raise DataError(f"{tasks[0][0].parent}: cannot write the synthetic dataset "
                        f"({exc.strerror or exc})") from None
