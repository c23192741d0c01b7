"""The search space of ``mlhpc automl``: the config's ``automl.space`` checked against the knobs
the workload declares (`mlhpc.workload.Workload.search_knobs`, `mlhpc.knob.COMMON_KNOBS`), and
a trial's values drawn from it by Optuna (``trial.suggest_int`` / ``suggest_float`` /
``suggest_categorical``) as ``--set`` overrides of the base config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mlhpc.config import Config, from_dict
from mlhpc.config.automl import KnobRange
from mlhpc.errors import ConfigError
from mlhpc.hints import did_you_mean
from mlhpc.knob import COMMON_KNOBS, Knob
from mlhpc.workload import get as get_workload

if TYPE_CHECKING:  # pragma: no cover
    import optuna


def knobs_of(workload_name: str) -> dict[str, Knob]:
    """``{config key: Knob}``: the knobs a search over ``workload_name`` may vary (the harness's
    own, then the workload's)."""
    knobs = {k.key: k for k in COMMON_KNOBS}
    knobs.update({k.key: k for k in get_workload(workload_name).search_knobs})
    return knobs


def _yaml_value(value: Any) -> str:
    """``value`` as ``--set`` reads it (YAML): ``true``, ``0.001``, ``'name'``."""
    import json

    return json.dumps(value)


def endpoints(spec: KnobRange) -> list[tuple[str, Any]]:
    """``(name, value)`` of each value of ``spec`` that must be a valid setting on its own: both
    ends of a range, every choice."""
    if spec.choices is not None:
        return [(f"choices[{i}]", value) for i, value in enumerate(spec.choices)]
    return [("low", spec.low), ("high", spec.high)]


def check_space(config: Config) -> dict[str, KnobRange]:
    """The config's search space, each knob one the workload declares and each end of its range
    (each choice) a value the config accepts with the other settings as given.

    Raises:
        ConfigError: no ``automl`` section; a knob the workload does not declare (naming
            ``automl.space.KEY``, with the close one); a range whose end the config refuses
            (naming ``automl.space.KEY.low`` and why); a float step of an integer range.
    """
    if config.automl is None:
        raise ConfigError(f"{config.source}: automl: section missing; mlhpc automl needs a search "
                          "space and a time budget (docs/automl.md)")
    known = knobs_of(config.workload)
    tree = config.to_dict()
    tree.pop("automl", None)
    for key, spec in config.automl.space.items():
        if key not in known:
            hint = did_you_mean(key, list(known), prefix="automl.space.")
            raise ConfigError(f"{config.source}: automl.space.{key}: not a knob of workload "
                              f"{config.workload!r} (its knobs: {', '.join(known)}){hint}")
        if spec.choices is None and isinstance(spec.low, int) and isinstance(spec.high, int) \
                and spec.step is not None and not isinstance(spec.step, int):
            raise ConfigError(f"{config.source}: automl.space.{key}.step: an integer range takes "
                              f"an integer step, not {spec.step!r}")
        for which, value in endpoints(spec):
            try:
                from_dict(tree, source=config.source, overrides=(f"{key}={_yaml_value(value)}",))
            except ConfigError as exc:
                why = str(exc).split(": ", 2)[-1]
                raise ConfigError(f"{config.source}: automl.space.{key}.{which}: {value!r} is refused "
                                  f"({why})") from None
    return dict(config.automl.space)


def suggest(trial: "optuna.trial.BaseTrial", space: dict[str, KnobRange]) -> dict[str, Any]:
    """``{key: value}`` drawn for ``trial`` from ``space`` (Optuna's distributions: an integer
    range as ``suggest_int``, a float range as ``suggest_float``, choices as
    ``suggest_categorical``)."""
    values: dict[str, Any] = {}
    for key, spec in space.items():
        if spec.choices is not None:
            values[key] = trial.suggest_categorical(key, list(spec.choices))
        elif isinstance(spec.low, int) and isinstance(spec.high, int):
            values[key] = trial.suggest_int(key, spec.low, spec.high, step=int(spec.step or 1), log=spec.log)
        else:
            values[key] = trial.suggest_float(key, float(spec.low), float(spec.high),  # type: ignore[arg-type]
                                              step=None if spec.step is None else float(spec.step), log=spec.log)
    return values


def overrides_of(values: dict[str, Any]) -> tuple[str, ...]:
    """``values`` as ``--set KEY=VALUE`` texts."""
    return tuple(f"{key}={_yaml_value(value)}" for key, value in values.items())


def given_values(config: Config, space: dict[str, KnobRange]) -> dict[str, Any] | None:
    """The config's own values of the knobs in ``space`` (the seed trial, AIPerf's seed
    network), or None when one lies outside its range or choices."""
    tree, values = config.to_dict(), {}
    for key, spec in space.items():
        node: Any = tree
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        inside = (node in spec.choices) if spec.choices is not None else (
            isinstance(node, (int, float)) and spec.low <= node <= spec.high)  # type: ignore[operator]
        if not inside:
            return None
        values[key] = node
    return values
