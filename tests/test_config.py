from pathlib import Path

import pytest
import yaml

from mlhpc import config as cfg
from mlhpc.errors import ConfigError

MINI = {"workload": "cosmoflow", "train": {"global_batch_size": 8, "max_epochs": 3}}


def write(tmp_path: Path, tree: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(tree))
    return path


def test_defaults_file_and_overrides_layer(tmp_path):
    path = write(tmp_path, {**MINI, "model": {"input_size": 32}})
    config = cfg.load(path, ("train.max_epochs=7", "model.conv_channels=4"))
    assert config.train.max_epochs == 7  # --set beats the file
    assert config.train.global_batch_size == 8  # file beats defaults
    assert config.model.input_size == 32 and config.model.conv_channels == 4
    assert config.model.fc1_size == 128  # workload default
    assert config.submission.division == "open"


def test_resolved_config_round_trips(tmp_path):
    config = cfg.load(write(tmp_path, MINI), ("model.input_size=64",))
    cfg.save(config, tmp_path / "resolved.yaml")
    again = cfg.load(tmp_path / "resolved.yaml")
    assert again.to_dict() == config.to_dict()


@pytest.mark.parametrize("tree, overrides, fragment", [
    ({**MINI, "trian": {}}, (), "trian: unknown key"),
    ({**MINI, "train": {"global_batch_size": "big", "max_epochs": 3}}, (), "train.global_batch_size"),
    ({**MINI, "train": {"global_batch_size": 0, "max_epochs": 3}}, (), "train.global_batch_size"),
    ({"workload": "cosmoflow", "train": {"max_epochs": 3}}, (), "train.global_batch_size: required"),
    ({**MINI, "workload": "nope"}, (), "unknown workload 'nope'"),
    ({**MINI, "submission": {"division": "closedish"}}, (), "submission.division"),
    (MINI, ("train.max_epoch=3",), "--set train.max_epoch: names no config key"),
    (MINI, ("train.max_epochs",), "expected section.key=value"),
    ({**MINI, "model": {"input_size": 30}}, (), "model"),
])
def test_bad_config_names_key(tmp_path, tree, overrides, fragment):
    with pytest.raises(ConfigError) as err:
        cfg.load(write(tmp_path, tree), overrides)
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="nothere.yaml: config file not found"):
        cfg.load(tmp_path / "nothere.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml: not valid YAML at line"):
        cfg.load(bad)


def test_shipped_configs_validate(repo):
    for path in sorted((repo / "configs").glob("*.yaml")):
        cfg.load(path)
