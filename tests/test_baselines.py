"""Summary-statistic baselines on the embedded tasks (benchmarks/baseline_*.py), on small samples.

CosmoFlow: ridge regression on the power spectrum of log(1 + counts) (40 numbers per sample).
On the main mini data (configs/cosmoflow-mini.yaml, log-normal, training and validation universes
sharing their initial phases) it gets below the reference target 0.124 without any network: the
leak that config documents (measured 0.085 on its full 8,192 / 512 samples). On the 2LPT variant
with independent phases (configs/cosmoflow-mini-2lpt.yaml) it stays far above: measured 0.390 on
128 / 64 samples and 0.361 on the full 8,192 / 512 samples.

DeepCAM: per-pixel threshold rules and multinomial logistic regression on the 16 input channels
stay below the 0.82 mean-IoU target: measured 0.749 (logistic) and 0.472 (threshold) on 128 / 64
samples of the mini config's data.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import baseline_deepcam  # noqa: E402
import baseline_powerspectrum  # noqa: E402

from mlhpc import config as cfg  # noqa: E402

REFERENCE_TARGET_MAE = 0.124


def _ridge(config_name: str, n_train: int, n_val: int) -> dict:
    config = cfg.load(ROOT / "configs" / config_name)
    x_tr, y_tr = baseline_powerspectrum.synthesise_split(config.synth, 0, "train", n_train)
    x_va, y_va = baseline_powerspectrum.synthesise_split(config.synth, 0, "validation", n_val)
    return baseline_powerspectrum.ridge(baseline_powerspectrum.features(x_tr), y_tr,
                                        baseline_powerspectrum.features(x_va), y_va)


@pytest.fixture(scope="module")
def cosmoflow_ridge() -> dict:
    """The baseline on 96 training / 48 validation 2LPT universes with independent phases."""
    return _ridge("cosmoflow-mini-2lpt.yaml", 96, 48)


def test_power_spectrum_ridge_stays_far_from_the_target_on_independent_2lpt_data(cosmoflow_ridge):
    result = cosmoflow_ridge
    assert len(result["per_parameter_mae"]) == 4
    # measured 0.36-0.39 from 96 to 8,192 training samples: 2x the reference target at least
    assert result["validation_mae"] >= 2 * REFERENCE_TARGET_MAE, result


def test_power_spectrum_ridge_finds_what_the_spectrum_holds(cosmoflow_ridge):
    """The baseline is not a straw man: on the same features it recovers sigma_8 far better than
    the 0.5 of a constant guess (uniform targets on [-1, 1])."""
    result = cosmoflow_ridge
    assert result["per_parameter_mae"][1] < 0.35, result  # sigma_8


def test_shared_phase_mini_data_leak_lets_the_power_spectrum_reach_the_target():
    """The documented leak of configs/cosmoflow-mini.yaml: its validation universes share their
    initial phases with training, and ridge regression on the power spectrum gets below the
    0.124 target without a network (measured 0.104 on 96 / 64, 0.086 on 512 / 64 and 0.085 on
    the full 8,192 / 512 samples). If this fails, the mini data no longer leak: update the config
    header and the README."""
    config = cfg.load(ROOT / "configs/cosmoflow-mini.yaml")
    assert config.synth.phase_realizations == 1
    result = _ridge("cosmoflow-mini.yaml", 256, 64)
    target = config.train.target if config.train.target is not None else REFERENCE_TARGET_MAE
    assert target == REFERENCE_TARGET_MAE
    assert result["validation_mae"] <= target, result


def test_per_pixel_baselines_miss_the_deepcam_target():
    config = cfg.load(ROOT / "configs/deepcam-mini.yaml")
    target = config.train.target if config.train.target is not None else 0.82
    seed = baseline_deepcam.synth_seed(config)
    x_tr, y_tr = baseline_deepcam.load(config.synth, seed, "train", 8)
    x_va, y_va = baseline_deepcam.load(config.synth, seed, "validation", 16)
    logistic = baseline_deepcam.logistic_baseline(x_tr, y_tr, x_va, y_va, max_pixels=40_000, max_iter=50)
    threshold = baseline_deepcam.threshold_baseline(x_tr, y_tr, x_va, y_va, n_thresholds=8)
    best = max(logistic["validation_mean_iou"], threshold["validation_mean_iou"])
    assert 0.0 <= best <= 1.0
    # measured margin below the target: 0.071 on 128 / 64 samples; small samples scatter more
    assert best <= target - 0.04, (logistic, threshold)
    assert np.isfinite(logistic["validation_mean_iou"])
