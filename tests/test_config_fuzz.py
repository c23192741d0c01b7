"""Hypothesis fuzzing of the config loader: any YAML tree or override either loads or raises
ConfigError with a one-line message naming the file; nothing else escapes."""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc import config as cfg
from mlhpc.errors import ConfigError

SECTIONS = ["workload", "submission", "data", "train", "model", "optimizer", "synth", "output", "x"]
KEYS = ["global_batch_size", "max_epochs", "seed", "division", "path", "input_size", "dropout",
        "staging", "enabled", "workers", "cube_size", "base_learning_rate", "decay_schedule", "??"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(KEYS), inner, max_size=3)),
    max_leaves=8)
trees = st.dictionaries(st.sampled_from(SECTIONS), values, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, workload=st.sampled_from(["cosmoflow", "deepcam", "nope", 3]))
def test_any_tree_loads_or_names_the_problem(tmp_path_factory, tree, workload):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_text(yaml.safe_dump({**tree, "workload": workload}))
    try:
        config = cfg.load(path)
    except ConfigError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith(str(path))
    else:  # what loads holds no NaN/Infinity and no bool where a number is due: JSON-clean
        json.dumps(config.to_dict(), allow_nan=False)


@settings(max_examples=150, deadline=None)
@given(override=st.text(max_size=40))
def test_any_override_loads_or_names_it(repo, override):
    try:
        cfg.load(repo / "configs" / "cosmoflow-mini.yaml", (override,))
    except ConfigError as exc:
        assert "\n" not in str(exc) and ("--set" in str(exc) or "cosmoflow-mini.yaml" in str(exc))


@settings(max_examples=100, deadline=None)
@given(text=st.text(max_size=200))
def test_any_file_text_loads_or_names_the_file(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_text(text)
    try:
        cfg.load(path)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)


numbers = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.integers(-2**70, 2**70), st.sampled_from([".inf", "-.inf", ".nan", "1e23"]))
NUMERIC_KEYS = {
    "train": ["global_batch_size", "max_epochs", "target", "seed", "threads", "instances",
              "gradient_accumulation_steps", "log_every_steps"],
    "optimizer": ["base_learning_rate", "momentum", "beta_2", "weight_decay", "warmup_epochs",
                  "base_batch_size"],
    "synth": ["cube_size", "train_samples", "box_size_mpc_h", "mean_particles_per_cell", "omega_b"],
    "model": ["dropout", "negative_slope", "conv_channels"],
    "data": ["train_samples", "num_workers"],
}


@settings(max_examples=200, deadline=None)
@given(section=st.sampled_from(sorted(NUMERIC_KEYS)), data=st.data(), value=numbers)
def test_numeric_fields_are_finite_and_in_int64(tmp_path_factory, section, data, value):
    key = data.draw(st.sampled_from(NUMERIC_KEYS[section]))
    tree = {"workload": "cosmoflow", "train": {"global_batch_size": 8, "max_epochs": 3}}
    tree.setdefault(section, {})[key] = value
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    text = yaml.safe_dump(tree)
    if isinstance(value, str):  # a YAML literal, not a string
        text = text.replace(f"'{value}'", value)
    path.write_text(text)
    try:
        config = cfg.load(path)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(f"{path}: {section}.{key}")
        return
    json.dumps(config.to_dict(), allow_nan=False)
    loaded = getattr(getattr(config, section), key)
    assert not isinstance(loaded, bool) or isinstance(value, bool)
    if isinstance(loaded, int) and not isinstance(loaded, bool):
        assert -2**63 <= loaded < 2**63 and not isinstance(value, (bool, float, str))


@settings(max_examples=100, deadline=None)
@given(content=st.binary(max_size=300))
def test_any_bytes_load_or_name_the_file(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("fuzz") / "c.yaml"
    path.write_bytes(content)
    try:
        cfg.load(path)
    except ConfigError as exc:
        assert "\n" not in str(exc) and str(exc).startswith(str(path))
