"""The OpenFold training pieces on the data side: the weight average the benchmark evaluates
(decay, evaluation uses it, not a DDP buffer, kept in the state dict), clipping, the schedule."""

from __future__ import annotations

from pathlib import Path

import torch
from mlhpc_workloads.openfold.training import (
    AveragedAlphaFold,
    build_model,
    build_optimizer,
)

from mlhpc import config as cfg

ROOT = Path(__file__).resolve().parents[1]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, batch):
        return {"out": self.w * batch["x"]}


def test_the_average_follows_the_weights_and_evaluation_uses_it():
    model = AveragedAlphaFold(_Net(), decay=0.9)
    with torch.no_grad():
        model.net.w.fill_(2.0)
    model.update_average()
    assert torch.allclose(model.average["w"], torch.full((3,), 1.1))  # 0.9 * 1 + 0.1 * 2
    x = {"x": torch.ones(3)}
    assert torch.allclose(model.train()(x)["out"], torch.full((3,), 2.0))
    assert torch.allclose(model.eval()(x)["out"], torch.full((3,), 1.1))
    assert list(model.buffers()) == [] and [n for n, _ in model.named_parameters()] == ["net.w"]


def test_the_average_moves_and_is_saved_and_restored():
    model = AveragedAlphaFold(_Net(), decay=0.5)
    model.average["w"].fill_(7.0)
    state = model.state_dict()
    assert torch.equal(state["swa.w"], torch.full((3,), 7.0))
    other = AveragedAlphaFold(_Net(), decay=0.5)
    other.load_state_dict(state)
    assert torch.equal(other.average["w"], torch.full((3,), 7.0))
    assert other.double().average["w"].dtype == torch.float64
    del state["swa.w"]
    result = AveragedAlphaFold(_Net(), decay=0.5).load_state_dict(state, strict=False)
    assert result.missing_keys == ["swa.w"]


def test_gradients_are_clipped_before_each_step_and_the_average_updated_after():
    config = cfg.load(ROOT / "configs" / "openfold-mini.yaml",
                      ("model.evoformer_blocks=1", "model.structure_blocks=1"))
    model = build_model(config.model)
    optimizer, scheduler = build_optimizer(model, config, 1)
    params = list(model.net.parameters())
    for p in params:
        p.grad = torch.full_like(p, 10.0)
    before = {n: v.clone() for n, v in model.average.items()}
    optimizer.step()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
    assert abs(float(norm) - config.optimizer.gradient_clip_norm) < 1e-4
    moved = [n for n in before if not torch.equal(before[n], model.average[n])]
    assert moved and scheduler.get_last_lr()[0] == config.optimizer.lr  # no warm-up in the reference
