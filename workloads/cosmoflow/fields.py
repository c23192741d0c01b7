"""The fields of CosmoFlow's embedded universes, one sample at a time (`synth` describes the two
generators, ``lognormal`` and ``2lpt``, and writes the files): the cosmological parameters drawn,
the linear power spectrum, the density or the particles' displacements, the counts per cell.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .synth_config import SynthConfig

SPLITS = ("train", "validation")
_INT16_MAX = np.iinfo(np.int16).max


def normalise(phys: np.ndarray, ranges: np.ndarray) -> np.ndarray:
    """Physical parameters ``(..., 4)`` -> ``unitPar`` in [-1, 1] (float32), linear in each range."""
    low, high = ranges[:, 0], ranges[:, 1]
    return (2.0 * (np.asarray(phys, np.float64) - low) / (high - low) - 1.0).astype(np.float32)


def _sample_seed(seed: int, split: str, index: int) -> np.random.SeedSequence:
    return np.random.SeedSequence((seed, SPLITS.index(split), index))


def draw_parameters(cfg: SynthConfig, seed: int, split: str, index: int) -> np.ndarray:
    """The physical parameters of one sample: float64 ``(4,)`` = (Omega_m, sigma_8, n_s, H0)."""
    rng = np.random.default_rng(_sample_seed(seed, split, index).spawn(1)[0])
    ranges = cfg.ranges()
    return rng.uniform(ranges[:, 0], ranges[:, 1])


def _wavenumbers(n: int, box: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Wavevector components [h/Mpc] of an ``rfftn`` of an n^3 grid of side ``box``, broadcastable."""
    k = np.fft.fftfreq(n, d=1.0 / n) * (2 * math.pi / box)
    kz = np.fft.rfftfreq(n, d=1.0 / n) * (2 * math.pi / box)
    return k[:, None, None], k[None, :, None], kz[None, None, :]


def _irfft(field_k: np.ndarray, n: int) -> np.ndarray:
    return np.fft.irfftn(field_k, s=(n, n, n), axes=(0, 1, 2))


def displacements(delta_k: np.ndarray, n: int, box: float, order: int
                  ) -> tuple[np.ndarray, np.ndarray | None]:
    """Lagrangian displacements of the particles on an n^3 grid from the linear density.

    Args:
        delta_k: complex ``(n, n, n // 2 + 1)``, ``rfftn`` of the linear density at D = 1.
        n: particles per side; box: side [Mpc/h]; order: 1 (Zel'dovich) or 2 (2LPT).
    Returns:
        psi1 float64 ``(n^3, 3)`` [Mpc/h] with div psi1 = -delta_L, and psi2 ``(n^3, 3)`` with
        div psi2 = sum_{i<j} (phi_ii phi_jj - phi_ij^2) (None for order 1), in C order of the grid.
    """
    ks = _wavenumbers(n, box)
    k2 = ks[0] ** 2 + ks[1] ** 2 + ks[2] ** 2
    inv_k2 = np.divide(1.0, k2, out=np.zeros_like(k2), where=k2 > 0)
    potential = delta_k * inv_k2  # -phi1_k: laplacian phi1 = delta
    psi1 = np.stack([_irfft(1j * kc * potential, n).ravel() for kc in ks], axis=1)
    if order == 1:
        return psi1, None
    phi = {(i, j): _irfft(ks[i] * ks[j] * potential, n) for i in range(3) for j in range(i, 3)}
    source = (phi[0, 0] * phi[1, 1] + phi[0, 0] * phi[2, 2] + phi[1, 1] * phi[2, 2]
              - phi[0, 1] ** 2 - phi[0, 2] ** 2 - phi[1, 2] ** 2)
    source_k = np.fft.rfftn(source, axes=(0, 1, 2)) * inv_k2  # -phi2_k
    psi2 = np.stack([_irfft(-1j * kc * source_k, n).ravel() for kc in ks], axis=1)
    return psi1, psi2


def synthesize_sample(cfg: SynthConfig, seed: int, split: str, index: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One universe of ``cfg.field`` (``lognormal`` or ``2lpt``): ``(full, unitPar, physPar)``.

    Returns:
        full: int16 ``(S, S, S, 4)`` particle counts, channel c at redshift ``cfg.redshifts[c]``
            (counts above 32767 are clipped; the defaults stay far below).
        unitPar: float32 ``(4,)`` in [-1, 1].
        physPar: float32 ``(4,)`` (Omega_m, sigma_8, n_s, H0 [km/s/Mpc]).
    Deterministic in ``(cfg, seed, split, index)``; with ``phase_realizations: null`` no two
    ``(split, index)`` share random numbers, otherwise samples ``index`` and ``index + n`` of
    either split share their initial phases (only the parameters and shot noise differ).
    """
    if cfg.field == "2lpt":
        return _lpt_sample(cfg, seed, split, index)
    return _lognormal_sample(cfg, seed, split, index)


def _shared_phase_seed(cfg: SynthConfig, seed: int, index: int) -> np.random.SeedSequence:
    return np.random.SeedSequence((seed, 2, index % cfg.phase_realizations))


def _cosmology(cfg: SynthConfig, seed: int, split: str, index: int) -> tuple[np.ndarray, Any]:
    """Sample ``index``'s drawn parameters (Omega_m, sigma_8, n_s, H0) and its flat colossus
    cosmology (Eisenstein & Hu transfer function as colossus computes it), shared by both fields."""
    from colossus.cosmology import cosmology

    phys = draw_parameters(cfg, seed, split, index)
    omega_m, sigma_8, n_s, h0 = (float(v) for v in phys)
    cosmo = cosmology.Cosmology(name="mlhpc-synth", flat=True, Om0=omega_m, Ob0=cfg.omega_b,
                                H0=h0, sigma8=sigma_8, ns=n_s, interpolation=False,
                                persistence="", print_warnings=False)
    return phys, cosmo


def _lognormal_sample(cfg: SynthConfig, seed: int, split: str, index: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``field: lognormal`` (Coles & Jones 1991); the bytes of the generator before 2LPT existed."""
    import powerbox

    phys, cosmo = _cosmology(cfg, seed, split, index)
    size = cfg.cube_size
    # Tabulate P(k) [(Mpc/h)^3] over the grid's k range [h/Mpc] once, interpolate in log-log.
    k_min = 2 * math.pi / cfg.box_size_mpc_h
    k_table = np.geomspace(0.5 * k_min, 2.0 * math.sqrt(3) * math.pi * size / cfg.box_size_mpc_h, 256)
    log_p_table = np.log(cosmo.matterPowerSpectrum(k_table, z=0.0, model="eisenstein98"))
    log_k_table = np.log(k_table)
    growth = np.asarray(cosmo.growthFactor(np.asarray(cfg.redshifts, dtype=np.float64)))

    sequence = _sample_seed(seed, split, index)
    if cfg.phase_realizations is None:
        phase_seed = int(sequence.generate_state(1)[0])
    else:
        phase_seed = int(_shared_phase_seed(cfg, seed, index).generate_state(1)[0])
    poisson = np.random.default_rng(sequence.spawn(2)[1])

    def power(k: np.ndarray) -> np.ndarray:
        safe_k = np.maximum(k, k_table[0])
        return np.exp(np.interp(np.log(safe_k), log_k_table, log_p_table))

    # The log-density is the linear Gaussian field (Coles & Jones 1991): one realisation at z = 0,
    # scaled by D(z) per channel, so the four channels are snapshots of one universe.
    box = powerbox.PowerBox(shape=(size,) * 3, size=(cfg.box_size_mpc_h,) * 3, pk=power,
                            seed=phase_seed)
    gaussian = np.asarray(box.delta_x(), dtype=np.float64)
    full = np.empty((size, size, size, len(cfg.redshifts)), dtype=np.int16)
    for channel, d_z in enumerate(growth):
        density = np.exp(float(d_z) * gaussian)
        density /= density.mean()  # mass conservation: a fixed number of particles per box
        counts = poisson.poisson(cfg.mean_particles_per_cell * density)
        full[..., channel] = np.minimum(counts, _INT16_MAX)
    ranges = cfg.ranges()
    return full, normalise(phys, ranges), phys.astype(np.float32)


def _lpt_sample(cfg: SynthConfig, seed: int, split: str, index: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``field: 2lpt``: particles displaced by Zel'dovich / 2LPT, nearest-grid-point counts."""
    phys, cosmo = _cosmology(cfg, seed, split, index)
    n, size, box = cfg.particles_per_side(), cfg.cube_size, cfg.box_size_mpc_h
    ks = _wavenumbers(n, box)
    k = np.sqrt(ks[0] ** 2 + ks[1] ** 2 + ks[2] ** 2)
    # P(k) [(Mpc/h)^3] tabulated over the grid's k range [h/Mpc], interpolated in log-log.
    k_table = np.geomspace(math.pi / box, 1.01 * float(k.max()), 256)
    log_p = np.interp(np.log(np.maximum(k, k_table[0])), np.log(k_table),
                      np.log(cosmo.matterPowerSpectrum(k_table, z=0.0, model="eisenstein98")))
    # White noise of unit variance per grid point -> delta_k with <|delta_k|^2> = N^3 P / V_cell,
    # i.e. the field's power spectrum is P(k) under the V / N^6 |DFT|^2 estimator.
    if cfg.phase_realizations is None:
        phases = _sample_seed(seed, split, index).spawn(2)[1]
    else:
        phases = _shared_phase_seed(cfg, seed, index)
    noise = np.random.default_rng(phases).standard_normal((n, n, n))
    delta_k = np.fft.rfftn(noise) * np.sqrt(np.exp(log_p) / (box / n) ** 3)
    delta_k[0, 0, 0] = 0.0
    psi1, psi2 = displacements(delta_k, n, box, cfg.lpt_order)
    lagrangian = (np.indices((n, n, n), dtype=np.float64).reshape(3, -1).T + 0.5) * (box / n)
    redshifts = np.asarray(cfg.redshifts, dtype=np.float64)
    growth = np.asarray(cosmo.growthFactor(redshifts), dtype=np.float64)
    full = np.empty((size, size, size, len(redshifts)), dtype=np.int16)
    for channel, (z, d1) in enumerate(zip(redshifts, growth)):
        position = lagrangian + d1 * psi1
        if psi2 is not None:
            d2 = -3.0 / 7.0 * d1 ** 2 * float(cosmo.Om(z)) ** (-1.0 / 143.0)
            position += d2 * psi2
        cell = np.floor(position * (size / box)).astype(np.int64) % size
        flat = (cell[:, 0] * size + cell[:, 1]) * size + cell[:, 2]
        counts = np.bincount(flat, minlength=size ** 3).reshape(size, size, size)
        full[..., channel] = np.minimum(counts, _INT16_MAX)
    return full, normalise(phys, cfg.ranges()), phys.astype(np.float32)
