"""The OpenFold mini's starting checkpoint, shipped in the repo as the benchmark ships its own
(docs/openfold.md, "The mini's starting checkpoint"): the file the config names has the sha256
the config pins, loads into the mini config's network through the workload's own build_model,
records the training chains it was made from, and runs no code when read."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import pytest
import torch

from mlhpc import config as cfg
from mlhpc.errors import ConfigError
from mlhpc.workload import get

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "openfold-mini.yaml"


@pytest.fixture(scope="module")
def mini():
    return cfg.load(MINI)


def _shipped(mini) -> Path:
    assert mini.model.init_checkpoint, "configs/openfold-mini.yaml names no starting checkpoint"
    path = ROOT / mini.model.init_checkpoint  # relative to the repository, where the README runs it
    assert path.is_file(), path
    return path


def test_the_shipped_checkpoint_has_the_sha256_the_config_pins(mini):
    path = _shipped(mini)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == mini.model.init_checkpoint_sha256
    assert path.stat().st_size < 8 << 20  # the mini network's weights: a few MB at most


def test_it_loads_into_the_mini_network_through_build_model(mini, monkeypatch):
    monkeypatch.chdir(ROOT)
    model = get("openfold").build_model(mini.model)
    saved = torch.load(_shipped(mini), map_location="cpu", weights_only=True)
    weights = saved["model"]
    state = model.net.state_dict()
    assert set(weights) == set(state)
    for name, value in weights.items():
        assert torch.equal(state[name], value), name
    # what it was made from, kept in the file: the training chains' identity the config checks
    assert saved["data_identity"] == mini.model.init_checkpoint_data_identity
    assert isinstance(saved["step"], int) and saved["step"] > 0


def test_a_checkpoint_that_would_run_code_is_refused_unrun(tmp_path, mini):
    """build_model reads with weights_only: a pickle that would call a function when loaded is
    one ConfigError line, and the function never runs."""
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (Path.touch, (marker,))

    path = tmp_path / "init.pt"
    path.write_bytes(pickle.dumps({"model": Payload()}))
    model_cfg = mini.model.model_copy(update={"init_checkpoint": str(path), "init_checkpoint_sha256": None})
    with pytest.raises(ConfigError, match="model.init_checkpoint cannot be loaded"):
        get("openfold").build_model(model_cfg)
    assert not marker.exists()
