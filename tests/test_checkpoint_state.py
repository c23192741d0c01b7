"""A checkpoint's state: the run's parts by name, written by `save`, read back by `load`
and `checked`, loaded by `restore`; the file keeps the layout every mlhpc checkpoint has had."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mlhpc import config as cfg
from mlhpc.errors import ConfigError
from mlhpc.run.checkpoint import (
    TorchRandom,
    TrainState,
    checked,
    entries,
    load,
    restore,
    save,
)

ROOT = Path(__file__).resolve().parents[1]
#: The file's entries as checkpoints were written before the state became one mapping.
LAYOUT = {"config", "epoch", "step", "history", "result_file", "elapsed_s", "model", "optimizer",
          "scheduler", "torch_rng"}


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    root = tmp_path_factory.mktemp("state")
    return cfg.load(ROOT / "configs" / "cosmoflow-mini.yaml",
                    [f"data.path={root / 'absent'}", "data.synthesize_if_missing=false",
                     f"output.dir={root / 'out'}"])


def _states(config, seed: int, width: int = 3) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Linear(width, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    model(torch.ones(1, width)).sum().backward()
    optimizer.step()  # momentum buffers: optimizer state worth restoring
    scheduler.step()
    return {"model": model, "optimizer": optimizer, "scheduler": scheduler,
            "train_state": TrainState(config), "rng": TorchRandom()}


def test_saved_states_keep_the_file_layout_and_come_back_whole(config, tmp_path):
    saved_parts = _states(config, seed=1)
    counters = saved_parts["train_state"]
    counters.epoch, counters.step, counters.history = 3, 5, [(1, 0.25), (2, 0.5)]
    counters.result_file, counters.elapsed_s = "result_0.txt", 12.5
    torch.manual_seed(7)
    rng = torch.get_rng_state()
    save(tmp_path / "checkpoint_0.pt", saved_parts)
    raw = load(tmp_path / "checkpoint_0.pt", "t")
    assert set(raw) == LAYOUT
    assert raw["model"].keys() == {"weight", "bias"} and raw["history"] == [[1, 0.25], [2, 0.5]]

    fresh = _states(config, seed=2)
    torch.manual_seed(99)
    restore(fresh, checked(raw, "t"), "t")
    assert torch.equal(fresh["model"].weight, saved_parts["model"].weight)
    assert torch.equal(fresh["optimizer"].state_dict()["state"][0]["momentum_buffer"],
                       saved_parts["optimizer"].state_dict()["state"][0]["momentum_buffer"])
    assert fresh["scheduler"].last_epoch == 1 and fresh["optimizer"].param_groups[0]["lr"] == 0.05
    loaded = fresh["train_state"]
    assert (loaded.epoch, loaded.step, loaded.history, loaded.result_file, loaded.elapsed_s) == \
        (3, 5, [(1, 0.25), (2, 0.5)], "result_0.txt", 12.5)
    assert loaded.config is config  # the run's own, never replaced by the saved dict
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_checkpoint_in_the_earlier_layout_loads(config):
    """A dict as `CheckpointState.to_dict` wrote it (optional entries absent, as the oldest)."""
    source = _states(config, seed=3)
    old = {"config": config.to_dict(), "epoch": 2, "step": 0,
           **{name: source[name].state_dict() for name in ("model", "optimizer", "scheduler")}}
    fresh = _states(config, seed=4)
    before = torch.get_rng_state()
    restore(fresh, checked(old, "t"), "t")
    assert torch.equal(fresh["model"].bias, source["model"].bias)
    assert (fresh["train_state"].epoch, fresh["train_state"].history) == (2, [])
    assert fresh["train_state"].elapsed_s == 0.0 and fresh["train_state"].result_file is None
    assert torch.equal(torch.get_rng_state(), before)  # no torch_rng: the state left as it is


def test_an_excluded_part_is_left_as_it_is(config):
    saved = checked(entries(_states(config, seed=5)), "t")
    fresh = _states(config, seed=6)
    weight = fresh["model"].weight.detach().clone()
    restore(fresh, saved, "t", exclude=("model",))
    assert torch.equal(fresh["model"].weight, weight)
    assert fresh["optimizer"].state_dict()["state"]


def test_weights_of_another_shape_are_one_error_naming_the_source(config):
    saved = checked(entries(_states(config, seed=5, width=4)), "t")
    with pytest.raises(ConfigError, match=r"^--resume x\.pt: the saved state does not fit the "
                                          r"model its config builds \("):
        restore({"model": _states(config, seed=6)["model"]}, saved, "--resume x.pt")
