"""Guesses get a hint (issue 26, point 4): ``-h`` is ``--help`` everywhere, and a mistyped config
key, config path or workload name is one line on stderr naming the closest valid one (exit 2)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.hints import closest, existing_file


def _commands(group, prefix=()):
    """Every command path of the click tree, groups included."""
    yield prefix
    for name, cmd in getattr(group, "commands", {}).items():
        yield from _commands(cmd, prefix + (name,))


@pytest.mark.parametrize("path", list(_commands(main)), ids=lambda p: " ".join(p) or "mlhpc")
def test_dash_h_is_help_on_every_command(path):
    short = CliRunner().invoke(main, [*path, "-h"])
    long = CliRunner().invoke(main, [*path, "--help"])
    assert short.exit_code == 0, short.output
    assert short.output == long.output and short.output.startswith("Usage:")


def _error(args, cwd):
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_mistyped_set_key_suggests_the_closest(repo, monkeypatch):
    monkeypatch.chdir(repo)
    line = _error(["run", "configs/cosmoflow-mini.yaml", "--set", "train.max_epoch=3"], repo)
    assert line == ("mlhpc: error: --set train.max_epoch: names no config key; "
                    "did you mean train.max_epochs?")
    line = _error(["run", "configs/cosmoflow-mini.yaml", "--set", "model.conv_chanels=3"], repo)
    assert line.endswith("did you mean model.conv_channels?")  # a workload's own section
    line = _error(["run", "configs/cosmoflow-mini.yaml", "--set", "train.zzzz=3"], repo)
    assert "did you mean" not in line  # nothing close: no guess


def test_mistyped_key_in_a_file_is_named_before_the_value_it_leaves_missing(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("workload: cosmoflow\ntrain: {global_batch_size: 1, max_epoch: 2}\n")
    line = _error(["run", str(config)], tmp_path)
    assert f"{config}: train.max_epoch: unknown key; did you mean train.max_epochs?" in line


def test_config_path_without_suffix_names_the_file_that_exists(repo, monkeypatch):
    monkeypatch.chdir(repo)
    line = _error(["run", "configs/cosmoflow-mini"], repo)
    assert line == ("mlhpc: error: configs/cosmoflow-mini: config file not found; "
                    "did you mean configs/cosmoflow-mini.yaml?")
    assert "did you mean configs/deepcam-mini.yaml?" in _error(["run", "configs/deepcam-mnii.yaml"], repo)


def test_unknown_workload_suggests_the_closest(repo, tmp_path):
    line = _error(["data", "synth", "cosmoflwo", "--out", str(tmp_path / "d")], tmp_path)
    assert "unknown workload 'cosmoflwo' (did you mean 'cosmoflow'?)" in line


def test_helpers(tmp_path):
    assert closest("max_epoch", ["max_epochs", "seed"]) == "max_epochs"
    assert closest("qqq", ["max_epochs", "seed"]) is None
    (tmp_path / "a.yml").write_text("")
    assert existing_file(tmp_path / "a") == tmp_path / "a.yml"
    assert existing_file(tmp_path / "zzz") is None
