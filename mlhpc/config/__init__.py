"""Configuration: YAML file -> typed, validated `Config`.

Layering: the defaults declared here (and by the workload's own sections) <- the YAML file <-
``--set section.key=value`` overrides. Everything is validated before any staging or training
starts; a bad key or value raises `ConfigError` naming the file and the key path.

The common sections are declared here; ``model``, ``optimizer`` and ``synth`` are validated by the
pydantic models the workload declares (`mlhpc.workload.Workload`).
"""

from __future__ import annotations

import copy
import os
import re
import typing
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    SerializeAsAny,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from mlhpc.config.yamlfile import UniqueKeyLoader, parse_override, set_path
from mlhpc.config.yamlfile import show as _show
from mlhpc.errors import ConfigError
from mlhpc.hints import did_you_mean, existing_file, section_model
from mlhpc.config import emulation
from mlhpc.config.automl import AutomlConfig
from mlhpc.config.power import PowerConfig
from mlhpc.workload import get as get_workload

#: Every integer a config holds fits a signed 64-bit integer (torch's int64, a C ``long long``).
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: The largest ``train.seed``: torch.manual_seed takes -2**63 .. 2**64 - 1, and the loop adds the
#: instance and epoch numbers to the seed, so a seed up to 2**63 - 1 stays below torch's limit.
SEED_MAX = INT64_MAX



def _int_from_json_key(value: Any) -> Any:
    return int(value) if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value) else value


# Shared numeric types for workload sections (floats are finite in every section anyway).
#: An epoch number >= 0, also as a mapping key: JSON (a saved config, a checkpoint) writes
#: mapping keys as strings, so a string of digits is read as its integer; ``true`` or ``1.5`` are not.
Epoch = Annotated[int, BeforeValidator(_int_from_json_key), Field(ge=0)]
#: A multiplicative learning-rate decay factor: 0 < factor <= 1.
DecayFactor = Annotated[float, Field(gt=0.0, le=1.0)]


def _is_tuple_type(annotation: Any) -> bool:
    if typing.get_origin(annotation) is tuple:
        return True
    return typing.get_origin(annotation) is Union and any(
        _is_tuple_type(arg) for arg in typing.get_args(annotation))


def _out_of_int64(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return not INT64_MIN <= value <= INT64_MAX
    if isinstance(value, dict):
        return any(_out_of_int64(k) or _out_of_int64(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_out_of_int64(v) for v in value)
    return False


class Section(BaseModel):
    """Base of every config section (the harness's and each workload's): unknown keys are errors
    and values are checked strictly, in one place for every section:

    - integers are integers: ``true`` is not 1 and ``1e23`` (a YAML float) is not an integer;
    - floats are finite: ``.inf`` and ``.nan`` are rejected (``allow_inf_nan=False``), also inside
      lists, tuples and mappings, so no NaN or Infinity can reach a log or a learning rate;
    - every integer fits a signed 64-bit integer (what torch takes);
    - a YAML sequence stands for a tuple (YAML has no tuples) and a string for a path.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True,
                              allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _yaml_sequences_are_tuples(cls, data: Any) -> Any:
        if isinstance(data, dict):
            lists = {name: tuple(data[name]) for name, field in cls.model_fields.items()
                     if isinstance(data.get(name), list) and _is_tuple_type(field.annotation)}
            if lists:
                data = {**data, **lists}
        return data

    @field_validator("*", mode="after")
    @classmethod
    def _int64(cls, value: Any, info: ValidationInfo) -> Any:
        if _out_of_int64(value):
            raise ValueError(f"integers must lie within {INT64_MIN} .. {INT64_MAX}")
        if isinstance(value, (str, Path)) and any(ord(c) < 32 or ord(c) == 127 for c in str(value)):
            raise ValueError("holds a control character (a newline, tab or escape); a name or path "
                             "may not (a folder whose name ends in a newline is no one's to find)")
        return value


class SubmissionConfig(Section):
    """MLPerf submission metadata, logged as the ``submission_*`` keys."""

    org: str = Field("mlhpc", min_length=1, description=(
        "submitting organisation, logged as submission_org"))
    platform: str = Field("unknown", min_length=1, description=(
        "system the run is on (e.g. 4xA100), logged as submission_platform"))
    division: Literal["closed", "open"] = Field("open", description=(
        "MLPerf division, logged as submission_division: closed (reference model and "
        "hyperparameter rules) or open"))
    status: Literal["onprem", "cloud", "research", "preview"] = Field("research", description=(
        "MLPerf system status, logged as submission_status"))
    poc_name: str = Field("", description=(
        "point of contact's name, logged as submission_poc_name when given"))
    poc_email: str = Field("", description=(
        "point of contact's e-mail, logged as submission_poc_email when given"))


class StagingConfig(Section):
    """Copy of the dataset to node-local storage (`mlhpc.data.stage`; docs/staging-at-scale.md).

    ``dest`` may hold ``{node_rank}`` and ``{hostname}``; ``shard``: ``node`` (each node stages
    and reads its own share of train/ and validation/; the default when the job spans several
    nodes) or ``none`` (every node holds everything); ``placement``: ``init`` (before
    ``run_start``, as v3.0 allows within the init limit) or ``run`` (inside the timed run,
    always compliant); ``to``: ``none`` (copy the files as they are) or a form the workload's
    ``data convert`` writes (e.g. ``npy``, ``hdf5``): each source file is converted into the
    destination on its way there, as NVIDIA's staging inflates GZIP TFRecords on the way to the
    node (checked against the workload's forms when staging starts).
    """

    enabled: bool = Field(True, description=(
        "copy the dataset to node-local storage before reading it (false: read data.path in "
        "place)"))
    dest: Optional[Path] = Field(None, strict=False, description=(
        "node-local folder to stage into; may hold {node_rank} and {hostname}; null: "
        "$TMPDIR (else /tmp)/mlhpc-<user>-<job id>-<hash of data.path>, one per dataset and job "
        "(mlhpc stage --list shows each copy and its size)"))
    keep: bool = Field(False, description=(
        "keep the staged copy when the run ends (a later run on the node reuses it, verified); "
        "false: a run removes the copy it made, and leaves one that was in place before it"))
    workers: int = Field(4, ge=1, le=256, description="copy threads per rank")
    shard: Optional[Literal["node", "none"]] = Field(None, description=(
        "node: each node stages and reads its own share of the samples; none: every node holds"
        " everything; null: node when the job spans several nodes"))
    placement: Literal["init", "run"] = Field("init", description=(
        "init: stage before run_start (MLPerf HPC v3.0, within the initialisation limit); run:"
        " stage inside the timed run (always compliant)"))
    verify: bool = Field(True, description=(
        "read each staged file back and check its checksum against the source's"))
    to: str = Field("none", pattern=r"^[a-z][a-z0-9_-]*$", description=(
        "none: copy the files as they are; else a form the workload's data convert writes "
        "(`mlhpc list` shows them), converted on the way to the node"))
    follow_links: bool = Field(False, description=(
        "read a symbolic link to a file inside the source as that file (links out of the "
        "source, and links to folders, are refused either way); false: every link is refused"))

    @field_validator("dest")
    @classmethod
    def _dest_placeholders(cls, value: Optional[Path]) -> Optional[Path]:
        import string

        if value is not None:
            try:
                names = {name for _, name, _, _ in string.Formatter().parse(str(value)) if name is not None}
            except ValueError as exc:
                raise ValueError(f"bad placeholder in {str(value)!r} ({exc})") from None
            unknown = names - {"node_rank", "hostname"}
            if unknown:
                raise ValueError(f"unknown placeholder {{{sorted(unknown)[0]}}} in {str(value)!r}; "
                                 "use {node_rank} or {hostname}")
        return value


class DataConfig(Section):
    """Where the dataset lives and how much of it a run uses."""

    path: Path = Field(Path("data"), strict=False, description=(
        "dataset folder (train/ and validation/ inside), relative to the folder mlhpc runs in"))
    synthesize_if_missing: bool = Field(True, description=(
        "synthesise the workload's embedded dataset into data.path when it is missing or "
        "unfinished (made once, reused by later runs)"))
    train_samples: Optional[int] = Field(None, ge=1, description=(
        "training samples a run uses; null: every sample found"))
    eval_samples: Optional[int] = Field(None, ge=1, description=(
        "validation samples a run uses; null: every sample found"))
    format: str = Field("auto", pattern=r"^[a-z][a-z0-9_-]*$", description=(
        "on-disk form of the samples (one the workload reads, see mlhpc list); auto: detected "
        "from the file names"))
    synth_seed: int = Field(0, ge=0, le=SEED_MAX, description=(
        "seed of the embedded (synthesised) dataset; the data stay the same across runs whose "
        "train.seed differs, as a real dataset does"))
    num_workers: int = Field(0, ge=0, le=64, description=(
        "DataLoader worker processes per rank (0: read in the training process)"))
    staging: StagingConfig = StagingConfig()


COMPILE_MODES = ("default", "reduce-overhead", "max-autotune")


class TrainConfig(Section):
    """The training loop (`mlhpc.run.train`)."""

    global_batch_size: int = Field(..., ge=1, le=2**31 - 1, description=(
        "samples per optimizer step over all ranks (local batch = global / (ranks x "
        "gradient_accumulation_steps))"))
    gradient_accumulation_steps: int = Field(1, ge=1, le=2**31 - 1, description=(
        "micro-batches accumulated per optimizer step"))
    max_epochs: int = Field(..., ge=1, le=1_000_000, description=(
        "epochs after which a run that has not reached its target stops (status aborted, exit "
        "1)"))
    target: Optional[float] = Field(None, description=(
        "quality target the run trains to (the workload's metric); null: the workload's "
        "reference target"))
    seed: int = Field(0, ge=0, le=SEED_MAX, description=(
        "seed of model initialisation and shuffling (throughput instances add their instance "
        "number)"))
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=(
        "auto: CUDA when visible, else CPU; cpu; cuda (an error when no GPU is visible)"))
    amp: bool = Field(False, description="bf16 autocast on CUDA (ignored on CPU)")
    compile: Union[bool, str] = Field(False, description=(
        "torch.compile the model (the first epoch pays the compilation): false, true (= "
        "default), or a torch.compile mode; reduce-overhead replays the step with CUDA graphs "
        "on a GPU"))
    threads: Optional[int] = Field(None, ge=1, le=65536, description=(
        "torch intra-op threads per rank; null: torch's default"))
    log_every_steps: int = Field(0, ge=0, description=(
        "print a step N/M line with the loss every this many steps, on a terminal and in a log"
        " file; 0: one line per epoch only"))
    eval_every_steps: Optional[int] = Field(None, ge=1, le=2**31 - 1, description=(
        "an epoch of the run is this many optimizer steps, each followed by an evaluation, "
        "reading on through the passes over the data; null: an epoch is one pass over the "
        "training data"))
    check_every_steps: int = Field(10, ge=1, description=(
        "how often (in steps) the ranks agree on stopping (SIGTERM, SIGINT, non-finite loss)"))
    checkpoint_every_epochs: int = Field(0, ge=0, description=(
        "save a checkpoint every this many epochs; 0: only when a signal stops the run"))
    instances: int = Field(1, ge=1, le=65536, description=(
        "throughput (weak scaling) mode: K independent models trained at once, each on its "
        "share of the ranks, with its own seed and log"))
    emulate_accelerator: Annotated[Optional[str], AfterValidator(emulation.checked)] = Field(None, description=(
        "storage mode (mlhpc run --emulate-accelerator): each training step is a sleep as long as "
        "this accelerator's published time per sample (a name, mlhpc/run/accelerators.json) or "
        "this time per sample (12.5ms, 0.02s, 800us) x the local batch; null: train"))

    @field_validator("compile", mode="before")
    @classmethod
    def _compile_setting(cls, value: Any) -> Union[bool, str]:
        if isinstance(value, bool) or value in COMPILE_MODES:
            return value
        raise ValueError(f"expected true, false or a torch.compile mode "
                         f"({', '.join(COMPILE_MODES)}); got {value!r}")


class OutputConfig(Section):
    """Where results go: run N writes ``<dir>/result_N.txt`` (the MLLOG) and its side files
    ``measured_N.json``, ``summary_N.json``, ``config_N.yaml``, ``env_N.json`` (`mlhpc.run.result`)."""

    dir: Path = Field(Path("results"), strict=False, description=(
        "results folder: run N writes result_N.txt and its side files there, never over an "
        "earlier run's"))


class _CommonConfig(Section):
    workload: str
    submission: SubmissionConfig = SubmissionConfig()
    data: DataConfig = DataConfig()
    train: TrainConfig
    output: OutputConfig = OutputConfig()
    power: PowerConfig = PowerConfig()
    automl: Optional[AutomlConfig] = None  # read by mlhpc automl only


#: A workload's own section (``model``, ``optimizer``, ``synth``): an instance of the model the
#: workload declares (`mlhpc.workload.Workload`), written out as that model, not as the base.
WorkloadSection = SerializeAsAny[BaseModel | None]


class Config(_CommonConfig):
    """A resolved run configuration. ``model``, ``optimizer`` and ``synth`` are instances of the
    workload's own section models; `from_dict` validates them with those models."""

    model: WorkloadSection = None
    optimizer: WorkloadSection = None
    synth: WorkloadSection = None
    source: str = "<defaults>"  # the file it was read from, for messages

    def to_dict(self) -> dict[str, Any]:
        """Plain YAML-able dict of the whole resolved config (paths as strings)."""
        return self.model_dump(mode="json", exclude={"source"} | ({"automl"} if self.automl is None else set()))


def _key_path(loc: tuple[Any, ...]) -> str:
    return _show(".".join(str(part) for part in loc if not str(part).startswith("function-")))


def _describe(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required value missing"
    return _show(error["msg"][0].lower() + error["msg"][1:])


def _ordered_errors(exc: ValidationError) -> list[dict[str, Any]]:
    """The errors in the order they are reported: unknown keys before the rest (a misspelt key
    also leaves its required namesake missing), else as pydantic gives them."""
    return sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")


def _first_error(exc: ValidationError) -> dict[str, Any]:
    """The error to report first (`_ordered_errors`)."""
    return _ordered_errors(exc)[0]


def _raise(source: str, exc: ValidationError, prefix: tuple[str, ...] = (), hint: str = "") -> None:
    first, *rest = _ordered_errors(exc)
    key = _key_path(prefix + tuple(first["loc"]))
    others = [f"{_key_path(prefix + tuple(e['loc']))}: {_describe(e)}" for e in rest]
    tail = ""
    if others:  # each other problem named (up to two), so that fixing the first is not a surprise
        tail = f" (also {'; '.join(others[:2])}" + (f"; and {len(others) - 2} more)" if len(others) > 2 else ")")
    raise ConfigError(f"{source}: {key}: {_describe(first)}{hint}{tail}") from None


def _key_hint(schema: type[BaseModel], error: dict[str, Any]) -> str:
    """``"; did you mean train.max_epochs?"`` for an unknown key close to a known one."""
    if error["type"] != "extra_forbidden" or not error["loc"]:
        return ""
    loc = tuple(str(part) for part in error["loc"])
    model = section_model(schema, loc[:-1])
    if model is None:
        return ""
    known = [name for name in model.model_fields if name != "source"]
    return did_you_mean(loc[-1], known, prefix="".join(f"{p}." for p in loc[:-1]))


#: The largest config file read: a config is a page of YAML; a file larger than this is not one.
MAX_CONFIG_BYTES = 1 << 20


def _read_regular(path: Path) -> bytes:
    """The bytes of ``path`` when it is a regular file of at most `MAX_CONFIG_BYTES`: a device
    (``/dev/zero``, ``/dev/urandom``), a FIFO or a socket never ends or never answers, so it is
    refused before it is opened for reading (a FIFO is opened non-blocking to be inspected).

    Raises:
        ConfigError: not a regular file, or larger than the limit.
        OSError: it cannot be read.
    """
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file (a device, FIFO or socket); a config "
                              "is a YAML file")
        if st.st_size > MAX_CONFIG_BYTES:
            raise ConfigError(f"{path}: {st.st_size} bytes; a config file is at most "
                              f"{MAX_CONFIG_BYTES} bytes")
        with os.fdopen(os.dup(fd), "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: grew past {MAX_CONFIG_BYTES} bytes while read; not a config file")
    return data


def read_yaml(path: Path) -> dict[str, Any]:
    """The mapping in a UTF-8 YAML file, read with a safe loader that refuses duplicate keys.

    Raises:
        ConfigError: the file is missing, unreadable (permissions, a folder), not UTF-8 text, not
            YAML, holds a key twice in one mapping (named with its line), or is not a mapping.
    """
    try:
        data = _read_regular(Path(path))
    except FileNotFoundError:
        meant = existing_file(Path(path))
        hint = f"; did you mean {meant}?" if meant is not None else ""
        raise ConfigError(f"{path}: config file not found{hint}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a folder, not a config file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config file ({exc.strerror or exc})") from None
    if b"\0" in data:
        raise ConfigError(f"{path}: not a text file (holds NUL bytes); expected a YAML config")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
                          f"{exc.start}); save the config as UTF-8") from None
    try:
        tree = yaml.load(text, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or ""
        detail = f": {_show(problem)}" if problem.startswith("duplicate key") else ""
        raise ConfigError(f"{path}: not valid YAML{where}{detail}") from None
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
    tree = copy.deepcopy(tree)
    override_keys: list[str] = []
    for text in overrides:
        key, value = parse_override(text)
        set_path(tree, key, value)
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
        first = _first_error(exc)
        key = _key_path(tuple(first["loc"]))
        hint = _key_hint(schema, first)
        for k in reversed(override_keys):  # the last --set of a key is the one in force
            if key == _show(k) or key.startswith(_show(k) + ".") or (
                    first["type"] == "extra_forbidden" and _show(k).startswith(key + ".")):
                if first["type"] == "extra_forbidden" and key == _show(k):
                    raise ConfigError(f"--set {key}: names no config key{hint}") from None
                raise ConfigError(f"--set {key}: {_describe(first)}{hint}") from None
        _raise(source, exc, hint=hint)
    _check_format(config, workload, source)
    return config  # type: ignore[return-value]


def _check_format(config: Any, workload: Any, source: str) -> None:
    """``data.format`` must be ``auto`` or a form the workload's data tools read.

    Raises:
        ConfigError: it names another form (the message lists the workload's).
    """
    fmt = config.data.format
    known = tuple(workload.data_tools.formats) if workload.data_tools is not None else ()
    if fmt != "auto" and fmt not in known:
        listed = ", ".join(("auto",) + known)
        raise ConfigError(f"{source}: data.format: {fmt!r} is not a form workload "
                          f"{workload.name!r} reads; expected one of {listed}")


def load(path: Path | str, overrides: tuple[str, ...] = ()) -> Config:
    """Read, layer and validate a config file. See `from_dict` for the errors raised."""
    return from_dict(read_yaml(Path(path)), source=str(path), overrides=overrides)


def dump(config: Config) -> str:
    """The resolved config as YAML text (what the run actually used); the caller writes it
    through the atomic writer `mlhpc.data.files.write_text_atomic` (config/ writes no file)."""
    return yaml.safe_dump(config.to_dict(), sort_keys=False)
