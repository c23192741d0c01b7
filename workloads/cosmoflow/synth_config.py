"""The ``synth`` section of a CosmoFlow config: how the embedded universes are drawn
(`mlhpc_workloads.cosmoflow.fields`) and how many are written (`mlhpc_workloads.cosmoflow.synth`).
Its own module, so that the two import it and not each other."""

from __future__ import annotations

from typing import Literal, Optional

import numpy as np
from pydantic import Field, model_validator

from mlhpc.config import Section


class SynthConfig(Section):
    """How the embedded CosmoFlow dataset is synthesised (config section ``synth``).

    Parameter ranges: Omega_m in [0.25, 0.35], sigma_8 in [0.78, 0.95] and n_s in [0.90, 1.00]
    as in the CosmoFlow simulations (Mathuriya et al. 2018, "CosmoFlow: Using Deep Learning to
    Learn the Universe at Scale", SC18); H0 in [60, 80] km/s/Mpc and the redshifts (0, 0.5, 1.5, 3)
    stand for the four-parameter ExaLearn set used by MLPerf HPC (Farrell et al. 2021,
    arXiv:2110.11466) but are not yet checked against its README (portal.nersc.gov/project/m3363).

    ``field``: ``lognormal`` (Coles & Jones 1991; Poisson counts around a log-normal density) or
    ``2lpt`` (particles displaced by Lagrangian perturbation theory, counted on the grid; order set
    by ``lpt_order``, used by ``2lpt`` only). The defaults below are those of ``lognormal``; a
    ``2lpt`` config states its sizes (configs/cosmoflow-mini-2lpt.yaml).

    ``lognormal``: the particle density of the reference set (512^3 particles in (512 Mpc/h)^3,
    one per (Mpc/h)^3) on 8 Mpc/h cells gives the default 512 particles per cell; 256 Mpc/h boxes
    put the grid's k range (0.025 .. 0.39 h/Mpc) across the turnover-to-sigma_8 scales, where n_s
    and h bend P(k) most. Learnability: on 32^3 cubes with independent phases, sigma_8 and
    Omega_m (through D(z) between channels) are well determined, n_s and H0 only weakly (sample
    variance of a 32^3 cube). ``phase_realizations`` trades that realism for a visible imprint of
    all four, at the price of a validation set that shares phases with training.

    ``2lpt``: ``mean_particles_per_cell`` (at most 4096) sets the Lagrangian grid,
    N_p = round(S * m^(1/3)) particles per side, so the mean count per cell is (N_p / S)^3
    (exactly m when m is a cube: 1, 8, 27, 64, ...). The smaller ``box_size_mpc_h`` per cell, the
    further the particles stream relative to a cell and the less Gaussian the counts.
    """

    field: Literal["lognormal", "2lpt"] = Field("lognormal", description=(
        "lognormal (Poisson counts around a log-normal density) or 2lpt (particles displaced "
        "by Lagrangian perturbation theory, counted on the grid)"))
    cube_size: int = Field(32, ge=4, le=512, description="S: cells per side of a sample")
    train_samples: int = Field(1024, ge=1, description="samples written to train/")
    eval_samples: int = Field(256, ge=1, description="samples written to validation/")
    samples_per_file: int = Field(1, ge=1, description=(
        "samples per file (1: one file per sample; > 1: a leading sample axis)"))
    box_size_mpc_h: float = Field(256.0, gt=0, description="comoving side of one cube")
    redshifts: tuple[float, float, float, float] = Field((0.0, 0.5, 1.5, 3.0), description=(
        "redshift of each of the four channels"))
    mean_particles_per_cell: float = Field(512.0, gt=0, description=(
        "mean particle count per cell (2lpt: at most 4096; sets the Lagrangian grid)"))
    lpt_order: Literal[1, 2] = Field(2, description=(
        "field 2lpt only: 1 Zel'dovich, 2 second-order LPT"))
    omega_m_range: tuple[float, float] = Field((0.25, 0.35), description=(
        "range Omega_m is drawn from (uniform)"))
    sigma_8_range: tuple[float, float] = Field((0.78, 0.95), description=(
        "range sigma_8 is drawn from (uniform)"))
    n_s_range: tuple[float, float] = Field((0.90, 1.00), description=(
        "range n_s is drawn from (uniform)"))
    h0_range_km_per_s_per_mpc: tuple[float, float] = Field((60.0, 80.0), description=(
        "range H0 is drawn from (uniform)"))
    omega_b: float = Field(0.049, gt=0, lt=0.25, description="baryon density, fixed (Planck 2018)")
    phase_realizations: Optional[int] = Field(None, ge=1, description=(
        "null: every sample has its own initial phases (as in the reference simulations); n: "
        "samples cycle through n phase realisations shared by both splits (removes sample "
        "variance from the targets, and makes the validation set depend on the training set's "
        "phases)"))
    workers: int = Field(0, ge=0, le=256, description="synthesis processes; 0: one per usable CPU")

    def particles_per_side(self) -> int:
        """N_p, the side of the particles' Lagrangian grid (at least one particle per cell side)."""
        return max(self.cube_size, int(round(self.cube_size * self.mean_particles_per_cell ** (1 / 3))))

    @model_validator(mode="after")
    def _check_ranges(self) -> "SynthConfig":
        for name in ("omega_m_range", "sigma_8_range", "n_s_range", "h0_range_km_per_s_per_mpc"):
            low, high = getattr(self, name)
            if not 0 < low < high:
                raise ValueError(f"{name} must be (low, high) with 0 < low < high, got {(low, high)}")
        if self.omega_m_range[0] <= self.omega_b:
            raise ValueError("omega_m_range must lie above omega_b")
        if any(z < 0 for z in self.redshifts):
            raise ValueError("redshifts must be >= 0")
        if self.field == "2lpt" and self.mean_particles_per_cell > 4096:
            raise ValueError("mean_particles_per_cell must be <= 4096 with field: 2lpt "
                             f"(N_p^3 particles held in memory), got {self.mean_particles_per_cell}")
        return self

    def ranges(self) -> np.ndarray:
        """``(4, 2)`` float64 array of (low, high) per parameter, in `PARAMETER_NAMES` order."""
        return np.array([self.omega_m_range, self.sigma_8_range, self.n_s_range,
                         self.h0_range_km_per_s_per_mpc], dtype=np.float64)
