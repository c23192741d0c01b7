"""`mlhpc profile --roofline PNG`: the machine's measured ceilings and, under them, the training
step and its heaviest operators; tested for values (FLOPs and bytes by hand, the step's FLOPs
equal to the run's counted FLOPs, the figure's roofs and points at the measured values), not
pixels. The same on every workload's mini step is `slow`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from torch.utils.flop_counter import FlopCounterMode

from mlhpc import config as cfg
from mlhpc.run.roofline_figure import Ceilings, Roofline, RooflinePoint, roofline_figure
from mlhpc.run.profile import profile
from mlhpc.run.roofline import KernelSizes, OperatorTally, measure_ceilings, roofline, tally_step
from mlhpc.run.step import Step

TINY = ("synth.cube_size=16", "synth.train_samples=16", "synth.eval_samples=8", "model.input_size=16",
        "model.conv_channels=4", "model.n_conv_layers=3", "model.dropout=0.0", "train.global_batch_size=8",
        "train.threads=1", "optimizer.name=sgd")
SMALL = KernelSizes(gemm=128, conv_batch=2, conv_filters=8, conv_side=8, copy_bytes=1 << 20)


@pytest.fixture(scope="module")
def tiny_cosmoflow(tmp_path_factory, repo) -> Path:
    data = tmp_path_factory.mktemp("roofline") / "data"
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "data", "synth", "cosmoflow", "--out", str(data),
                           "--config", str(repo / "configs" / "cosmoflow-mini.yaml"),
                           *[a for o in TINY for a in ("--set", o)]], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return data


def test_the_tally_counts_an_operators_flops_and_bytes_as_by_hand():
    model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x, y = torch.randn(8, 64), torch.randn(8, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = Step(model, torch.nn.functional.mse_loss, optimizer, None, "fp32", torch.device("cpu"))
    tally = tally_step(model, optimizer, step, x, y)
    first = next(p for p in tally.points() if p.label == "addmm [32]" and p.flops == 2 * 8 * 64 * 32)
    # addmm(bias, x, W^T): bias 32, x 8x64, W^T 64x32 read, 8x32 written, fp32
    assert first.traffic_bytes == 4 * (32 + 8 * 64 + 64 * 32 + 8 * 32) and first.calls == 1 and first.seconds > 0
    assert not any(p.label.startswith(("t ", "view ")) for p in tally.points())  # views move no data
    with FlopCounterMode(display=False) as counter:  # the same FLOPs as torch's own counter
        torch.nn.functional.mse_loss(model(x), y).backward()
    assert sum(p.flops for p in tally.points()) == counter.get_total_flops()


def test_measured_ceilings_and_the_roof_they_make():
    ceilings = measure_ceilings(torch.device("cpu"), "fp32", seconds=0.02, sizes=SMALL)
    assert ceilings.gemm_flop_per_s > 1e6 and ceilings.conv_flop_per_s > 1e6 and ceilings.copy_bytes_per_s > 1e6
    assert ceilings.device == "cpu" and ceilings.precision == "fp32" and "GEMM 128^3" in ceilings.kernels[0]
    ridge = ceilings.ridge_flop_per_byte
    assert ceilings.attainable(ridge / 4) == pytest.approx(ridge / 4 * ceilings.copy_bytes_per_s)
    assert ceilings.attainable(ridge * 4) == ceilings.peak_flop_per_s


def test_the_figure_draws_the_measured_ceilings_and_points():
    ceilings = Ceilings(4.0e10, 3.0e10, 5.0e9, "fp32", "cpu", ("k",))
    step = RooflinePoint("training step", 2.0e9, 1.0e8, 0.5)
    ops = [RooflinePoint("convolution [8x4]", 1.0e9, 2.0e7, 0.05, 2), RooflinePoint("mm [8x128]", 1.0e8, 4.0e7, 0.01)]
    fig = roofline_figure(Roofline("cosmoflow", ceilings, step, ops, ["note"]))
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert list(lines["roof-gemm"].get_ydata()) == [4.0e10, 4.0e10]
    assert list(lines["roof-conv"].get_ydata()) == [3.0e10, 3.0e10]
    xs, ys = lines["roof-copy"].get_xdata(), lines["roof-copy"].get_ydata()
    assert ys[0] == pytest.approx(xs[0] * 5.0e9) and ys[-1] == 4.0e10  # bandwidth, then the peak
    assert (lines["point-step"].get_xdata()[0], lines["point-step"].get_ydata()[0]) == (20.0, 4.0e9)
    assert (lines["point-op-0"].get_xdata()[0], lines["point-op-0"].get_ydata()[0]) == (50.0, 2.0e10)
    legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert "convolution [8x4] x2" in legend and any("lower bound" in t.get_text() for t in fig.texts)


def test_profile_draws_the_tiny_cosmoflow_step_under_its_ceilings(tmp_path, repo, tiny_cosmoflow):
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", TINY + (f"data.path={tiny_cosmoflow}",))
    png = tmp_path / "roof" / "cosmoflow.png"
    result = profile(config, steps=2, warmup=1, trace_path=tmp_path / "trace.json", roofline_path=png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result.roofline_png == str(png)
    roof = result.roofline
    c, step = roof["ceilings"], roof["step"]
    assert c["precision"] == result.precision == "fp32" and c["device"] == "cpu"
    assert min(c["gemm_flop_per_s"], c["conv_flop_per_s"], c["copy_bytes_per_s"]) > 1e6
    # the step's FLOPs are the run's counted FLOPs (per sample x the local batch)
    assert step["flops"] == pytest.approx(result.flops["train_flops"] * result.local_batch_size, rel=1e-6)
    assert step["traffic_bytes"] > 0 and step["seconds"] > 0
    assert step["flop_per_s"] == pytest.approx(step["flops"] / step["seconds"])
    ops = roof["operators"]
    assert ops and all(a["flops"] >= b["flops"] for a, b in zip(ops, ops[1:]))
    assert any(op["label"].startswith("convolution") for op in ops)
    assert all(op["intensity_flop_per_byte"] == pytest.approx(op["flops"] / op["traffic_bytes"]) for op in ops)


def test_a_roofline_path_that_is_a_folder_is_one_line(tmp_path, repo):
    from mlhpc.cli import main

    out = CliRunner().invoke(main, ["profile", str(repo / "configs" / "cosmoflow-mini.yaml"), "--roofline",
                                    str(tmp_path), "--set", f"data.path={tmp_path / 'data'}",
                                    "--set", f"output.dir={tmp_path / 'out'}"])
    assert out.exit_code == 2 and "--roofline" in out.output and "is a folder" in out.output
    assert not (tmp_path / "data").exists()


def test_roofline_keeps_the_heaviest_operators_only():
    tally = OperatorTally(torch.device("cpu"))
    tally.groups.update({("mm", str(i)): [float(i), 10.0, 1.0, 1] for i in range(12)})
    tally.groups[("add", "x")] = [0.0, 50.0, 1.0, 1]
    roof = roofline("toy", Ceilings(1.0, 1.0, 1.0, "fp32", "cpu"), tally, step_s=2.0, top=3)
    assert [p.flops for p in roof.operators] == [11.0, 10.0, 9.0]
    assert roof.step.flops == sum(range(12)) and roof.step.traffic_bytes == 170.0 and roof.step.seconds == 2.0


#: Each workload's mini config, made small enough to synthesise in seconds (the step's model is
#: the mini's own but for CosmoFlow's and OpenFold's sizes taken from their tiny test runs).
MINI_STEPS = {
    "cosmoflow": ("cosmoflow-mini.yaml", TINY),
    "deepcam": ("deepcam-mini.yaml", ("synth.train_samples=8", "synth.validation_samples=4", "train.threads=1")),
    "oc20": ("opencatalyst-mini.yaml", ("synth.train_samples=24", "synth.validation_samples=8",
                                        "synth.files_per_split=1", "train.threads=1")),
    "openfold": ("openfold-mini.yaml", ("synth.train_chains=6", "synth.validation_chains=3", "synth.msa_depth=12",
                                        "synth.workers=1", "train.threads=1", "model.init_checkpoint=null")),
}


@pytest.mark.slow
@pytest.mark.parametrize("workload", sorted(MINI_STEPS))
def test_every_mini_step_has_its_roofline(tmp_path, repo, workload):
    name, overrides = MINI_STEPS[workload]
    config = cfg.load(repo / "configs" / name, overrides + (f"data.path={tmp_path / 'data'}",
                                                            f"output.dir={tmp_path / 'out'}"))
    png = tmp_path / f"{workload}.png"
    result = profile(config, steps=1, warmup=1, roofline_path=png)
    assert png.read_bytes()[:4] == b"\x89PNG"
    roof = result.roofline
    assert roof["workload"] == workload and roof["operators"] and roof["step"]["flops"] > 0
    assert min(roof["ceilings"][k] for k in ("gemm_flop_per_s", "conv_flop_per_s", "copy_bytes_per_s")) > 1e6
    if workload in ("cosmoflow", "deepcam"):  # a tensor batch: the step is the counted FLOPs exactly
        assert roof["step"]["flops"] == pytest.approx(result.flops["train_flops"] * result.local_batch_size, rel=1e-6)
