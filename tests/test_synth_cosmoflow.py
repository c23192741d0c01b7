"""The embedded CosmoFlow universes, both fields (``synth.field``): ``2lpt`` independent across
samples and splits, particle-conserving, non-Gaussian; ``lognormal`` the generator of the mini
benchmark, byte for byte as before ``field`` existed; shared phases (``phase_realizations``) shared
by both splits, as documented; both reproducible to the bit."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from mlhpc_workloads.cosmoflow.synth import SynthConfig, displacements, synthesize_sample

SMALL = dict(field="2lpt", cube_size=8, box_size_mpc_h=32.0, mean_particles_per_cell=8)
SMALL_LOGNORMAL = dict(cube_size=8, box_size_mpc_h=64.0, mean_particles_per_cell=64.0)
FIXED_COSMOLOGY = dict(omega_m_range=(0.3, 0.3000001), sigma_8_range=(0.8, 0.8000001),
                       n_s_range=(0.96, 0.9600001), h0_range_km_per_s_per_mpc=(70.0, 70.000001))


def _sha(array: np.ndarray) -> str:
    return hashlib.sha256(array.tobytes()).hexdigest()[:16]


def _channel0(cfg: SynthConfig, split: str, index: int) -> np.ndarray:
    return np.log1p(synthesize_sample(cfg, 0, split, index)[0][..., 0].astype(np.float64)).ravel()


@pytest.mark.parametrize("kwargs, digest", [
    # computed with workloads/cosmoflow/synth.py as of 92c903e^ (log-normal only) ...
    (dict(SMALL_LOGNORMAL, phase_realizations=1), "7ecf138ebc94f6f1"),
    (SMALL_LOGNORMAL, "b3eaa0c78ce96fa1"),
    # ... and as of 92c903e (2LPT only), seed 3, validation sample 5 (numpy 2 FFTs and PCG64)
    (SMALL, "7cb0b7079be90745"),
])
def test_each_field_writes_the_bytes_of_its_original_generator(kwargs, digest):
    assert _sha(synthesize_sample(SynthConfig(**kwargs), 3, "validation", 5)[0]) == digest


def test_lognormal_is_the_default_field():
    assert SynthConfig().field == "lognormal"
    lognormal = synthesize_sample(SynthConfig(**SMALL_LOGNORMAL), 0, "train", 0)[0]
    lpt = synthesize_sample(SynthConfig(**{**SMALL_LOGNORMAL, "field": "2lpt"}), 0, "train", 0)[0]
    assert lognormal.tobytes() != lpt.tobytes()
    assert abs(lognormal.mean() - 64.0) < 2.0  # Poisson around a mass-conserving density


@pytest.mark.parametrize("field", ["lognormal", "2lpt"])
def test_shared_phases_make_validation_depend_on_training(field):
    """With ``phase_realizations: 1`` and one cosmology, a validation universe is its training
    twin up to shot noise (the leak the mini config documents); without, they are unrelated."""
    base = SMALL if field == "2lpt" else SMALL_LOGNORMAL
    shared = SynthConfig(**base, **FIXED_COSMOLOGY, phase_realizations=1)
    independent = SynthConfig(**base, **FIXED_COSMOLOGY)
    assert np.corrcoef(_channel0(shared, "train", 0), _channel0(shared, "validation", 3))[0, 1] > 0.9
    r = np.corrcoef(_channel0(independent, "train", 0), _channel0(independent, "validation", 3))[0, 1]
    assert abs(r) < 0.5, r


def test_2lpt_bounds_its_particle_grid():
    with pytest.raises(ValueError, match="mean_particles_per_cell"):
        SynthConfig(field="2lpt", mean_particles_per_cell=8000.0)
    assert SynthConfig(mean_particles_per_cell=8000.0).field == "lognormal"  # as before


def test_particles_are_conserved_in_every_channel():
    cfg = SynthConfig(**SMALL)
    full, _, _ = synthesize_sample(cfg, 0, "train", 0)
    n_p = cfg.particles_per_side()
    assert n_p == 16
    assert full.dtype == np.int16 and full.shape == (8, 8, 8, 4)
    np.testing.assert_array_equal(full.reshape(-1, 4).sum(axis=0), n_p ** 3)


def test_bit_identical_for_a_seed_and_different_otherwise():
    cfg = SynthConfig(**SMALL)
    a = synthesize_sample(cfg, 3, "train", 5)
    b = synthesize_sample(cfg, 3, "train", 5)
    for x, y in zip(a, b):
        assert x.tobytes() == y.tobytes()
    assert synthesize_sample(cfg, 4, "train", 5)[0].tobytes() != a[0].tobytes()


def test_validation_never_shares_phases_with_training():
    """Same cosmology forced on every sample: what is left is the initial phases, which must
    differ between every training and validation universe (as in the reference, where each
    validation universe is its own simulation)."""
    cfg = SynthConfig(**SMALL, **FIXED_COSMOLOGY)
    train = [synthesize_sample(cfg, 0, "train", i)[0][..., 0].astype(np.float64).ravel() for i in range(6)]
    val = [synthesize_sample(cfg, 0, "validation", i)[0][..., 0].astype(np.float64).ravel() for i in range(6)]
    for t in train:
        for v in val:
            r = np.corrcoef(t, v)[0, 1]
            assert abs(r) < 0.5, r  # independent fields; shared phases would give r ~ 1
    # ... while the four channels of one universe are snapshots of the same particles
    full = synthesize_sample(cfg, 0, "train", 0)[0].astype(np.float64)
    assert np.corrcoef(full[..., 0].ravel(), full[..., 1].ravel())[0, 1] > 0.8


def test_zeldovich_displacement_has_the_linear_divergence():
    """div psi1 = -delta_L, checked spectrally on a random field."""
    n, box = 16, 50.0
    rng = np.random.default_rng(0)
    delta_k = np.fft.rfftn(rng.standard_normal((n, n, n)))
    delta_k[0, 0, 0] = 0
    # band-limit: a derivative of the Nyquist modes is not a real field
    delta_k[n // 2, :, :] = delta_k[:, n // 2, :] = delta_k[:, :, n // 2] = 0
    delta = np.fft.irfftn(delta_k, s=(n, n, n), axes=(0, 1, 2))
    psi1, psi2 = displacements(delta_k, n, box, order=2)
    k = np.fft.fftfreq(n, 1.0 / n) * 2 * np.pi / box
    kz = np.fft.rfftfreq(n, 1.0 / n) * 2 * np.pi / box
    ks = (k[:, None, None], k[None, :, None], kz[None, None, :])
    div_k = sum(1j * kc * np.fft.rfftn(psi1[:, i].reshape(n, n, n)) for i, kc in enumerate(ks))
    np.testing.assert_allclose(np.fft.irfftn(div_k, s=(n, n, n), axes=(0, 1, 2)), -delta, atol=1e-9)
    assert psi2.shape == (n ** 3, 3) and np.isfinite(psi2).all()


def test_counts_are_non_gaussian_and_grow_towards_low_redshift():
    cfg = SynthConfig(field="2lpt", cube_size=16, box_size_mpc_h=64.0, mean_particles_per_cell=8)
    full = synthesize_sample(cfg, 0, "train", 0)[0].astype(np.float64)
    var = full.var(axis=(0, 1, 2))
    assert np.all(np.diff(var) < 0)  # z = 0 clumpiest, z = 3 smoothest
    z0 = full[..., 0].ravel()
    skew = ((z0 - z0.mean()) ** 3).mean() / z0.std() ** 3
    assert skew > 0.5  # streaming into sheets and filaments: a long tail of full cells


@pytest.mark.parametrize("order", [1, 2])
def test_lpt_order_changes_the_field(order):
    base = SynthConfig(**{**SMALL, "lpt_order": 1})
    other = SynthConfig(**{**SMALL, "lpt_order": order})
    same = synthesize_sample(base, 0, "train", 0)[0].tobytes() == synthesize_sample(other, 0, "train", 0)[0].tobytes()
    assert same == (order == 1)
