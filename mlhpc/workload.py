"""The `Workload` spec, the contract between the harness and a benchmark: everything a workload
declares and everything the harness calls on a workload's objects, with its types.

A workload imports from here: `Workload` (its constructors and settings), `QualityMetric`,
`WorkloadDataset` (every hook the harness calls on a dataset), `SynthProgress` (what its
synthesis tells), `DataTools` and `FileCheck` (its formats, for ``mlhpc data`` and staging, with
its ``mlhpc data prepare`` options). The harness calls nothing a workload did not declare here.

Follows the shape of torchtitan's ``TrainSpec`` (torchtitan/protocols/train_spec.py): the harness
(`mlhpc.run.train`) is model-agnostic and never branches on a workload's name; a workload is a frozen
record of constructors. Third parties add one through the ``mlhpc.workloads`` entry-point group;
the registry (`get`, `names`, `register`) lives here, beside the spec, so that nothing in ``mlhpc``
imports a workload package (the bundled ones are installed as ``mlhpc_workloads``).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict

from mlhpc.errors import ConfigError, DataError
from mlhpc.knob import Knob

if TYPE_CHECKING:  # pragma: no cover - typing only (config reads this registry at run time)
    import torch

    from mlhpc.config import Config
    from mlhpc.runtime import Runtime


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


# ---- the dataset protocol -----------------------------------------------------------------------


class SampleLocation(NamedTuple):
    """Where sample ``index`` of a dataset is stored: its file and its index within that file
    (0 for a file that holds one sample)."""

    file: Path
    index: int


class WorkloadDataset:
    """The map-style dataset a workload's ``build_datasets`` returns: every hook the harness
    calls on it, with the default a dataset that does not override it gets. The harness calls
    these and nothing else (`mlhpc.data.loader`, `mlhpc.run`); a DataLoader takes it as it takes a
    torch ``Dataset``.

    Attributes:
        memory_mapped: the training data are read through memory maps (reported in the run's
            ``measured_N.json``); default False.

    A dataset overrides, where its data need it:
        ``__len__`` / ``__getitem__``: required; ``__getitem__(i) -> (x, y)``.
        ``__getitems__``: a batch's samples, as a DataLoader fetches them (default: the list of
            their ``__getitem__`` items, as torch fetches a dataset without it); a dataset that
            fills whole batches overrides it (one copy per sample) and `collate_fn` with it.
        `collate_fn`: the DataLoader's collate function (default torch's ``default_collate``).
        `device_transform`: decodes a batch input on the training device (default: none).
        `batch_len`: samples in a batch input (default ``len(x)``).
        `locate`: the file and the index within it of a sample, named in errors (default None).
    """

    memory_mapped: bool = False

    def __len__(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} does not define __len__")

    def __getitem__(self, index: int) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not define __getitem__")

    def __getitems__(self, indices: list[int]) -> Any:
        return [self[index] for index in indices]

    def collate_fn(self, samples: Any) -> Any:
        """A batch ``(x, y)`` from what the DataLoader fetched: a list of ``__getitem__`` items,
        or what the dataset's own ``__getitems__`` returned."""
        from torch.utils.data import default_collate

        return default_collate(samples)

    def device_transform(self, x: Any) -> Any:
        """A batch input ``x`` decoded on the device it has just been moved to."""
        return x

    def batch_len(self, x: Any) -> int:
        """Samples in a batch input ``x`` (a graph batch counts structures, not atoms)."""
        return len(x)

    def locate(self, index: int) -> SampleLocation | None:
        """Where sample ``index`` is stored, or None when the dataset cannot say."""
        return None

    @property
    def decodes_on_device(self) -> bool:
        """The dataset decodes its batches on the device (it overrides `device_transform`)."""
        return type(self).device_transform is not WorkloadDataset.device_transform


# ---- embedded data ------------------------------------------------------------------------------


class SynthProgress:
    """What a workload's ``synthesize`` tells the harness as it writes, and which files are its
    to write (also the silent listener, and the whole share, a direct call gets): `plan` once,
    then `done` as samples are written; unreported, the bytes it writes are watched. Under a
    launcher every rank calls ``synthesize`` into one folder (``mlhpc data synth``): it writes the
    files of `share` of its whole plan, and what depends on every file from `gather`."""

    #: Synthesis processes the workload may start on this rank (0: its own choice).
    workers: int = 0

    def plan(self, samples: int, size_bytes: int | None = None) -> None:
        """``samples`` are about to be written, about ``size_bytes`` in all (None: unknown)."""

    def done(self, samples: int = 1) -> None:
        """``samples`` more have been written."""

    def share(self, tasks: list[Any]) -> list[Any]:
        """This rank's part of ``tasks``, the same list on every rank (disjoint parts)."""
        return list(tasks)

    def gather(self, part: list[Any]) -> list[Any] | None:
        """Every rank's ``part`` in rank order on the rank that finishes the data set, None on
        the others; a collective, called once by every rank after its share."""
        return list(part)


#: The listener of a ``synthesize`` called outside the harness.
NO_PROGRESS = SynthProgress()


# ---- data tools ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileCheck:
    """What `DataTools.check_file` found in one file: sample count, one sample's shape and
    dtype (as stored), and the file's size in bytes."""

    samples: int
    sample_shape: tuple[int, ...]
    dtype: str
    bytes: int


class NoPrepareOptions(BaseModel):
    """The options of a workload whose data need no preparation step."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class DataTools:
    """A workload's data tools (``Workload.data_tools``): recognise, list, check, convert and
    prepare its files one file at a time, for ``mlhpc data check | convert | prepare`` and for
    staging. A workload subclasses this and overrides what its formats need; every method raises
    DataError naming the file (and record or sample) on bad input. `convert_file` and
    `prepare_file` write their outputs through `mlhpc.data.files.atomic_output` and return
    ``(path, samples)`` for each.

    Attributes:
        formats: the forms its reader accepts (``data.format`` values besides ``auto``).
        convert_to: the forms `convert_file` writes.
        root_files: names of files at the dataset root copied unchanged (a statistics file).
        splits: the split folder names it writes.
        prepare_options: the pydantic model of the options of ``mlhpc data prepare`` for this
            workload (``--option KEY=VALUE``), each field with its default and description.
    """

    formats: tuple[str, ...] = ()
    convert_to: tuple[str, ...] = ()
    root_files: tuple[str, ...] = ()
    splits: tuple[str, ...] = ("train", "validation")
    prepare_options: type[BaseModel] = NoPrepareOptions

    def find_splits(self, root: Path) -> tuple[str, ...]:
        """The split folder names of the dataset at ``root`` (a dataset that names its folders
        its own way answers here); default `splits`."""
        return self.splits

    def file_group(self, path: str) -> str:
        """The group of a data file (``path``: POSIX, within its split folder): files of one
        group are read together by one sample (a chain's structure and its alignments) and so
        stay on one node when staging shards the splits (`mlhpc.data.partition`); default:
        every file alone."""
        return path

    def detect(self, split_dir: Path) -> str:
        """The form of the files in ``split_dir``."""
        raise DataError(f"{split_dir}: this workload's data tools recognise no files")

    def list_files(self, split_dir: Path, fmt: str) -> list[Path]:
        """The data files of form ``fmt`` in ``split_dir``, in reading order."""
        raise DataError(f"{split_dir}: this workload's data tools list no files")

    def check_file(self, path: Path, fmt: str, full: bool) -> FileCheck:
        """One file checked: quick (framing, counts) or ``full`` (every sample decoded)."""
        raise DataError(f"{path}: this workload's data tools check no files")

    def convert_file(self, path: Path, fmt: str, out_dir: Path, to: str) -> list[tuple[Path, int]]:
        """One file rewritten in form ``to`` under ``out_dir``."""
        raise DataError(f"{path}: this workload's data tools convert no files")

    def finish_split(self, out_dir: Path, to: str) -> list[Path]:
        """What a split needs once all its files are written (file lists); their paths."""
        return []

    def list_raw(self, raw_dir: Path) -> list[Path]:
        """The raw files ``mlhpc data prepare`` makes samples of."""
        raise DataError(f"{raw_dir}: this workload has no preparation step")

    def prepare_splits(self, raw: list[Path], options: Any) -> list[tuple[str, Path]]:
        """``(split, raw file)`` for every raw file: which split its samples go to."""
        raise DataError("this workload has no preparation step")

    def prepare_file(self, path: Path, out_dir: Path, to: str, options: Any
                     ) -> list[tuple[Path, int]]:
        """One raw file made into samples of form ``to`` under ``out_dir``; ``options`` is a
        `prepare_options` instance."""
        raise DataError(f"{path}: this workload has no preparation step")


def last_files_to_validation(raw: list[Path], fraction: float, splits: tuple[str, ...]
                             ) -> list[tuple[str, Path]]:
    """Whole raw files to splits: the last ``ceil(n * fraction)`` in the given order (at least
    one when there are two files or more and ``fraction`` > 0, never all) to ``splits[1]``, the
    rest to ``splits[0]``; what the reference's preparation does with whole universes.

    Raises:
        DataError: ``fraction`` outside [0, 1).
    """
    if not 0 <= fraction < 1:
        raise DataError(f"validation share {fraction}: expected 0 <= f < 1")
    n_valid = math.ceil(len(raw) * fraction) if len(raw) > 1 else 0
    n_valid = min(max(n_valid, 1 if len(raw) > 1 and fraction > 0 else 0), max(len(raw) - 1, 0))
    return [(splits[1] if i >= len(raw) - n_valid else splits[0], path) for i, path in enumerate(raw)]


def every_model_setting(model: BaseModel) -> dict[str, Any]:
    """The default `Workload.model_settings`: every field of the model section."""
    return model.model_dump(mode="json")


# ---- the workload -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """A trainable MLPerf HPC benchmark, declared as data.

    Attributes:
        name: the MLPerf benchmark name, as logged in ``submission_benchmark``.
        model_config / optimizer_config / synth_config: pydantic models validating the config
            sections ``model``, ``optimizer`` and ``synth`` of this workload.
        build_model: ``model_config -> nn.Module`` (float32 weights, on the CPU).
        build_datasets: ``(config, runtime, data_dir) -> (train, validation)``, two
            `WorkloadDataset` reading the official on-disk layout under ``data_dir``; raises
            ``DataError``.
        synthesize: ``(out_dir, synth_config, seed, progress) -> None`` writes embedded data in
            the official layout (its split folders), telling ``progress`` (`SynthProgress`).
        synth_count_keys: the ``synth`` section's sample counts, which ``--fraction`` scales.
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
            the harness lists the model settings that differ from the model config's defaults.
        model_settings: ``model section -> {name: value}``, the settings a report shows of the
            model (those that decide the input it takes and its memory layout); default every
            field (`every_model_setting`).
        reference_train_flops_per_sample: ``(FLOPs, what a sample is)``: training (forward +
            backward) FLOPs per sample of the reference model at the reference size, as mlhpc
            counts them (`mlhpc.run.step.count_flops_on_meta`), for figures of published logs,
            which hold no FLOPs (HPC AI500's Valid FLOPS); None where the work depends on each
            sample (a graph, a protein's crop and alignments).
        evaluate_at_start: the run evaluates the model it starts from once, after run_start and
            before the first step, logged at ``epoch_num`` 0, as the reference does when it
            continues a partly trained checkpoint (OpenFold: mlcommons/hpc ``openfold/train.py``;
            the published v3.0 logs hold that evaluation, e.g. 0.6985 on NVIDIA Eos).
        data_tools: its `DataTools` for ``mlhpc data convert | prepare | check`` and staging
            conversions; None when the workload offers none.
        search_knobs: the knobs (`Knob`) of the model family an AutoML search may vary (``mlhpc automl``),
            besides the harness's own (`mlhpc.knob.COMMON_KNOBS`).
    """

    name: str
    model_config: type[BaseModel]
    optimizer_config: type[BaseModel]
    synth_config: type[BaseModel]
    build_model: Callable[[Any], "torch.nn.Module"]
    build_datasets: Callable[["Config", "Runtime", Path], tuple[WorkloadDataset, WorkloadDataset]]
    synthesize: Callable[[Path, Any, int, SynthProgress], None]
    build_loss: Callable[["Config"], Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]]
    metric: QualityMetric
    build_optimizer: Callable[["torch.nn.Module", "Config", int], tuple[Any, Any]]
    hyperparameters: Callable[["Config"], dict[str, Any]]
    reference_samples: tuple[int, int] = (0, 0)
    departures: Callable[["Config"], list[str]] | None = None
    model_settings: Callable[[Any], dict[str, Any]] = every_model_setting
    data_tools: DataTools | None = None
    evaluate_at_start: bool = False
    reference_train_flops_per_sample: tuple[float, str] | None = None
    search_knobs: tuple[Knob, ...] = ()
    synth_count_keys: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.data_tools is not None and not isinstance(self.data_tools, DataTools):
            raise ConfigError(f"workload {self.name!r}: data_tools is a "
                              f"{type(self.data_tools).__name__}, not a mlhpc.workload.DataTools")

    def sections(self) -> dict[str, type[BaseModel]]:
        """The config sections this workload validates: ``model``, ``optimizer``, ``synth``."""
        return {"model": self.model_config, "optimizer": self.optimizer_config,
                "synth": self.synth_config}

    def tools(self) -> DataTools:
        """Its data tools. Raises DataError when it declares none."""
        if self.data_tools is None:
            raise DataError(f"workload {self.name!r} declares no data tools (Workload.data_tools); "
                            f"mlhpc data convert/prepare/check cannot read its files")
        return self.data_tools

    def datasets(self, config: "Config", runtime: "Runtime", data_dir: Path
                 ) -> tuple[WorkloadDataset, WorkloadDataset]:
        """``build_datasets``, each checked to be a `WorkloadDataset`.

        Raises:
            DataError: as ``build_datasets``.
            ConfigError: it returned something else.
        """
        found = self.build_datasets(config, runtime, data_dir)
        for dataset in found:
            if not isinstance(dataset, WorkloadDataset):
                raise ConfigError(f"workload {self.name!r}: build_datasets returned a "
                                  f"{type(dataset).__name__}, not a mlhpc.workload.WorkloadDataset")
        return found[0], found[1]


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


#: The entry points found for each ``sys.path``: reading every installed distribution's metadata
#: takes milliseconds, and a report asks once per log (half its time over a published round).
_FOUND: dict[tuple[str, ...], dict[str, EntryPoint]] = {}
#: What each entry point loaded (a report asks once per log).
_LOADED: dict[EntryPoint, Any] = {}


def _entry_points() -> dict[str, EntryPoint]:
    """Entry points of the ``mlhpc.workloads`` group by name, read once per ``sys.path``.

    Raises:
        ConfigError: two installed entry points declare the same name.
    """
    key = tuple(sys.path)
    if key not in _FOUND:
        _FOUND[key] = _read_entry_points()
    return dict(_FOUND[key])


def _read_entry_points() -> dict[str, EntryPoint]:
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
    if found[name] not in _LOADED:
        _LOADED[found[name]] = found[name].load()
    workload = _LOADED[found[name]]
    if not isinstance(workload, Workload):
        raise ConfigError(f"workload {name!r}: entry point {found[name].value} is not a Workload")
    if workload.name != name:
        raise ConfigError(f"workload {name!r}: entry point {found[name].value} declares the name "
                          f"{workload.name!r}")
    return workload


def source_files(name: str) -> list[tuple[Path, Path]]:
    """``(file, path within a package)`` for every Python file of workload ``name``'s source,
    found through its entry point: the module it names (a package: every file under its
    folder) and, when that lies in a package, the package's own top-level files (its
    ``__init__.py`` and the modules its workloads share). Paths within a package keep the
    import names (``top/sub/file.py``), so the source can be imported as it was installed.

    Raises:
        ConfigError: no installed entry point provides ``name`` (a workload registered in a
            process has no installed source), or its module cannot be found.
    """
    import importlib.util

    found = _entry_points()
    if name not in found:
        raise ConfigError(f"workload {name!r}: no installed package provides it (entry-point group "
                          f"{ENTRY_POINT_GROUP}); its source cannot be found")
    module = found[name].module
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ConfigError(f"workload {name!r}: module {module} of its entry point is not found")
    origin = Path(spec.origin)
    parts = module.split(".")
    if spec.submodule_search_locations:  # a package: its folder, at its import path
        folder, base = origin.parent, Path(*parts)
        files = [(p, base / p.relative_to(folder)) for p in sorted(folder.rglob("*.py"))
                 if "__pycache__" not in p.parts]
        above = folder.parent
    else:
        files, above = [(origin, Path(*parts[:-1], origin.name))], origin.parent
    for depth in range(len(parts) - 1, 0, -1):  # the packages above it: their own files
        files += [(p, Path(*parts[:depth], p.name)) for p in sorted(above.glob("*.py"))]
        above = above.parent
    return files


def prepare_options(tools: DataTools) -> list[dict[str, Any]]:
    """``{"name", "default", "description"}`` for each option of ``mlhpc data prepare`` the
    tools declare (`DataTools.prepare_options`)."""
    return [{"name": key, "default": field.default, "description": field.description or ""}
            for key, field in tools.prepare_options.model_fields.items()]
