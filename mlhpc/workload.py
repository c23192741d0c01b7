"""The `Workload` spec: what a benchmark declares so that one harness can train it.

Follows the shape of torchtitan's ``TrainSpec`` (torchtitan/protocols/train_spec.py): the harness
(`mlhpc.run.train`) is model-agnostic and never branches on a workload's name; a workload is a frozen
record of constructors. Third parties add one through the ``mlhpc.workloads`` entry-point group;
the registry (`get`, `names`, `register`) lives here, beside the spec, so that nothing in ``mlhpc``
imports a workload package (the bundled ones are installed as ``mlhpc_workloads``).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal

from mlhpc.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import torch
    from pydantic import BaseModel
    from torch.utils.data import Dataset

    from mlhpc.runtime import Runtime

#: The resolved `mlhpc.config.Config`. Not imported, not even for typing: config.py reads this
#: registry to validate a workload's sections, so the two modules would import each other.
Config = Any


@dataclass(frozen=True)
class QualityMetric:
    """The quality metric of a benchmark and its target (MLPerf HPC rules, section "Quality").

    Attributes:
        key: the MLLOG key the value is logged under: ``"eval_error"`` or ``"eval_accuracy"``.
        target: the quality target of the reference (closed division).
        direction: ``"min"`` when smaller is better (reached at ``value <= target``), ``"max"``
            when larger is better (reached at ``value >= target``).
        batch_stats: ``(output, target) -> (sum, count)``, two 0-d float64 tensors whose sums over
            every batch of every rank give the metric as ``sum / count``. Summing before dividing
            is what makes the metric exact across ranks and uneven last batches.
    """

    key: str
    target: float
    direction: Literal["min", "max"]
    batch_stats: Callable[["torch.Tensor", "torch.Tensor"], tuple["torch.Tensor", "torch.Tensor"]]

    def reached(self, value: float, target: float | None = None) -> bool:
        """True when ``value`` meets ``target`` (default: the reference target)."""
        goal = self.target if target is None else target
        return value <= goal if self.direction == "min" else value >= goal


@dataclass(frozen=True)
class Workload:
    """A trainable MLPerf HPC benchmark, declared as data.

    Attributes:
        name: the MLPerf benchmark name, as logged in ``submission_benchmark``.
        model_config / optimizer_config / synth_config: pydantic models validating the config
            sections ``model``, ``optimizer`` and ``synth`` of this workload.
        build_model: ``model_config -> nn.Module`` (float32 weights, on the CPU).
        build_datasets: ``(config, runtime, data_dir) -> (train, validation)`` map-style datasets
            reading the official on-disk layout under ``data_dir``; raises ``DataError``. A
            dataset may also define ``collate_fn`` (whole batches from ``__getitems__``) and
            ``device_transform`` (decode a batch on the training device); see `mlhpc.data.loader`.
        synthesize: ``(out_dir, synth_config, seed) -> None`` writes embedded data in the official
            layout (``train/`` and ``validation/``).
        build_loss: ``config -> (output, target) -> scalar loss tensor``.
        metric: the quality metric and its target.
        build_optimizer: ``(model, config, steps_per_epoch) -> (optimizer, scheduler)``; the
            harness steps the scheduler once per optimizer step.
        hyperparameters: ``config -> {mllog key: value}``, every optimizer/model key the hpc
            compliance rules require for this benchmark (the harness logs the common ones).
        reference_samples: ``(train, eval)`` sample counts of the reference dataset, logged in the
            summary when a mini config departs from them.
        departures: ``config -> [str]``, every way ``config`` departs from the reference run
            (optimizer, target, sample counts, model size, ...), one short phrase each. When None,
            the harness lists the model fields that differ from the model config's defaults.
        data_tools: a `mlhpc.data.formats.DataTools` (list, check, convert and prepare the
            workload's files, one file at a time) for ``mlhpc data convert | prepare | check``;
            None when the workload offers none.
    """

    name: str
    model_config: type["BaseModel"]
    optimizer_config: type["BaseModel"]
    synth_config: type["BaseModel"]
    build_model: Callable[[Any], "torch.nn.Module"]
    build_datasets: Callable[["Config", "Runtime", Path], tuple["Dataset", "Dataset"]]
    synthesize: Callable[[Path, Any, int], None]
    build_loss: Callable[["Config"], Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]]
    metric: QualityMetric
    build_optimizer: Callable[["torch.nn.Module", "Config", int], tuple[Any, Any]]
    hyperparameters: Callable[["Config"], dict[str, Any]]
    reference_samples: tuple[int, int] = (0, 0)
    departures: Callable[["Config"], list[str]] | None = None
    data_tools: Any = None  # `mlhpc.data.formats.DataTools`: data convert / prepare / check


# ---- the registry -------------------------------------------------------------------------------

ENTRY_POINT_GROUP = "mlhpc.workloads"
_REGISTERED: dict[str, Workload] = {}


def register(workload: Workload, *, replace: bool = False) -> None:
    """Register ``workload`` in this process (benchmarks, tests, notebooks); entry points are the
    way for installed packages.

    Raises:
        ConfigError: a different workload already holds that name (pass ``replace=True`` to swap
            one registered here).
    """
    if workload.name in _entry_points():
        raise ConfigError(f"workload {workload.name!r}: already provided by an installed package")
    held = _REGISTERED.get(workload.name)
    if held is not None and held is not workload and not replace:
        raise ConfigError(f"workload {workload.name!r}: a different workload is already registered "
                          "under this name")
    _REGISTERED[workload.name] = workload


def _entry_points() -> dict[str, EntryPoint]:
    """Entry points of the ``mlhpc.workloads`` group by name.

    Raises:
        ConfigError: two installed entry points declare the same name.
    """
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        held = found.get(ep.name)
        if held is not None and held.value != ep.value:
            raise ConfigError(f"workload {ep.name!r}: declared twice in entry-point group "
                              f"{ENTRY_POINT_GROUP} ({held.value} and {ep.value}); uninstall one")
        found[ep.name] = ep
    return found


def names() -> list[str]:
    """Sorted names of every registered workload."""
    return sorted(set(_entry_points()) | set(_REGISTERED))


def get(name: str) -> Workload:
    """The workload registered as ``name``.

    Raises:
        ConfigError: no workload of that name is registered (the message lists the known ones),
            two are, or its entry point does not name a `Workload`.
    """
    found = _entry_points()
    if name in _REGISTERED:
        return _REGISTERED[name]
    if name not in found:
        from mlhpc.hints import closest

        known = ", ".join(names()) or "none"
        meant = closest(name, names())
        hint = f" (did you mean {meant!r}?)" if meant else ""
        raise ConfigError(f"workload: unknown workload {name!r}{hint}; known: {known}")
    workload = found[name].load()
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload {name!r}: entry point {found[name].value} is not a Workload")
    if workload.name != name:
        raise ConfigError(f"workload {name!r}: entry point {found[name].value} declares the name "
                          f"{workload.name!r}")
    return workload


def describe(config_dirs: tuple[Path, ...] = (Path("configs"),)) -> list[dict[str, Any]]:
    """One dict per registered workload, sorted by name: ``name``, ``formats`` (the forms its data
    tools read), ``convert_to``, ``splits``, ``metric`` (key), ``target``, ``direction`` and
    ``configs`` (the YAML files under ``config_dirs`` whose ``workload:`` names it).

    Raises:
        ConfigError: as `get` (a broken entry point).
    """
    import re

    configs: dict[str, list[str]] = {}
    for folder in config_dirs:
        for path in sorted(Path(folder).glob("*.yaml")) if Path(folder).is_dir() else []:
            try:
                head = path.read_text(encoding="utf-8", errors="replace")[:65536]
            except OSError:
                continue
            found = re.search(r"^workload:\s*([A-Za-z0-9_.-]+)\s*$", head, re.M)
            if found:
                configs.setdefault(found.group(1), []).append(str(path))
    rows = []
    for name in names():
        workload = get(name)
        tools = workload.data_tools
        rows.append({"name": name, "formats": list(getattr(tools, "formats", ()) or ()),
                     "convert_to": list(getattr(tools, "convert_to", ()) or ()),
                     "splits": list(getattr(tools, "splits", ("train", "validation"))),
                     "metric": workload.metric.key, "target": workload.metric.target,
                     "direction": workload.metric.direction, "configs": configs.get(name, [])})
    return rows


def describe_text(rows: list[dict[str, Any]], width: int = 80) -> str:
    """`describe`'s rows as lines for a terminal of ``width`` columns: per workload its name and
    quality target, then its data formats, splits and configs under it. Lines wrap between
    words only; a config path is one line of its own, never broken (a path longer than the
    width overflows it whole)."""
    import textwrap

    def wrapped(label: str, text: str) -> list[str]:
        return textwrap.wrap(text, max(width, 40), initial_indent=f"  {label:<13} ", subsequent_indent=" " * 16,
                             break_long_words=False, break_on_hyphens=False) or [f"  {label}"]

    lines = ["mlhpc workloads (entry-point group mlhpc.workloads)"]
    for r in rows:
        sign = "<=" if r["direction"] == "min" else ">="
        formats = ", ".join(r["formats"]) or "-"
        if r["convert_to"]:
            formats += f" (converts to {', '.join(r['convert_to'])})"
        lines += ["", f"{r['name']}  {r['metric']} {sign} {r['target']}", *wrapped("data formats", formats),
                  *wrapped("splits", ", ".join(r["splits"]))]
        configs = r["configs"] or ["-"]
        lines += [f"  {'configs':<13} {configs[0]}", *(" " * 16 + c for c in configs[1:])]
    return "\n".join(lines)
