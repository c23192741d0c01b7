"""No-network baselines for the embedded OC20 task: can forces be predicted without a network?

The mini task's quality is the reference's ``eval_error``: the forces MAE (eV/A, mean over free
atoms and the three components) on the validation split, target 0.036. Two predictions that use
no structure, fitted on the training split's free atoms and scored on the validation split's:

- ``zero``: every force 0 (the MAE is then the mean |F component|);
- ``element_mean``: for each element, its mean training force vector (elements unseen in
  training predict 0).

The task needs a network when both stay at least 1.25x the target (0.045 eV/A). Also reported:
the mean force norm |F| on validation free atoms, atoms per structure, structures per split.

Usage: python benchmarks/baseline_oc20.py [--config configs/opencatalyst-mini.yaml]
       [--data DIR] [--train N] [--validation N] [--json out.json]
Without ``--data`` the config's synth section (the SynthConfig defaults when the config does not
exist) is synthesised into a temporary folder with the config's data seed (0 without a config).
Prints one JSON object.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from baseline_common import argument_parser, emit, parse_args, synth_seed

try:  # the installed name; the source tree's folder otherwise
    from mlhpc_workloads.opencatalyst import data, synth
except ImportError:  # pragma: no cover - not installed with the OC20 package yet
    from workloads.opencatalyst import data, synth

TARGET_EV_PER_A = 0.036
NEEDS_NETWORK_FACTOR = 1.25


def free_atom_forces(folder: Path, limit: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Atomic numbers int64 (M,) and forces float64 (M, 3) eV/A of the free atoms of the first
    ``limit`` structures of a split folder, and the atoms per structure int64 (S,)."""
    dataset = data.Oc20Dataset(folder, limit)
    z, forces, natoms = [], [], []
    for i in range(len(dataset)):
        rec = dataset[i]
        free = ~rec["fixed"]
        z.append(rec["atomic_numbers"][free].numpy())
        forces.append(rec["forces"][free].numpy().astype(np.float64))
        natoms.append(int(rec["natoms"]))
    return np.concatenate(z), np.concatenate(forces), np.asarray(natoms)


def baselines(train_dir: Path, val_dir: Path, n_train: int | None = None,
              n_val: int | None = None) -> dict:
    """The two baselines' validation forces MAE (eV/A) and the data's figures (module docstring)."""
    z_tr, f_tr, _ = free_atom_forces(train_dir, n_train)
    z_va, f_va, natoms = free_atom_forces(val_dir, n_val)
    means = {int(e): f_tr[z_tr == e].mean(axis=0) for e in np.unique(z_tr)}
    pred = np.stack([means.get(int(e), np.zeros(3)) for e in z_va])
    result = {
        "zero_mae_eV_per_A": float(np.abs(f_va).mean()),
        "element_mean_mae_eV_per_A": float(np.abs(f_va - pred).mean()),
        "mean_force_norm_eV_per_A": float(np.linalg.norm(f_va, axis=1).mean()),
        "atoms_per_structure": {"mean": float(natoms.mean()), "min": int(natoms.min()), "max": int(natoms.max())},
        "free_atoms_validation": len(z_va),
        "target_eV_per_A": TARGET_EV_PER_A,
    }
    worst = min(result["zero_mae_eV_per_A"], result["element_mean_mae_eV_per_A"])
    result["margin_over_target"] = worst / TARGET_EV_PER_A
    result["needs_network"] = worst >= NEEDS_NETWORK_FACTOR * TARGET_EV_PER_A
    return result


def _synth_settings(config_path: Path) -> tuple[synth.SynthConfig, int]:
    if not config_path.is_file():
        return synth.SynthConfig(), 0
    from mlhpc import config as cfg

    config = cfg.load(config_path)
    return config.synth, synth_seed(config)


def main(argv: list[str] | None = None) -> int:
    parser = argument_parser(__doc__, REPO / "configs" / "opencatalyst-mini.yaml")
    parser.add_argument("--data", type=Path, help="an existing data folder (train*/ and val*/)")
    parser.add_argument("--train", type=int, help="first N training structures (default all)")
    parser.add_argument("--validation", type=int, help="first N validation structures (default all)")
    args = parse_args(parser, argv)
    with tempfile.TemporaryDirectory() as tmp:
        data_dir, seconds = args.data, None
        if data_dir is None:
            synth_cfg, seed = _synth_settings(args.config)
            data_dir, start = Path(tmp) / "oc20", time.perf_counter()
            synth.synthesize(data_dir, synth_cfg, seed)
            seconds = time.perf_counter() - start
        train_dir, val_dir = data.find_split_dirs(data_dir)
        result = baselines(train_dir, val_dir, args.train, args.validation)
    result["synthesis_s"] = seconds
    return emit(result, args.json)


if __name__ == "__main__":
    sys.exit(main())
