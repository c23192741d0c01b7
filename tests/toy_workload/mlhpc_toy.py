"""A toy third workload, shipped as its own package with an ``mlhpc.workloads`` entry point: a
linear regression y = 0.3 x1 - 0.2 x2 + 0.1 from text files of ``x1 x2 y`` lines (format
``toytxt``), convertible to npy files (format ``toynpy``).

It exists to prove the contract is the only door: tests/test_toy_workload.py installs it through
the entry-point group and runs ``mlhpc data check | convert``, ``mlhpc stage`` and ``mlhpc run``
on it; nothing of the harness names it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from mlhpc.data.files import atomic_output
from mlhpc.errors import DataError
from mlhpc.workload import (
    NO_PROGRESS,
    DataTools,
    FileCheck,
    QualityMetric,
    SynthProgress,
    Workload,
    WorkloadDataset,
    last_files_to_validation,
)

COEF = np.array([0.3, -0.2], dtype=np.float32)


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inputs: int = Field(2, ge=1, description="input features")


class OptimizerConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lr: float = Field(0.1, gt=0, description="SGD learning rate")


class SynthConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    files: int = Field(4, ge=1, description="files per split")
    rows: int = Field(32, ge=1, description="samples per file")


def _read(path: Path) -> np.ndarray:
    """float32 (n, 3) rows of a toy file, either format. Raises DataError naming the file."""
    try:
        rows = np.load(path) if path.suffix == ".toynpy" else np.loadtxt(path, dtype=np.float32, ndmin=2)
    except (OSError, ValueError) as exc:
        raise DataError(f"{path}: not a toy file ({exc})") from None
    if rows.ndim != 2 or rows.shape[1] != 3 or not np.isfinite(rows).all():
        raise DataError(f"{path}: expected finite rows of x1 x2 y")
    return rows.astype(np.float32)


class PrepareOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    validation_fraction: float = Field(0.25, ge=0, lt=1, description="share of files for validation/")


class ToyTools(DataTools):
    formats = ("toytxt", "toynpy")
    convert_to = ("toynpy",)
    prepare_options = PrepareOptions

    def detect(self, split_dir: Path) -> str:
        names = {p.suffix for p in Path(split_dir).iterdir() if not p.name.startswith(".")}
        return "toynpy" if ".toynpy" in names else "toytxt"

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        suffix = ".toynpy" if fmt == "toynpy" else ".toy"
        return sorted(p for p in Path(split_dir).iterdir() if p.suffix == suffix)

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        rows = _read(path)
        return FileCheck(len(rows), (3,), "float32", path.stat().st_size)

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        rows = _read(path)
        final = Path(out_dir) / (path.stem + ".toynpy")
        with atomic_output(final) as tmp:
            with open(tmp, "wb") as handle:
                np.save(handle, rows)
        return [(final, len(rows))]

    def list_raw(self, raw_dir: Path) -> list[Path]:
        return sorted(Path(raw_dir).glob("*.toy"))

    def prepare_splits(self, raw: list[Path], options: PrepareOptions) -> list[tuple[str, Path]]:
        return last_files_to_validation(raw, options.validation_fraction, self.splits)

    def prepare_file(self, path: Path, out_dir: Path, to: str, options: PrepareOptions
                     ) -> list[tuple[Path, int]]:
        return self.convert_file(path, "toytxt", out_dir, to)


TOOLS = ToyTools()


class ToyDataset(WorkloadDataset):
    def __init__(self, folder: Path) -> None:
        fmt = TOOLS.detect(folder)
        self.rows = np.concatenate([_read(p) for p in TOOLS.list_files(folder, fmt)])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        row = torch.from_numpy(self.rows[i])
        return row[:2], row[2:]


def build_datasets(config: Any, runtime: Any, data_dir: Path) -> tuple[ToyDataset, ToyDataset]:
    return ToyDataset(Path(data_dir) / "train"), ToyDataset(Path(data_dir) / "validation")


def synthesize(out_dir: Path, cfg: SynthConfig, seed: int,
               progress: SynthProgress = NO_PROGRESS) -> None:
    rng = np.random.default_rng(seed)
    progress.plan(2 * cfg.files * cfg.rows)
    for split in ("train", "validation"):
        (Path(out_dir) / split).mkdir(parents=True, exist_ok=True)
        for k in range(cfg.files):
            x = rng.uniform(-1, 1, size=(cfg.rows, 2)).astype(np.float32)
            y = x @ COEF + 0.1
            np.savetxt(Path(out_dir) / split / f"part{k:03d}.toy", np.column_stack([x, y]), fmt="%.7f")
            progress.done(cfg.rows)


def mae_stats(output: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    err = (output.detach().double() - target.double()).abs()
    return err.sum(), torch.tensor(float(err.numel()), dtype=torch.float64)


def build_optimizer(model: torch.nn.Module, config: Any, steps_per_epoch: int):
    return torch.optim.SGD(model.parameters(), lr=config.optimizer.lr), None


WORKLOAD = Workload(
    name="toy",
    model_config=ModelConfig,
    optimizer_config=OptimizerConfig,
    synth_config=SynthConfig,
    build_model=lambda cfg: torch.nn.Linear(cfg.inputs, 1),
    build_datasets=build_datasets,
    synthesize=synthesize,
    build_loss=lambda config: torch.nn.functional.mse_loss,
    metric=QualityMetric(key="eval_error", target=0.02, direction="min", batch_stats=mae_stats),
    build_optimizer=build_optimizer,
    hyperparameters=lambda config: {"opt_name": "sgd", "opt_base_learning_rate": config.optimizer.lr},
    departures=lambda config: ["toy workload: not an MLPerf benchmark"],
    data_tools=TOOLS,
)
