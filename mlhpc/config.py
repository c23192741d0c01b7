"""Configuration: YAML file -> typed, validated `Config`.

Layering: the defaults declared here (and by the workload's own sections) <- the YAML file <-
``--set section.key=value`` overrides. Everything is validated before any staging or training
starts; a bad key or value raises `ConfigError` naming the file and the key path.

The common sections are declared here; ``model``, ``optimizer`` and ``synth`` are validated by the
pydantic models the workload declares (`mlhpc.workload.Workload`).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Literal, Optional, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, field_validator

from mlhpc.errors import ConfigError


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, values are checked strictly."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class SubmissionConfig(Section):
    """MLPerf submission metadata, logged as the ``submission_*`` keys."""

    org: str = Field("mlhpc", min_length=1)
    platform: str = Field("unknown", min_length=1)
    division: Literal["closed", "open"] = "open"
    status: Literal["onprem", "cloud", "research", "preview"] = "research"
    poc_name: str = ""
    poc_email: str = ""


class StagingConfig(Section):
    """Copy of the dataset to node-local storage before ``run_start`` (MLPerf HPC v3.0 rules)."""

    enabled: bool = True
    dest: Optional[Path] = None  # None: a fresh temporary folder on this node
    workers: int = Field(4, ge=1, le=256)  # copy threads per rank
    scope: Literal["all", "rank_files"] = "all"
    verify: bool = True


class DataConfig(Section):
    """Where the dataset lives and how much of it a run uses."""

    path: Path = Path("data")
    synthesize_if_missing: bool = True
    train_samples: Optional[int] = Field(None, ge=1)  # None: every sample found
    eval_samples: Optional[int] = Field(None, ge=1)
    num_workers: int = Field(0, ge=0, le=64)  # DataLoader worker processes per rank
    staging: StagingConfig = StagingConfig()


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


class TrainConfig(Section):
    """The training loop (`mlhpc.train`)."""

    global_batch_size: int = Field(..., ge=1)
    gradient_accumulation_steps: int = Field(1, ge=1)
    max_epochs: int = Field(..., ge=1)
    target: Optional[float] = None  # None: the workload's reference target
    seed: int = Field(0, ge=0)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    amp: bool = False  # bf16 autocast on CUDA
    # torch.compile the model (the first epoch pays the compilation): false, true (= "default"),
    # or a torch.compile mode; "reduce-overhead" replays the step with CUDA graphs on a GPU
    compile: Union[bool, str] = False
    threads: Optional[int] = Field(None, ge=1)  # torch intra-op threads; None: torch's default
    log_every_steps: int = Field(0, ge=0)  # progress lines; 0: once per epoch
    check_every_steps: int = Field(10, ge=1)  # how often ranks agree on stop (SIGTERM, NaN loss)
    checkpoint_every_epochs: int = Field(0, ge=0)  # 0: only on SIGTERM
    instances: int = Field(1, ge=1)  # throughput (weak scaling) mode: K independent models

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_setting(cls, value: Any) -> Union[bool, str]:
        if isinstance(value, bool) or value in COMPILE_MODES:
            return value
        raise ValueError(f"expected true, false or a torch.compile mode "
                         f"({', '.join(COMPILE_MODES)}); got {value!r}")


class OutputConfig(Section):
    """Where results go: ``<dir>/result_N.txt``, ``summary.json``, ``config.yaml``, ``env.json``."""

    dir: Path = Path("results")


class _CommonConfig(Section):
    workload: str
    submission: SubmissionConfig = SubmissionConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig
    output: OutputConfig = OutputConfig()


class Config(_CommonConfig):
    """A resolved run configuration. ``model``, ``optimizer`` and ``synth`` are instances of the
    workload's own section models."""

    model: Any = None
    optimizer: Any = None
    synth: Any = None
    source: str = "<defaults>"  # the file it was read from, for messages

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-able dict of the whole resolved config (paths as strings)."""
        return self.model_dump(mode="json", exclude={"source"})


def _show(text: Any) -> str:
    """``text`` as it can stand in a one-line message (repr when it holds control characters)."""
    text = str(text)
    return text if text.isprintable() else repr(text)


def _key_path(loc: tuple[Any, ...]) -> str:
    return _show(".".join(str(part) for part in loc if not str(part).startswith("function-")))


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required value missing"
    return _show(error["msg"][0].lower() + error["msg"][1:])


def _raise(source: str, exc: ValidationError, prefix: tuple[str, ...] = ()) -> None:
    first = exc.errors()[0]
    key = _key_path(prefix + tuple(first["loc"]))
    more = len(exc.errors()) - 1
    tail = f" (and {more} more)" if more else ""
    raise ConfigError(f"{source}: {key}: {_describe(first)}{tail}") from None


def _set_path(tree: dict[str, Any], dotted: str, value: Any, source: str) -> None:
    parts = dotted.split(".")
    if not all(parts):
        raise ConfigError(f"--set {_show(dotted)}: empty key path")
    node = tree
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"--set {_show(dotted)}: {part!r} is a value, not a section")
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``"train.max_epochs=5"`` -> ``("train.max_epochs", 5)``; the value is read as YAML.

    Raises:
        ConfigError: no ``=``, or a value that is not valid YAML.
    """
    if "=" not in text:
        raise ConfigError(f"--set {_show(text)}: expected section.key=value")
    key, raw = text.split("=", 1)
    try:
        value = yaml.safe_load(raw) if raw != "" else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {_show(key)}: value {raw!r} is not valid YAML "
                          f"({_show(getattr(exc, 'problem', None) or type(exc).__name__)})") from None
    return key.strip(), value


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a YAML file, read with ``yaml.safe_load``.

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a mapping.
    """
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror})") from None
    try:
        tree = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}: not valid YAML{where}") from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: top level must be a mapping of sections")
    return tree


def from_dict(tree: dict[str, Any], source: str = "<dict>", overrides: tuple[str, ...] = ()) -> Config:
    """Validate a raw config tree (plus ``--set`` overrides) into a `Config`.

    Raises:
        ConfigError: unknown key, wrong type, value out of range, missing value, unknown workload,
            or an override naming no key; the message names ``source`` and the key path.
    """
    from mlhpc.workload import get as get_workload  # registry; imported late to keep import cheap

    tree = copy.deepcopy(tree)
    override_keys: list[str] = []
    for text in overrides:
        key, value = parse_override(text)
        _set_path(tree, key, value, source)
        override_keys.append(key)
    if "workload" not in tree:
        raise ConfigError(f"{source}: workload: required value missing")
    if not isinstance(tree["workload"], str):
        raise ConfigError(f"{source}: workload: must be a workload name")
    try:
        workload = get_workload(tree["workload"])
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    schema = create_model(
        "Config",
        __base__=Config,
        model=(workload.model_config, workload.model_config()),
        optimizer=(workload.optimizer_config, workload.optimizer_config()),
        synth=(workload.synth_config, workload.synth_config()),
    )
    try:
        config = schema.model_validate({**tree, "source": source})
    except ValidationError as exc:
        first = exc.errors()[0]
        key = _key_path(tuple(first["loc"]))
        if first["type"] == "extra_forbidden" and any(key == k for k in override_keys):
            raise ConfigError(f"--set {key}: names no config key") from None  # key: _key_path
        _raise(source, exc)
    return config  # type: ignore[return-value]


def load(path: Path | str, overrides: tuple[str, ...] = ()) -> Config:
    """Read, layer and validate a config file. See `from_dict` for the errors raised."""
    return from_dict(read_yaml(Path(path)), source=str(path), overrides=overrides)


def save(config: Config, path: Path) -> None:
    """Write the resolved config as YAML (what the run actually used)."""
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
