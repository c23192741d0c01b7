"""Per-pixel baselines for the embedded DeepCAM task: can the mini target be met without a network?

DeepCAM segments tropical cyclones and atmospheric rivers from 16 CAM5 variables. If a classifier
that looks at one pixel's 16 values at a time reached the mini config's target (mean IoU, the
``eval_accuracy`` of `mlhpc_workloads.deepcam.metric`), the benchmark would time a convolutional
network on a task a per-pixel rule solves. Two baselines, fitted on training samples and scored on
validation samples with the harness's own metric:

- ``threshold``: per class (cyclone, river), the single channel, direction and threshold whose
  rule ``x > t`` (or ``x < t``) has the best training IoU for that class; a pixel is a cyclone if
  the cyclone rule fires, else a river if the river rule fires, else background;
- ``logistic``: multinomial logistic regression on the 16 min-max normalised channels (the
  reference's normalisation, from the training split's extrema), fitted by L-BFGS on a sample of
  training pixels, with the reference's class weights (frequency ** -0.125) or balanced weights;
  the better of the two weightings is reported.

Usage: python benchmarks/baseline_deepcam.py [--config configs/deepcam-mini.yaml]
       [--train N] [--validation N] [--json out.json]
Samples are drawn in memory by the synthesiser (`synth.make_sample`, the same bytes the files hold).
Prints one JSON object: per-baseline validation mean IoU, the target and the margin.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from baseline_common import argument_parser, emit, parse_args, synth_seed  # noqa: E402

from mlhpc import config as cfg  # noqa: E402

try:  # the installed name; the source tree's folder otherwise
    from mlhpc_workloads.deepcam import metric, synth  # noqa: E402
except ImportError:  # pragma: no cover - an older editable install
    from workloads.deepcam import metric, synth  # noqa: E402

CLASS_FREQUENCIES = (0.986267818390377, 0.0004578708870701058, 0.01327431072255291)


def load(synth_cfg, seed: int, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` samples of ``split``: float32 (n, H, W, 16) fields and int64 (n, H, W) labels."""
    pairs = [synth.make_sample(synth_cfg, seed, split, i) for i in range(n)]
    return (np.stack([p[0] for p in pairs]).astype(np.float32),
            np.stack([p[1] for p in pairs]).astype(np.int64))


def _iou(pred: np.ndarray, label: np.ndarray) -> float:
    """Validation mean IoU, the harness's metric (mean over samples of the mean over 3 classes)."""
    return float(metric.per_sample_iou(torch.from_numpy(pred), torch.from_numpy(label)).mean())


def threshold_baseline(x_tr, y_tr, x_va, y_va, n_thresholds: int = 48) -> dict:
    """Best single-channel threshold rule per class, chosen on training IoU (the river rule on the
    pixels the cyclone rule leaves), scored by validation mean IoU."""
    flat, lab = x_tr.reshape(-1, x_tr.shape[-1]), y_tr.reshape(-1)
    rules = {}
    taken = np.zeros(len(lab), dtype=bool)  # pixels the cyclone rule already claimed
    for cls in (1, 2):
        truth = lab == cls
        best = (-1.0, 0, 1, 0.0)
        for ch in range(flat.shape[1]):
            v = flat[:, ch]
            for t in np.quantile(v, np.linspace(0.5, 0.9995, n_thresholds)):
                for sign in (1, -1):
                    fire = ((v > t) if sign > 0 else (v < t)) & ~taken
                    inter = np.count_nonzero(fire & truth)
                    union = np.count_nonzero(fire | truth)
                    score = inter / union if union else 1.0
                    if score > best[0]:
                        best = (score, ch, sign, float(t))
        rules[cls] = best
        _, ch, sign, t = best
        taken |= (flat[:, ch] > t) if sign > 0 else (flat[:, ch] < t)

    def predict(x):
        pred = np.zeros(x.shape[:-1], dtype=np.int64)
        for cls in (2, 1):  # cyclone wins where both fire
            _, ch, sign, t = rules[cls]
            fire = (x[..., ch] > t) if sign > 0 else (x[..., ch] < t)
            pred[fire] = cls
        return pred

    names = list(synth.CHANNELS)
    return {"validation_mean_iou": _iou(predict(x_va), y_va),
            "rules": {int(c): {"channel": names[r[1]], "sign": r[2],
                               "threshold": r[3], "train_iou": r[0]} for c, r in rules.items()}}


def logistic_baseline(x_tr, y_tr, x_va, y_va, max_pixels: int = 400_000, seed: int = 0,
                      max_iter: int = 200) -> dict:
    """Multinomial logistic regression on min-max normalised channels; the better weighting."""
    lo, hi = x_tr.min(axis=(0, 1, 2)), x_tr.max(axis=(0, 1, 2))
    scale = np.where(hi > lo, hi - lo, 1.0)
    flat = ((x_tr.reshape(-1, x_tr.shape[-1]) - lo) / scale).astype(np.float32)
    lab = y_tr.reshape(-1)
    rng = np.random.default_rng(seed)
    take = rng.choice(len(lab), size=min(max_pixels, len(lab)), replace=False)
    xs, ys = torch.from_numpy(flat[take]), torch.from_numpy(lab[take])
    counts = np.bincount(lab, minlength=3).astype(np.float64)
    weightings = {"reference": torch.tensor([f ** -0.125 for f in CLASS_FREQUENCIES]),
                  "balanced": torch.tensor(counts.sum() / np.maximum(counts, 1) / 3)}
    xv = torch.from_numpy(((x_va - lo) / scale).astype(np.float32))
    results = {}
    for name, weight in weightings.items():
        torch.manual_seed(seed)
        layer = torch.nn.Linear(xs.shape[1], 3).double()
        opt = torch.optim.LBFGS(layer.parameters(), max_iter=max_iter, line_search_fn="strong_wolfe")
        loss_fn = torch.nn.CrossEntropyLoss(weight=weight.double())
        xd = xs.double()

        def closure():
            opt.zero_grad()
            loss = loss_fn(layer(xd), ys) + 1e-4 * layer.weight.square().sum()
            loss.backward()
            return loss

        opt.step(closure)
        with torch.no_grad():
            pred = layer(xv.double()).argmax(-1).numpy()
        results[name] = _iou(pred, y_va)
    best = max(results, key=results.get)
    return {"validation_mean_iou": results[best], "weighting": best, "by_weighting": results}


def run(config_path: Path, n_train: int, n_validation: int) -> dict:
    """Both baselines on ``n_train`` / ``n_validation`` samples of the config's embedded data."""
    config = cfg.load(config_path)
    target = config.train.target if config.train.target is not None else metric.TARGET_IOU
    start = time.perf_counter()
    seed = synth_seed(config)
    x_tr, y_tr = load(config.synth, seed, "train", n_train)
    x_va, y_va = load(config.synth, seed, "validation", n_validation)
    synth_s = time.perf_counter() - start
    out = {"config": str(config_path), "train_samples": n_train, "validation_samples": n_validation,
           "target_mean_iou": target, "synthesis_s": round(synth_s, 1)}
    for name, fn in (("threshold", threshold_baseline), ("logistic", logistic_baseline)):
        t = time.perf_counter()
        out[name] = fn(x_tr, y_tr, x_va, y_va)
        out[name]["fit_s"] = round(time.perf_counter() - t, 1)
    best = max(out["threshold"]["validation_mean_iou"], out["logistic"]["validation_mean_iou"])
    out["best_baseline_mean_iou"] = best
    out["target_minus_best"] = target - best
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__, REPO / "configs/deepcam-mini.yaml")
    parser.add_argument("--train", type=int, default=128, help="training samples to fit on")
    parser.add_argument("--validation", type=int, default=64, help="validation samples to score")
    args = parse_args(parser, argv)
    return emit(run(args.config, args.train, args.validation), args.json)


if __name__ == "__main__":
    sys.exit(main())
