"""``mlhpc validate``: Deep500's levels pass on this CPU for the minis, fail naming the module of a
model that computes differently in float32 than in float64, and refuse bad input in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
#: CosmoFlow mini, shrunk: a tiny model and a few synthetic samples.
TINY = ("model.input_size=16", "model.conv_channels=2", "model.n_conv_layers=2",
        "synth.train_samples=16", "synth.eval_samples=8", "synth.samples_per_file=8",
        "train.threads=1")
#: The data of each mini cut to a few samples (the model is the mini's own).
FEW = {"cosmoflow": ("synth.train_samples=16", "synth.eval_samples=8", "synth.samples_per_file=8"),
       "deepcam": ("synth.train_samples=8", "synth.validation_samples=4"),
       "opencatalyst": ("synth.train_samples=8", "synth.validation_samples=4"),
       "openfold": ("synth.train_chains=8", "synth.validation_chains=4",
                    "model.init_checkpoint=null")}  # its start checkpoint fits the full mini data only


def sets(*overrides: str) -> list[str]:
    return [part for o in overrides for part in ("--set", o)]


def mlhpc(*args: str, env: dict | None = None, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlhpc", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT,
                          env={**os.environ, "MLHPC_STORE": "none", "OMP_NUM_THREADS": "1",
                               **(env or {})})


def cosmoflow(tmp: Path, levels: str) -> subprocess.CompletedProcess:
    return mlhpc("validate", "configs/cosmoflow-mini.yaml", "--level", levels, "--format", "json",
                 *sets(*TINY, f"data.path={tmp / 'data'}", f"output.dir={tmp / 'out'}"))


def test_cosmoflow_mini_passes_levels_0_to_2_on_the_cpu(tmp_path: Path) -> None:
    proc = cosmoflow(tmp_path, "0,1,2")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    found = json.loads(proc.stdout)
    assert found["passed"] and found["levels"] == [0, 1, 2] and found["precision"] == "fp32"
    checks = found["checks"]
    names = {c["name"] for c in checks}
    assert {"forward Conv3d (features.0)", "backward Conv3d (features.0)", "output", "loss",
            "step 3 loss"} <= names, sorted(names)
    backward = next(c for c in checks if c["name"] == "backward Conv3d (features.0)")
    assert backward["error"] < 1e-4 and "drawn at random" in backward["note"]
    tanh = next(c for c in checks if c["name"].startswith("backward Tanh"))
    assert "gradcheck passed" in tanh["note"]
    rerun = next(c for c in checks if c["name"] == "rerun of 3 steps: losses")
    assert rerun["error"] == 0.0 and rerun["note"] == "bit-identical"


@pytest.mark.slow
def test_cosmoflow_mini_passes_all_four_levels_on_the_cpu(tmp_path: Path) -> None:
    proc = cosmoflow(tmp_path, "0,1,2,3")
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    found = json.loads(proc.stdout)
    assert found["passed"] and found["levels"] == [0, 1, 2, 3]
    level3 = [c for c in found["checks"] if c["level"] == 3]
    assert {"gradients (all parameters)", "ranks agree"} <= {c["name"] for c in level3}
    assert all(c["passed"] for c in level3)


SKEWED = '''
import torch
from mlhpc_toy import WORKLOAD as TOY
from dataclasses import replace


class Skewed(torch.nn.Module):
    """Computes differently in float32 than in float64 (a broken kernel)."""

    def __init__(self):
        super().__init__()
        self.scale = torch.nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * self.scale + (1e-3 if x.dtype == torch.float32 else 0.0)


def build(cfg):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(cfg.inputs, 8), torch.nn.Tanh(), Skewed(),
                               torch.nn.Linear(8, 1))


WORKLOAD = replace(TOY, name="skewed", build_model=build)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The toy workload and a "skewed" one built on it, installed through the entry points."""
    root = tmp_path_factory.mktemp("site")
    (root / "mlhpc_toy.py").write_text((ROOT / "tests" / "toy_workload" / "mlhpc_toy.py").read_text())
    (root / "mlhpc_skewed.py").write_text(SKEWED)
    info = root / "mlhpc_skewed-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlhpc-skewed\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mlhpc.workloads]\nskewed = mlhpc_skewed:WORKLOAD\n")
    return root


def test_a_module_computing_otherwise_in_float32_fails_naming_it(site: Path, tmp_path: Path) -> None:
    config = tmp_path / "skewed.yaml"
    config.write_text(f"workload: skewed\nsubmission: {{org: t, platform: cpu, division: open, "
                      f"status: research}}\ndata: {{path: {tmp_path / 'data'}, "
                      f"synthesize_if_missing: true}}\ntrain: {{global_batch_size: 8, max_epochs: 1, threads: 1}}\n"
                      f"output: {{dir: {tmp_path / 'out'}}}\n")
    env = {"PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = mlhpc("validate", str(config), "--level", "0,1", "--format", "json", env=env)
    assert proc.returncode == 1, proc.stderr[-3000:]
    failed = [c for c in json.loads(proc.stdout)["checks"] if c["passed"] is False]
    assert any(c["level"] == 0 and c["name"] == "forward Skewed (2)" for c in failed), failed
    assert any(c["level"] == 1 and "(Skewed)" in c["name"] for c in failed), failed
    assert not any(c["level"] == 0 and "Linear" in c["name"] for c in failed), failed
    table = mlhpc("validate", str(config), "--level", "0", env=env)
    assert table.returncode == 1 and "forward Skewed (2)" in table.stdout.replace("\n", " ") \
        or "Skewed" in table.stdout, table.stdout[-2000:]


@pytest.mark.parametrize("args, said", [
    (("--level", "0,5"), "--level '0,5': unknown level '5'"),
    (("--precision", "fp8"), "--precision 'fp8': expected one of fp32, bf16, fp16"),
    (("--device", "tpu"), "--device 'tpu': expected auto, cpu or cuda"),
    (("--steps", "0"), "--steps 0: must be an integer from 1 to 100"),
])
def test_bad_input_is_one_line_and_exit_2(args: tuple[str, ...], said: str, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from mlhpc.cli import main

    result = CliRunner().invoke(main, ["validate", "configs/cosmoflow-mini.yaml", *args,
                                       *sets(f"data.path={tmp_path / 'none'}")])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: ") and said in lines[0], lines
    assert not (tmp_path / "none").exists()  # refused before any data were made


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_asked_without_it_is_one_line_and_exit_2(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from mlhpc.cli import main

    result = CliRunner().invoke(main, ["validate", "configs/cosmoflow-mini.yaml", "--device", "cuda"])
    assert result.exit_code == 2 and "no CUDA device is visible" in result.output, result.output


def test_dropout_and_draws_are_the_same_in_both_precisions() -> None:
    from mlhpc.validate.checks import SameDraws

    x = torch.ones(4, 3, 5)
    with SameDraws(7):
        a = torch.nn.functional.dropout(x, 0.5, True), torch.rand(3), torch.nn.Dropout2d(0.5)(x)
    with SameDraws(7):
        b = (torch.nn.functional.dropout(x.double(), 0.5, True), torch.rand(3, dtype=torch.float64),
             torch.nn.Dropout2d(0.5)(x.double()))
    for u, v in zip(a, b):
        assert torch.equal(u.double(), v.to(u.dtype).double())
    assert 0 < int((a[0] == 0).sum()) < a[0].numel()
    assert (a[2] == 0).all(dim=-1).sum() == (a[2] == 0).sum() / 5  # whole channels dropped


def test_errors_are_deep500s_metrics() -> None:
    from mlhpc.validate.checks import TOLERANCES, errors

    want = [torch.tensor([3.0, 4.0])]
    l2, top = errors([torch.tensor([3.0, 4.5])], want)
    assert l2 == pytest.approx(0.5 / 5) and top == pytest.approx(0.5 / 4)
    assert errors([torch.tensor([float("nan"), 4.0])], want)[0] != errors([torch.tensor([3.0, 4.0])], want)[0]
    tol = TOLERANCES
    assert tol["fp32"].operator < tol["fp16"].operator < tol["bf16"].operator
    assert tol["fp32"].network < tol["fp16"].network < tol["bf16"].network


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(FEW))
def test_each_mini_passes_all_four_levels_on_the_cpu(name: str, tmp_path: Path) -> None:
    proc = mlhpc("validate", f"configs/{name}-mini.yaml", "--format", "json",
                 *sets(*FEW[name], f"data.path={tmp_path / 'data'}", f"output.dir={tmp_path / 'out'}"),
                 timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:] + proc.stdout[-3000:]
    found = json.loads(proc.stdout)
    failed = [c for c in found["checks"] if c["passed"] is False]
    assert found["passed"] and not failed, failed
    assert {c["level"] for c in found["checks"]} == {0, 1, 2, 3}
