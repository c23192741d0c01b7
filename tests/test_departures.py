"""Faithfulness to the reference: every departure of a config is named, and the example Slurm
scripts run as many runs as the MLPerf HPC rules require for a closed submission."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlperf_logging.benchmark_meta import get_result_file_counts

from mlhpc import config as cfg
from mlhpc.workload import get

ROOT = Path(__file__).resolve().parents[1]


def _departures(path: str) -> list[str]:
    config = cfg.load(ROOT / path)
    workload = get(config.workload)
    assert workload.departures is not None
    return workload.departures(config)


@pytest.mark.parametrize("path", ["configs/cosmoflow.yaml", "configs/deepcam.yaml"])
def test_reference_configs_have_no_departures(path: str) -> None:
    assert _departures(path) == []


def test_cosmoflow_mini_names_every_departure() -> None:
    notes = _departures("configs/cosmoflow-mini.yaml")
    text = "\n".join(notes)
    config = cfg.load(ROOT / "configs/cosmoflow-mini.yaml")
    # data, cube size and sample counts
    assert re.search(rf"synthetic .*{config.synth.cube_size}\^3 x 4 .*reference 128\^3 x 4", text)
    assert f"samples {config.synth.train_samples}/{config.synth.eval_samples} " \
           "(reference 524288/65536)" in text
    # model width, depth, dropout, standardisation, input size
    for key in ("input_size", "conv_channels", "n_conv_layers", "dropout", "input_standardization"):
        assert any(n.startswith(f"model.{key}=") for n in notes), key
    # optimizer: Adam instead of the reference SGD with momentum
    assert "optimizer.name='adam' (reference 'sgd')" in notes
    # the target, when the mini config sets its own
    if config.train.target is not None and config.train.target != 0.124:
        assert any(n.startswith("target eval_error") for n in notes)
    # phases: named when shared, silent when every universe has its own (as the reference)
    assert ("phases:" in text) == (getattr(config.synth, "phase_realizations", None) is not None)


def test_cosmoflow_departures_follow_overrides() -> None:
    config = cfg.load(ROOT / "configs/cosmoflow.yaml",
                      overrides=["optimizer.name=adam", "train.target=0.2", "model.dropout=0.0"])
    notes = get("cosmoflow").departures(config)
    assert "optimizer.name='adam' (reference 'sgd')" in notes
    assert "model.dropout=0.0 (reference 0.5)" in notes
    assert "target eval_error <= 0.2 (reference 0.124)" in notes
    assert len(notes) == 3


def test_deepcam_mini_names_every_departure() -> None:
    notes = _departures("configs/deepcam-mini.yaml")
    text = "\n".join(notes)
    config = cfg.load(ROOT / "configs/deepcam-mini.yaml")
    assert f"{config.synth.height} x {config.synth.width} grid (reference 768 x 1152" in text
    assert f"samples {config.synth.train_samples}/{config.synth.validation_samples} " \
           "(reference 121266/15158)" in text
    for key in ("entry_channels", "middle_blocks", "exit_channels", "aspp_channels"):
        assert any(n.startswith(f"model.{key}=") for n in notes), key
    for key in ("lr", "milestones", "warmup_steps"):
        assert any(n.startswith(f"optimizer.{key}=") for n in notes), key
    assert "train.global_batch_size=8 (reference 2048)" in notes


def _runs_in(script: str) -> int:
    """How many trainings a sbatch script starts: sequential runs x side-by-side instances."""
    text = (ROOT / "scripts/slurm" / script).read_text()
    seq = re.search(r"for run in \$\(seq 0 (\d+)\)", text)
    runs = int(seq.group(1)) + 1 if seq else len(re.search(r"for run in ([\d ]+);", text)
                                                   .group(1).split())
    inst = re.search(r"for i in ([\d ]+); do\n", text)
    instances = len(inst.group(1).split()) if inst else 1
    return runs * instances


@pytest.mark.parametrize("script, name", [("cosmoflow-strong-scaling.sbatch", "cosmoflow"),
                                               ("deepcam-weak-scaling.sbatch", "deepcam"),
                                               ("opencatalyst-5-runs.sbatch", "oc20")])
def test_example_scripts_run_what_the_rules_require(script: str, name: str) -> None:
    """hpc_training_rules.adoc, "Benchmark Results": DeepCAM 5 runs, CosmoFlow 10, OpenCatalyst
    5; the same counts are what mlperf_logging's result_summarizer demands."""
    required = get_result_file_counts("hpc")[name]
    assert required == {"cosmoflow": 10, "deepcam": 5, "oc20": 5}[name]
    assert _runs_in(script) == required
    text = (ROOT / "scripts/slurm" / script).read_text()
    seeds = re.search(r"SEEDS=\(([\d ]+)\)", text).group(1).split()
    assert len(set(seeds)) == len(seeds)
    assert "hpc_training_rules.adoc" in text
