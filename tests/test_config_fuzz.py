"""Hypothesis fuzzing of the config loader: any YAML tree or override either loads or raises
ConfigError with a one-line message naming the file; nothing else escapes."""

from __future__ import annotations

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
        cfg.load(path)
    except ConfigError as exc:
        text = str(exc)
        assert "\n" not in text and text.startswith(str(path))


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
