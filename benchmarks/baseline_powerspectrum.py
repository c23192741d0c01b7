"""Power-spectrum baseline for the embedded CosmoFlow task: how far does a summary statistic get?

If ridge regression on the power spectrum reached the mini config's target, the benchmark would
time a 3-D CNN on a problem that the two-point function solves. Per sample and redshift channel
the features are the binned power spectrum of ``log(1 + counts)`` (the reference's input
transform; log of the mean |DFT|^2 in ``n_bins`` linear shells of |k| from the fundamental to the
corner of the grid) plus the mean and the variance of ``log(1 + counts)``: 4 x (n_bins + 2)
numbers, 40 by default. The features are standardised on the training set and the four
normalised targets fitted by ridge regression, the penalty chosen by 5-fold cross-validation on
the training set (mean absolute error); predictions are clipped to [-1, 1]; the score is the
validation mean absolute error over the four targets, the harness's ``eval_error``.

Usage: python benchmarks/baseline_powerspectrum.py [--config configs/cosmoflow-mini.yaml]
       [--data DIR | --train N --validation N] [--json out.json]
With ``--data`` the files of a synthesised (or real, HDF5 ``full``/``unitPar``) dataset are read;
otherwise ``--train`` / ``--validation`` samples are synthesised in memory with the config's
``synth`` section (the same numbers the files hold). Prints one JSON object.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from baseline_common import argument_parser, emit, parse_args, synth_seed  # noqa: E402

from mlhpc import config as cfg  # noqa: E402

try:  # the installed name; the source tree's folder otherwise
    from mlhpc_workloads.cosmoflow import synth  # noqa: E402
except ImportError:  # pragma: no cover - an older editable install
    from workloads.cosmoflow import synth  # noqa: E402

ALPHAS = (1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


def features(full: np.ndarray, n_bins: int = 8) -> np.ndarray:
    """Power-spectrum features of counts.

    Args:
        full: ``(N, S, S, S, C)`` particle counts (any integer or float dtype).
        n_bins: linear |k| shells between the fundamental and the grid's corner.
    Returns:
        float64 ``(N, C * (n_bins + 2))``: per channel the log binned power spectrum of
        ``log(1 + counts)``, then per channel its mean, then per channel its variance.
    """
    n, s = full.shape[0], full.shape[1]
    field = np.log1p(full.astype(np.float64))
    mean, var = field.mean(axis=(1, 2, 3)), field.var(axis=(1, 2, 3))
    f = np.fft.fftfreq(s, 1.0 / s)
    fz = np.fft.rfftfreq(s, 1.0 / s)
    k = np.sqrt(f[:, None, None] ** 2 + f[None, :, None] ** 2 + fz[None, None, :] ** 2).ravel()
    shell = np.digitize(k, np.linspace(0.5, k.max() + 1e-9, n_bins + 1)) - 1
    counts = np.bincount(shell[shell >= 0], minlength=n_bins)[:n_bins]
    spectra = []
    for c in range(full.shape[-1]):
        g = field[..., c] - mean[:, c, None, None, None]
        power = (np.abs(np.fft.rfftn(g, axes=(1, 2, 3))) ** 2).reshape(n, -1)
        binned = np.stack([np.bincount(shell[shell >= 0], weights=p[shell >= 0], minlength=n_bins)[:n_bins]
                           for p in power]) / counts
        spectra.append(np.log(binned + 1e-12))
    return np.concatenate(spectra + [mean, var], axis=1)


def _solve(x: np.ndarray, y: np.ndarray, alpha: float) -> np.ndarray:
    return np.linalg.solve(x.T @ x + alpha * np.eye(x.shape[1]), x.T @ y)


def ridge(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray,
          folds: int = 5) -> dict:
    """Standardise, choose the ridge penalty by k-fold CV (MAE), fit, score on validation.

    Returns ``{"validation_mae", "per_parameter_mae", "alpha", "train_mae"}`` (MAE of the
    normalised targets, predictions clipped to [-1, 1]).
    """
    mu, sd = x_train.mean(0), x_train.std(0) + 1e-12
    xt, xv = (x_train - mu) / sd, (x_val - mu) / sd
    ym = y_train.mean(0)
    fold = np.arange(len(xt)) % folds
    scores = {}
    for alpha in ALPHAS:
        err = 0.0
        for f in range(folds):
            w = _solve(xt[fold != f], y_train[fold != f] - ym, alpha)
            err += np.abs(np.clip(xt[fold == f] @ w + ym, -1, 1) - y_train[fold == f]).mean()
        scores[alpha] = err / folds
    alpha = min(scores, key=scores.get)
    w = _solve(xt, y_train - ym, alpha)
    per = np.abs(np.clip(xv @ w + ym, -1, 1) - y_val).mean(0)
    return {"validation_mae": float(per.mean()), "per_parameter_mae": [float(v) for v in per],
            "alpha": alpha, "train_mae": float(np.abs(np.clip(xt @ w + ym, -1, 1) - y_train).mean())}


def read_split(folder: Path, limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``full`` and ``unitPar`` of every HDF5 file under ``folder`` (per-sample or sharded)."""
    xs, ys = [], []
    for path in sorted(folder.glob("*.h5")) + sorted(folder.glob("*.hdf5")):
        with h5py.File(path, "r") as f:
            x, y = f["full"][()], f["unitPar"][()]
        xs.append(x if x.ndim == 5 else x[None])
        ys.append(y if y.ndim == 2 else y[None])
        if limit is not None and sum(len(v) for v in xs) >= limit:
            break
    x, y = np.concatenate(xs), np.concatenate(ys)
    return (x, y) if limit is None else (x[:limit], y[:limit])


def synthesise_split(synth_cfg, seed: int, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``split`` synthesised in memory: counts ``(n, S, S, S, 4)``, targets ``(n, 4)``."""
    samples = [synth.synthesize_sample(synth_cfg, seed, split, i) for i in range(n)]
    return np.stack([s[0] for s in samples]), np.stack([s[1] for s in samples])


def run(config_path: Path, data: Path | None, n_train: int, n_validation: int) -> dict:
    """The baseline on the config's embedded data (files under ``data``, or synthesised)."""
    config = cfg.load(config_path)
    target = config.train.target if config.train.target is not None else 0.124
    start = time.perf_counter()
    if data is not None:
        x_tr, y_tr = read_split(data / "train", n_train)
        x_va, y_va = read_split(data / "validation", n_validation)
    else:
        seed = synth_seed(config)  # the data's own seed
        x_tr, y_tr = synthesise_split(config.synth, seed, "train", n_train)
        x_va, y_va = synthesise_split(config.synth, seed, "validation", n_validation)
    load_s = time.perf_counter() - start
    result = ridge(features(x_tr), y_tr, features(x_va), y_va)
    return {"config": str(config_path), "data": str(data) if data else "synthesised in memory",
            "train_samples": len(x_tr), "validation_samples": len(x_va), "load_s": round(load_s, 1),
            **result, "target_eval_error": target,
            "baseline_over_target": result["validation_mae"] / target}


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__, REPO / "configs/cosmoflow-mini.yaml")
    parser.add_argument("--data", type=Path, help="a dataset folder with train/ and validation/")
    parser.add_argument("--train", type=int, help="training samples (default: all, or 2048 synthesised)")
    parser.add_argument("--validation", type=int, help="validation samples (default: all, or 512)")
    args = parse_args(parser, argv)
    n_train = args.train if args.train or args.data else 2048
    n_val = args.validation if args.validation or args.data else 512
    return emit(run(args.config, args.data, n_train, n_val), args.json)


if __name__ == "__main__":
    sys.exit(main())
