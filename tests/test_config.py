import os
import subprocess
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
    (tmp_path / "resolved.yaml").write_text(cfg.dump(config))
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


# ---- issue 15 item 4/8/9: every numeric field finite and in range, one line, exit 2 -----------

BASE = "workload: {workload}\ntrain: {{global_batch_size: 8, max_epochs: 3}}\n"


def run_cli(*args: str):
    """``mlhpc ARGS`` in process (click's CliRunner): (exit code, stderr)."""
    from click.testing import CliRunner

    from mlhpc.cli import main

    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stderr


def assert_one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.mark.parametrize("workload, extra, fragment", [
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 3, target: .inf}", "train.target: input should be a finite number"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 3, target: .nan}", "train.target: input should be a finite number"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 3, target: -.inf}", "train.target"),
    ("cosmoflow", "train: {global_batch_size: true, max_epochs: 3}", "train.global_batch_size: input should be a valid integer"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 1e23}", "train.max_epochs: input should be a valid integer"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 100000000000000000000000}", "train.max_epochs"),
    ("cosmoflow", "train: {global_batch_size: 8.0, max_epochs: 3}", "train.global_batch_size"),
    ("cosmoflow", "train: {global_batch_size: '8', max_epochs: 3}", "train.global_batch_size"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 3, seed: 9223372036854775808}", "train.seed"),
    ("cosmoflow", "train: {global_batch_size: 8, max_epochs: 3, seed: -1}", "train.seed"),
    ("cosmoflow", "optimizer: {base_learning_rate: .inf}", "optimizer.base_learning_rate: input should be a finite number"),
    ("cosmoflow", "optimizer: {weight_decay: .nan}", "optimizer.weight_decay"),
    ("cosmoflow", "optimizer: {decay_schedule: {32: .nan}}", "optimizer.decay_schedule.32"),
    ("cosmoflow", "optimizer: {decay_schedule: {32: -0.25}}", "optimizer.decay_schedule.32: input should be greater than 0"),
    ("cosmoflow", "optimizer: {decay_schedule: {32: 4.0}}", "optimizer.decay_schedule.32"),
    ("cosmoflow", "optimizer: {decay_schedule: {-32: 0.25}}", "optimizer.decay_schedule.-32"),
    ("cosmoflow", "optimizer: {decay_schedule: {true: 0.25}}", "optimizer.decay_schedule"),
    ("cosmoflow", "optimizer: {decay_schedule: {1.5: 0.25}}", "optimizer.decay_schedule"),
    ("cosmoflow", "model: {dropout: .nan}", "model.dropout"),
    ("cosmoflow", "synth: {redshifts: [0.0, 0.5, 1.5, .inf]}", "synth.redshifts.3"),
    ("cosmoflow", "synth: {mean_particles_per_cell: .inf}", "synth.mean_particles_per_cell"),
    ("cosmoflow", "synth: {train_samples: 1e3}", "synth.train_samples"),
    ("deepcam", "optimizer: {lr: .inf}", "optimizer.lr"),
    ("deepcam", "optimizer: {betas: [0.9, .nan]}", "optimizer.betas.1"),
    ("deepcam", "optimizer: {decay_rate: -0.1}", "optimizer.decay_rate"),
    ("deepcam", "optimizer: {eta_min: .inf}", "optimizer.eta_min"),
    ("deepcam", "optimizer: {milestones: [800, 99999999999999999999]}", "optimizer.milestones"),
    ("deepcam", "optimizer: {milestones: [true]}", "optimizer.milestones.0"),
    ("deepcam", "synth: {cyclones_per_sample: .nan}", "synth.cyclones_per_sample"),
])
def test_non_finite_and_non_integer_values_refused(tmp_path, workload, extra, fragment):
    path = tmp_path / "c.yaml"
    base = f"workload: {workload}\n" if extra.startswith("train:") else BASE.format(workload=workload)
    path.write_text(base + extra + "\n")
    code, err = run_cli("submit", str(path), "--dry-run")
    assert_one_line(code, err, str(path), fragment)


@pytest.mark.parametrize("text, value", [
    ("1e-3", 1e-3), ("1E+30", 1e30), ("1e30", 1e30), ("2.5e3", 2500.0), (".5e-2", 0.005),
    ("1.0e+30", 1e30), ("1.5", 1.5), ("3", 3)])
def test_exponent_floats_are_numbers_in_files_and_sets(tmp_path, text, value):
    """YAML 1.2 floats (``1e-3``, which YAML 1.1 reads as a string) are numbers, in a file and
    in a --set; what is not a number stays a string."""
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow") + f"optimizer: {{weight_decay: {text}}}\n")
    config = cfg.load(path, (f"optimizer.base_learning_rate={text}",))
    assert config.optimizer.weight_decay == value and config.optimizer.base_learning_rate == value
    key, parsed = cfg.parse_override(f"a.b={text}")
    assert parsed == value and type(parsed) is type(value)  # 3 stays an integer
    assert cfg.parse_override(f"a.b=-{text}") == ("a.b", -value)


@pytest.mark.parametrize("text", ["1e", "e3", "1e3x", "1_0e3", "1e+-3"])
def test_almost_numbers_stay_strings(text):
    assert cfg.parse_override(f"a.b={text}") == ("a.b", text)
    assert yaml.load(f"k: {text}", Loader=cfg.UniqueKeyLoader) == {"k": text}


@pytest.mark.parametrize("override", ["optimizer.base_learning_rate=.inf", "optimizer.base_learning_rate=-.inf",
                                      "optimizer.base_learning_rate=.nan", "optimizer.base_learning_rate=1e999"])
def test_exponent_floats_stay_finite(tmp_path, override):
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow"))
    code, err = run_cli("submit", str(path), "--dry-run", "--set", override)
    assert_one_line(code, err, "--set optimizer.base_learning_rate: input should be a finite number")


def test_exponent_floats_leave_other_yaml_loaders_alone():
    assert yaml.safe_load("k: 1e-3") == {"k": "1e-3"}  # the resolver is the config loader's own


def test_shipped_values_still_load(tmp_path):
    """Ints where floats are expected, tuples as YAML lists, digit-string keys (as JSON writes a
    saved config or checkpoint) are all still read."""
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow")
                    + "synth: {mean_particles_per_cell: 512, redshifts: [0, 0.5, 1.5, 3]}\n"
                    + "optimizer: {decay_schedule: {'12': 0.25, 20: 1}}\n")
    config = cfg.load(path)
    assert config.synth.redshifts == (0.0, 0.5, 1.5, 3.0)
    assert config.optimizer.decay_schedule == {12: 0.25, 20: 1.0}
    assert cfg.load(path, ("train.seed=9223372036854775807",)).train.seed == 2**63 - 1


@pytest.mark.parametrize("text, fragment", [
    ("workload: cosmoflow\ntrain: {global_batch_size: 8, max_epochs: 3}\ntrain: {seed: 1}\n",
     "line 3: duplicate key train (first at line 2)"),
    ("workload: cosmoflow\ntrain:\n  global_batch_size: 8\n  max_epochs: 3\n  global_batch_size: 16\n",
     "line 5: duplicate key global_batch_size (first at line 3)"),
    ("workload: cosmoflow\ntrain: {global_batch_size: 8, max_epochs: 3, max_epochs: 4}\n",
     "line 2: duplicate key max_epochs"),
    ("workload: cosmoflow\nworkload: deepcam\ntrain: {global_batch_size: 8, max_epochs: 3}\n",
     "line 2: duplicate key workload (first at line 1)"),
])
def test_duplicate_keys_name_key_and_line(tmp_path, text, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    code, err = run_cli("submit", str(path), "--dry-run")
    assert_one_line(code, err, str(path), fragment)


def test_merge_keys_may_be_overridden(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("workload: cosmoflow\nbase: &b {global_batch_size: 8, max_epochs: 3}\n")
    tree = cfg.read_yaml(path)
    path.write_text("workload: cosmoflow\ntrain:\n  <<: {global_batch_size: 8, max_epochs: 3}\n"
                    "  max_epochs: 5\n")
    assert cfg.load(path).train.max_epochs == 5
    assert tree["base"]["max_epochs"] == 3


@pytest.mark.parametrize("content, fragment", [
    (b"workload: cosmoflow\ntrain: {global_batch_size: 8, max_epochs: 3}\n# \xe9t\xe9\n",
     "not UTF-8 text (byte 0xe9"),
    (b"\xff\xfe\x00w\x00o", "NUL bytes"),
    (bytes(range(256)) * 4, "not a text file"),
])
def test_binary_or_non_utf8_config(tmp_path, content, fragment):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    for args in (["submit", str(path), "--dry-run"], ["run", str(path)],
                 ["data", "synth", "cosmoflow", "--out", str(tmp_path / "d"), "--config", str(path)]):
        code, err = run_cli(*args)
        assert_one_line(code, err, str(path), fragment)
    assert not (tmp_path / "d").exists()


def test_folder_or_unreadable_config(tmp_path, monkeypatch):
    code, err = run_cli("run", str(tmp_path))
    assert_one_line(code, err, str(tmp_path), "is a folder, not a config file")
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow"))
    import mlhpc.config

    real = mlhpc.config._read_regular

    def denied(where):
        if Path(where) == path:
            raise PermissionError(13, "Permission denied", str(where))
        return real(where)

    monkeypatch.setattr(mlhpc.config, "_read_regular", denied)
    code, err = run_cli("submit", str(path), "--dry-run")
    assert_one_line(code, err, str(path), "cannot read config file (Permission denied)")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_mode_000_config(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow"))
    path.chmod(0)
    code, err = run_cli("submit", str(path), "--dry-run")
    assert_one_line(code, err, str(path), "Permission denied")


@pytest.mark.parametrize("override, fragment", [
    ("train.max\nepochs=3", "--set 'train.max\\nepochs': the key must be a dotted path"),
    ("train..seed=3", "--set train..seed"),
    (" =3", "--set"),
    ("train.seed=-1", "--set train.seed: input should be greater than or equal to 0"),
    ("train.seed=1.5", "--set train.seed: input should be a valid integer"),
    ("train.target=.inf", "--set train.target: input should be a finite number"),
    ("train.global_batch_size=true", "--set train.global_batch_size"),
    ("optimizer.decay_schedule={1: 1, 1: 2}", "--set optimizer.decay_schedule: value"),
])
def test_bad_override_blames_the_set(tmp_path, override, fragment):
    path = tmp_path / "c.yaml"
    path.write_text(BASE.format(workload="cosmoflow"))
    code, err = run_cli("submit", str(path), "--dry-run", "--set", override)
    assert_one_line(code, err, fragment)
    assert str(path) not in err


def test_real_cli_one_line_exit_2(tmp_path, mlhpc_cmd):
    """The way a user meets it: a real process, a bad file, stderr of one line, exit status 2."""
    path = tmp_path / "c.yaml"
    path.write_text("workload: cosmoflow\ntrain: {global_batch_size: 8, max_epochs: 3, target: .inf}\n")
    proc = subprocess.run([*mlhpc_cmd, "run", str(path)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert_one_line(proc.returncode, proc.stderr, "train.target: input should be a finite number")
    assert list(tmp_path.iterdir()) == [path]  # nothing written: no results, no data
