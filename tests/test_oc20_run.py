"""OpenCatalyst (oc20) through the harness: the reference config builds the reference model and
trains a step on real-format records; the data commands read, check, convert, prepare and stage
the OCP LMDB format; a tiny run writes a log the report scores; a hostile LMDB is one line and
exit 2. The full mini run to the target is `slow`."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import lmdb
import pytest
import torch
from click.testing import CliRunner

from mlhpc import config as cfg
from mlhpc.cli import main
from mlhpc.workload import get

TINY = ["--set", "synth.train_samples=48", "--set", "synth.validation_samples=16",
        "--set", "synth.files_per_split=2", "--set", "train.max_epochs=1", "--set", "train.target=10.0",
        "--set", "model.hidden_channels=16", "--set", "model.out_emb_channels=16",
        "--set", "model.int_emb_size=8", "--set", "train.threads=1"]


@pytest.fixture(scope="module")
def mini_data(tmp_path_factory, repo) -> Path:
    data = tmp_path_factory.mktemp("oc20") / "data"
    out = CliRunner().invoke(main, ["data", "synth", "oc20", "--out", str(data), "--config",
                                    str(repo / "configs" / "opencatalyst-mini.yaml"), *TINY])
    assert out.exit_code == 0, out.output
    return data


def test_reference_config_builds_the_reference_model_and_trains_a_step(repo, mini_data):
    config = cfg.load(repo / "configs" / "opencatalyst.yaml", (f"data.path={mini_data}",))
    workload = get("oc20")
    model = workload.build_model(config.model)
    assert sum(p.numel() for p in model.parameters()) == 1_810_182
    train, _ = workload.build_datasets(config, None, mini_data)
    x, y = train.collate_fn([train[i] for i in range(4)])  # records read from the LMDB files
    optimizer, scheduler = workload.build_optimizer(model, config, 1)
    loss = workload.build_loss(config)(model.train()(x), y)
    loss.backward()
    optimizer.step()
    scheduler.step()
    assert torch.isfinite(loss) and optimizer.param_groups[0]["lr"] == pytest.approx(
        0.0004 * (0.2 * (1 - 1 / 31252) + 1 / 31252))


def test_data_commands_on_the_lmdb_format(mini_data, tmp_path):
    check = CliRunner().invoke(main, ["data", "check", "oc20", str(mini_data), "--full", "--format", "json"])
    assert check.exit_code == 0, check.output
    report = json.loads(check.stdout)
    assert report["format"] == "lmdb" and report["splits"]["train"]["samples"] == 48
    converted = CliRunner().invoke(main, ["data", "convert", "oc20", str(mini_data), str(tmp_path / "again"),
                                          "--to", "lmdb"])
    assert converted.exit_code == 0, converted.output
    again = CliRunner().invoke(main, ["data", "check", "oc20", str(tmp_path / "again"), "--full"])
    assert again.exit_code == 0 and "48 samples" in again.stdout, again.output


def test_prepare_makes_lmdb_from_extxyz(tmp_path):
    from ase.build import add_adsorbate, fcc111
    from ase.calculators.emt import EMT
    from ase.io import write

    raw = tmp_path / "raw"
    raw.mkdir()
    for k in range(3):
        frames = []
        for step in range(4):
            slab = fcc111("Cu", size=(2, 2, 3), vacuum=6.0)
            add_adsorbate(slab, "O", 1.5, "fcc")
            slab.rattle(0.02, seed=10 * k + step)
            slab.calc = EMT()
            slab.get_forces()
            frames.append(slab)
        write(raw / f"traj{k}.extxyz", frames)
    out = CliRunner().invoke(main, ["data", "prepare", "oc20", str(raw), str(tmp_path / "lmdb"),
                                    "--option", "validation_fraction=0.2"])
    assert out.exit_code == 0, out.output
    check = CliRunner().invoke(main, ["data", "check", "oc20", str(tmp_path / "lmdb"), "--full", "--format", "json"])
    assert check.exit_code == 0, check.output
    splits = json.loads(check.stdout)["splits"]
    assert splits["train"]["samples"] == 8 and splits["validation"]["samples"] == 4


def test_a_hostile_lmdb_is_one_line_and_exit_2(mini_data, tmp_path):
    import shutil

    data = tmp_path / "data"
    shutil.copytree(mini_data, data)
    victim = sorted((data / "train").glob("*.lmdb"))[0]
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (subprocess.call, (["touch", str(marker)],))

    env = lmdb.open(str(victim), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"0", pickle.dumps(Payload()))
    env.close()
    out = CliRunner().invoke(main, ["data", "check", "oc20", str(data), "--full"])
    assert out.exit_code == 2 and not marker.exists()
    assert victim.name in out.stderr and "'0'" in out.stderr and "Traceback" not in out.stderr


def test_a_tiny_run_is_logged_and_reported(repo, mini_data, tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "run", str(repo / "configs" / "opencatalyst-mini.yaml"),
                           *TINY, "--set", f"data.path={mini_data}", "--set", f"output.dir={out}"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary_0.json").read_text())
    assert summary["workload"] == "oc20" and summary["status"] == "success"
    assert summary["perf"]["train_flops_per_sample"] > 0 and summary["samples_per_s"] > 0
    assert any("EMT" in line for line in summary["departs_from_reference"])
    report = CliRunner().invoke(main, ["report", str(out), "--format", "json"])
    assert report.exit_code == 0, report.output
    assert "oc20" in report.stdout


@pytest.mark.slow
def test_the_mini_run_reaches_the_target_and_passes_the_checker(repo, tmp_path):
    """`mlhpc run configs/opencatalyst-mini.yaml` from nothing: eval_error <= 0.036 within 15
    minutes on this 2-core machine, and the official checker accepts the log."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "run", str(repo / "configs" / "opencatalyst-mini.yaml"),
                           "--set", f"data.path={tmp_path / 'data'}", "--set", f"output.dir={out}"],
                          capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((out / "summary_0.json").read_text())
    assert summary["status"] == "success" and summary["metric_series"][-1][1] <= 0.036
    checker = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "hpc",
                              "--ruleset", "3.0.0", str(out / "result_0.txt")],
                             capture_output=True, text=True, cwd=tmp_path)
    assert "SUCCESS" in checker.stdout + checker.stderr


def test_a_batch_counts_structures(mini_data):
    train, _ = get("oc20").build_datasets(cfg.load(Path(__file__).resolve().parents[1] / "configs" /
                                                    "opencatalyst-mini.yaml", (f"data.path={mini_data}",)),
                                          None, mini_data)
    x, _ = train.collate_fn([train[i] for i in range(5)])
    assert train.batch_len(x) == 5 and x["pos"].shape[0] > 5


def test_the_mini_task_needs_the_network(repo, mini_data):
    """Predicting zero forces, or each element's mean training force, stays at least 1.25x the
    target on the validation set's free atoms of the mini config's data (0.0685 eV/A both on
    the full mini set, README; here on the tiny draw the other tests share)."""
    config = cfg.load(repo / "configs" / "opencatalyst-mini.yaml", (f"data.path={mini_data}",))
    train, valid = get("oc20").build_datasets(config, None, mini_data)
    sums: dict[int, torch.Tensor] = {}
    counts: dict[int, int] = {}
    for i in range(len(train)):
        s = train[i]
        for z, f in zip(s["atomic_numbers"][~s["fixed"]].tolist(), s["forces"][~s["fixed"]]):
            sums[z] = sums.get(z, torch.zeros(3)) + f
            counts[z] = counts.get(z, 0) + 1
    zero, mean = [], []
    for i in range(len(valid)):
        s = valid[i]
        free = ~s["fixed"]
        forces = s["forces"][free]
        guess = torch.stack([sums.get(z, torch.zeros(3)) / max(counts.get(z, 1), 1)
                             for z in s["atomic_numbers"][free].tolist()])
        zero.append(forces.abs().reshape(-1))
        mean.append((forces - guess).abs().reshape(-1))
    assert torch.cat(zero).mean() >= 1.25 * 0.036 and torch.cat(mean).mean() >= 1.25 * 0.036
