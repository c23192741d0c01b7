"""Lay mlhpc run folders out as an MLPerf HPC submission package.

Layout and fields follow MLCommons' submission rules as their checkers read them
(``mlperf_logging/package_checker/package_checker.py``, ``system_desc_checker.py``)::

    ORG/results/SYSTEM/strong/<benchmark>/result_<i>.txt     i = 0, 1, ... per benchmark
    ORG/systems/SYSTEM.json                                   every required system field

The system description is filled from the runs' ``env_N.json``: CPU model
and count, GPU names and count, OS, Python/torch versions, git commit; and from their
``config_N.yaml``: ``submission: {org, platform, division, status}``.
Fields nothing in a run folder tells (interconnect, cooling, ...) are left empty, as published
submissions do. ``ORG/benchmarks/<benchmark>/implementations/mlhpc/`` holds the source that
ran (the mlhpc harness, the workload's package and the runs' configs): result_summarizer's
``code_url`` points at ``ORG/benchmarks``. A log marked resumed is refused (a resumed run is not
an ordinary run of a submission). Where the logs' ``submission_org``/``submission_platform``
differ from ``--org``/``--system`` the result says so.

The destination is checked as every data command checks its own
(`mlhpc.data.trees.make_private_dir`): created ``0700``, or an existing folder of the invoking
user that nobody else can write; everything is written through folders opened without
following links (`mlhpc.data.files.write_under`), copies no wider than their sources.

`check_package` runs ``python -m mlperf_logging.package_checker ORG hpc <ruleset>`` (default
`mlhpc.rules`' current one, 3.0.0) on a scratch copy
(the checker writes ``scaling.json`` into what it checks), as a submitter would: without
``--rcp-bypass`` unless asked, and the result records which.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from mlhpc import rules
from mlhpc.data.files import PRIVATE_FILE_MODE, copy_mode, reason, write_under
from mlhpc.data.inputs import open_input, read_text_input, walk_files
from mlhpc.data.trees import is_under, make_private_dir, refuse_overlap, resolved
from mlhpc.errors import ConfigError, LogFormatError
from mlhpc.log.facts import RunSummary
from mlhpc.log.mlperf_adapter import package_checker_command
from mlhpc.log.parse import MAX_LOG_BYTES, parse_log
from mlhpc.log.summary import is_resumed, summarize_run, superseded_logs
from mlhpc.report.energy import POWER_DIR, is_power_log, power_folder
from mlhpc.report.folders import RESULT_RE, natural, sidecars
from mlhpc.text import clip

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
SUCCESS_LINE = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS"
SYSTEM_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes", "host_processors_per_node",
    "host_processor_model_name", "host_processor_core_count", "host_processor_vcpu_count",
    "host_processor_frequency", "host_processor_caches", "host_processor_interconnect",
    "host_memory_capacity", "host_storage_type", "host_storage_capacity", "host_networking",
    "host_networking_topology", "host_memory_configuration", "accelerators_per_node",
    "accelerator_model_name", "accelerator_host_interconnect", "accelerator_frequency",
    "accelerator_on-chip_memories", "accelerator_memory_configuration",
    "accelerator_memory_capacity", "accelerator_interconnect", "accelerator_interconnect_topology",
    "cooling", "hw_notes", "framework", "other_software_stack", "operating_system", "sw_notes",
)


@dataclass
class PackageResult:
    """What `package_runs` wrote, and the package checker's verdict when it was run.

    Attributes:
        root: ``OUT/ORG``.
        result_files: the ``result_<i>.txt`` written, in order.
        system_file: ``OUT/ORG/systems/SYSTEM.json``.
        checker_ok: True/False from package_checker, ``None`` when not run.
        checker_messages: its ERROR lines (and the last line when it fails without one).
        rcp_bypass: the checker ran with ``--rcp-bypass``.
        warnings: one-line remarks (names that differ from the logs', ...).
    """

    root: Path
    result_files: list[Path] = field(default_factory=list)
    system_file: Path | None = None
    checker_ok: bool | None = None
    checker_messages: list[str] = field(default_factory=list)
    rcp_bypass: bool = False
    warnings: list[str] = field(default_factory=list)


def _sidecar(log: Path, stem: str, suffix: str) -> Path | None:
    """``<stem>_<N><suffix>`` beside ``result_<N>.txt`` (`mlhpc.report.folders.sidecars`), else None."""
    return next(iter(sidecars(log, stem, suffix)), None)


def _read_mapping(path: Path | None, kind: str) -> dict[str, Any]:
    if path is None:
        return {}
    try:
        text = read_text_input(path, root=path.parent, what=f"run's {kind} file", error=ConfigError)
        data = json.loads(text) if kind == "json" else yaml.safe_load(text)
    except (ValueError, RecursionError, yaml.YAMLError):
        raise ConfigError(f"{path}: cannot read this run's {kind} file") from None
    return data if isinstance(data, dict) else {}


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def system_description(org: str, system: str, env: dict[str, Any], config: dict[str, Any],
                       nodes: int | None, accelerators_per_node: int | None) -> dict[str, Any]:
    """The ``systems/<system>.json`` of a submission, every field system_desc_checker requires.

    Args:
        org / system: submitter and system name.
        env: a run's env.json (keys ``cpu_model``, ``cpu_count``, ``gpu_names``, ``gpu_count``,
            ``os``, ``python``, ``memory_bytes``, ``versions``, ``git_commit``; all optional).
        config: the run's resolved config (``submission.division``/``status`` used).
        nodes / accelerators_per_node: from the log (``number_of_nodes``, ``accelerators_per_node``).
    """
    submission = config.get("submission") if isinstance(config.get("submission"), dict) else {}
    versions = env.get("versions") if isinstance(env.get("versions"), dict) else {}
    gpus = env.get("gpu_names") if isinstance(env.get("gpu_names"), list) else []
    gpu_count = env.get("gpu_count") if isinstance(env.get("gpu_count"), int) else len(gpus)
    memory = env.get("memory_bytes")
    desc: dict[str, Any] = {name: "" for name in SYSTEM_FIELDS}
    desc.update({
        "submitter": org,
        "division": _text(submission.get("division") or "open"),
        "status": _text(submission.get("status") or "research"),
        "system_name": system,
        "number_of_nodes": _text(nodes or 1),
        "host_processors_per_node": "1",
        "host_processor_model_name": _text(env.get("cpu_model")),
        "host_processor_core_count": _text(env.get("cpu_count")),
        "host_memory_capacity": f"{memory / 2**30:.0f} GiB" if isinstance(memory, (int, float)) else "",
        "accelerators_per_node": _text(accelerators_per_node if accelerators_per_node is not None else gpu_count),
        "accelerator_model_name": _text(gpus[0] if gpus else "none (CPU)"),
        "framework": f"PyTorch {versions.get('torch') or ''}".strip(),
        "other_software_stack": {k: _text(v) for k, v in
                                 {"python": env.get("python"), "cuda": env.get("cuda"), **versions}.items()
                                 if v is not None},
        "operating_system": _text(env.get("os")),
        "sw_notes": f"mlhpc git commit {env.get('git_commit')}" if env.get("git_commit") else "",
    })
    return desc


@dataclass(frozen=True)
class _Submission:
    """Who and what a package is for: names, and the first run's sidecars and summary.

    Attributes:
        org / system: submitter and system folder names.
        config / env: the first run's ``config_N.yaml`` and ``env_N.json`` (empty when absent).
        submission: that config's ``submission`` mapping.
        first_log / first: the first run's log and its `RunSummary`.
    """

    org: str
    system: str
    config: dict[str, Any]
    env: dict[str, Any]
    submission: dict[str, Any]
    first_log: Path
    first: RunSummary


def _find_logs(run_dirs: list[Path | str]) -> list[Path]:
    """The result logs given, or found in the given folders (natural order)."""
    logs: list[Path] = []
    for raw in run_dirs:
        path = Path(raw)
        if path.is_file():
            logs.append(path)
        elif path.is_dir():
            logs.extend(sorted((p for p in path.iterdir() if RESULT_RE.match(p.name)), key=natural))
        else:
            raise ConfigError(f"--package: run folder {path} does not exist")
    if not logs:
        raise ConfigError("--package: no result_*.txt in the given run folders")
    return logs


def _read_unbroken_runs(logs: list[Path]) -> list[tuple[Path, RunSummary]]:
    """``(log, summary)`` per log; a resumed run, or a stopped one that a resume continues, is refused."""
    runs = []
    for log in logs:
        parsed = parse_log(log)
        resumed = is_resumed(parsed)
        if resumed or log.name in superseded_logs(sorted(log.parent.glob("result_*.txt"))):
            what = "a resumed run" if resumed else "a stopped run continued by --resume"
            raise ConfigError(f"--package: {log} is {what}; the rules time a run as one contiguous "
                              "period (\"The clock may not be paused during the run\"), so a "
                              "submission holds only runs that trained from the start unbroken")
        runs.append((log, summarize_run(parsed)))
    return runs


def _identify(runs: list[tuple[Path, RunSummary]], org: str | None, system: str | None) -> _Submission:
    """Org and system names (given, else the logs', else the config's), checked to be folder
    names, with the first run's sidecars."""
    first_log, first = runs[0]
    config = _read_mapping(_sidecar(first_log, "config", ".yaml"), "yaml")
    env = _read_mapping(_sidecar(first_log, "env", ".json"), "json")
    submission = config.get("submission") if isinstance(config.get("submission"), dict) else {}
    org = org or first.submission.org or submission.get("org")
    system = system or first.submission.platform or submission.get("platform")
    for label, name in (("--org", org), ("--system", system)):
        if not name or not SAFE_NAME.match(str(name)):
            raise ConfigError(f"--package: {label} {name!r} must be a folder name (letters, digits, _ . + -)")
    return _Submission(str(org), str(system), config, env, submission, first_log, first)


def _check_alike(runs: list[tuple[Path, RunSummary]], sub: _Submission) -> None:
    """Every run names its benchmark, and all share one division and one node count."""
    first_log, first = sub.first_log, sub.first.submission
    for log, run in runs:
        said = run.submission
        if said.benchmark is None:
            raise LogFormatError(f"{log}: no submission_benchmark record; cannot place it in a package")
        if not SAFE_NAME.match(said.benchmark) or said.benchmark in (".", ".."):  # becomes a folder name
            raise LogFormatError(f"{log}: submission_benchmark {clip(said.benchmark, 80)!r} is not a folder "
                                 "name (letters, digits, _ . + -); cannot place it in a package")
        if first.division and said.division and said.division != first.division:
            raise ConfigError(f"--package: {log} is {said.division} division, {first_log} is {first.division}")
        if said.number_of_nodes != first.number_of_nodes:
            raise ConfigError(f"--package: {log} ran on {said.number_of_nodes} nodes, {first_log} on "
                              f"{first.number_of_nodes}; one system name per node count")


def _name_warnings(sub: _Submission) -> list[str]:
    """A line per name given that differs from the one the logs carry."""
    warnings = []
    logged_as = sub.first.submission
    for label, given, logged in (("--org", sub.org, logged_as.org), ("--system", sub.system, logged_as.platform)):
        if logged and given != logged:
            warnings.append(f"{label} {given} differs from the logs' "
                            f"{'submission_org' if label == '--org' else 'submission_platform'} {logged}")
    return warnings


def package_runs(run_dirs: list[Path | str], out: Path | str, org: str | None = None,
                 system: str | None = None) -> PackageResult:
    """Copy the runs' ``result_*.txt`` into ``out/ORG/results/SYSTEM/strong/<benchmark>/`` and
    write ``out/ORG/systems/SYSTEM.json``.

    Args:
        run_dirs: mlhpc run folders (``result_N.txt`` with ``config_N.yaml``/``env_N.json``), or
            single result logs.
        out: the folder the package goes in; created if missing.
        org / system: submitter and system name (default: the logs' ``submission_org`` and
            ``submission_platform``).

    Returns:
        a `PackageResult` (not yet checked: see `check_package`).

    Raises:
        ConfigError: ``out`` and a run folder contain each other; ``out`` is a link, a file, not
            the invoking user's or writable by others (naming owner and mode); no run found, a
            name that is not a safe folder name, runs disagreeing on org/division or node count,
            a destination benchmark folder that already holds results, a link planted below
            ``out``, or a file that cannot be written (named, with the cause).
        LogFormatError: a log cannot be read.
    """
    for run_dir in run_dirs:  # a package inside a run folder would be read back as its runs
        folder = Path(run_dir) if Path(run_dir).is_dir() else Path(run_dir).parent
        refuse_overlap(folder, Path(out), "--package", ConfigError)
    runs = _read_unbroken_runs(_find_logs(run_dirs))
    sub = _identify(runs, org, system)
    _check_alike(runs, sub)
    make_private_dir(Path(out), ConfigError, "--package destination")
    result = PackageResult(root=Path(out) / sub.org, warnings=_name_warnings(sub))
    try:
        _copy_results(result, runs, sub.system)
        _write_system(result, sub)
    except OSError as exc:
        raise ConfigError(f"{exc.filename or out}: --package cannot write the package "
                          f"({reason(exc)})") from None
    return result


def _copy_into(root: Path, rel: Path, source: Path) -> Path:
    """``source`` copied to ``root/rel`` (`write_under`: no link followed), its permission bits
    at most. Raises ConfigError for a link out of the source's folder (a log or config that is
    a link to another file of the node would carry that file into a package meant to be
    published); OSError."""
    target = resolved(source)
    if Path(source).is_symlink() and not is_under(target, resolved(Path(source).parent)):
        raise ConfigError(f"{source}: symbolic link out of its run folder (to {target}); links are "
                          "not followed into a package (copy the file there)")
    fd = open_input(source, MAX_LOG_BYTES, Path(source).parent, "packaged file", ConfigError)
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(MAX_LOG_BYTES + 1)
        mode = copy_mode(os.fstat(handle.fileno()).st_mode)
    return write_under(root, rel, data, mode)


def _copy_sources(root: Path, benchmark: str, config_files: list[Path]) -> None:
    """The source that ran, under ``ORG/benchmarks/<benchmark>/implementations/mlhpc``: the
    harness, and each workload the runs' configs name (the benchmark's own name when none does),
    found through its entry point wherever it is installed (`mlhpc.workload.source_files`), at
    its import path.

    Raises:
        ConfigError: a workload that is not installed, or a link out of a source folder.
    """
    import mlhpc
    from mlhpc.workload import source_files

    out = root.parent
    dest = Path(root.name) / "benchmarks" / benchmark / "implementations" / "mlhpc"
    harness = Path(mlhpc.__file__).parent
    for rel, _ in walk_files(harness, ConfigError):
        if "__pycache__" not in rel.split("/") and not rel.endswith(".pyc"):
            _copy_into(out, dest / "mlhpc" / rel, harness / rel)
    workloads = {str(_read_mapping(c, "config").get("workload") or benchmark) for c in config_files}
    for name in sorted(workloads or {benchmark}):
        for source, rel in source_files(name):
            _copy_into(out, dest / rel, source)
    for config in config_files:
        _copy_into(out, dest / "configs" / f"{config.parent.name}-{config.name}", config)


def _copy_results(result: PackageResult, runs: list[tuple[Path, RunSummary]], system: str) -> None:
    """Each log as ``result_<i>.txt`` of its benchmark (into empty folders only), and the source
    that ran beside them."""
    root = result.root
    counters: dict[str, int] = {}
    for log, run in runs:
        benchmark = str(run.submission.benchmark)
        folder = root / "results" / system / "strong" / benchmark
        if benchmark not in counters:
            if folder.is_dir() and not folder.is_symlink() and any(folder.iterdir()):
                raise ConfigError(f"--package: {folder} already holds results; choose an empty OUT")
            counters[benchmark] = 0
        rel = folder.relative_to(root.parent) / f"result_{counters[benchmark]}.txt"
        counters[benchmark] += 1
        result.result_files.append(_copy_into(root.parent, rel, log))
    _copy_power(result, runs)
    for benchmark in counters:
        configs = [c for log, run in runs if run.submission.benchmark == benchmark
                   for c in [_sidecar(log, "config", ".yaml")] if c is not None]
        _copy_sources(root, benchmark, sorted(set(configs)))


def _power_logs(log: Path) -> list[Path]:
    """The power logs of ``log`` (`mlhpc.report.energy.is_power_log` files of its
    `power_folder`), sorted; none
    when that folder is a link or missing. Raises ConfigError when a link (``power`` itself)
    takes the folder out of the log's run folder."""
    folder = power_folder(log)
    if folder.is_symlink() or not folder.is_dir():
        return []
    if not is_under(resolved(folder), resolved(Path(log).parent)):
        raise ConfigError(f"{folder}: symbolic link out of its run folder (to {resolved(folder)}); links "
                          "are not followed into a package (copy the power logs there)")
    return sorted(e for e in folder.iterdir() if is_power_log(e.name) and e.is_file())


def _copy_power(result: PackageResult, runs: list[tuple[Path, RunSummary]]) -> None:
    """The runs' power logs (`mlhpc.report.energy.power_folder`: ``power/result_N/node_K.txt``
    and ``sw_K.txt``) beside their packaged logs as ``power/result_<i>/``, the layout of MLPerf's
    power track. package_checker accepts a power folder only when every result of the benchmark
    has one, so a benchmark whose runs are not all measured gets none, with a warning."""
    for benchmark in sorted({str(run.submission.benchmark) for _, run in runs}):
        pairs = [(_power_logs(log), packaged) for (log, run), packaged in zip(runs, result.result_files)
                 if str(run.submission.benchmark) == benchmark]
        measured = sum(1 for logs, _ in pairs if logs)
        if measured and measured < len(pairs):
            result.warnings.append(
                f"--package: power logs left out for {benchmark}: {measured} of {len(pairs)} "
                "runs have them, and package_checker accepts power for all results or none")
        if measured != len(pairs):
            continue
        for logs, packaged in pairs:
            rel = packaged.relative_to(result.root.parent)
            for entry in logs:
                _copy_into(result.root.parent, rel.parent / POWER_DIR / rel.stem / entry.name, entry)


def _write_system(result: PackageResult, sub: _Submission) -> None:
    """``ORG/systems/SYSTEM.json``; division and status fall back on the logs' values."""
    submission, first = sub.submission, sub.first
    if first.submission.division and not submission.get("division"):
        submission = {**submission, "division": first.submission.division}
    if first.submission.status_submission and not submission.get("status"):
        submission = {**submission, "status": first.submission.status_submission}
    desc = system_description(sub.org, sub.system, sub.env, {**sub.config, "submission": submission},
                              first.submission.number_of_nodes, first.submission.accelerators_per_node)
    rel = Path(result.root.name) / "systems" / f"{sub.system}.json"
    result.system_file = write_under(result.root.parent, rel, (json.dumps(desc, indent=4) + "\n").encode(),
                                     PRIVATE_FILE_MODE)


def check_package(result: PackageResult, ruleset: str = rules.ruleset().version, timeout_s: float = 300.0,
                  rcp_bypass: bool = False) -> PackageResult:
    """Run ``python -m mlperf_logging.package_checker ORG hpc <ruleset>`` (with ``--rcp-bypass``
    only when ``rcp_bypass``) on a scratch copy of the package and record its verdict in
    ``result`` (returned).

    The verdict is the checker's own final line (``PACKAGE CHECKER FOUND NO ERRORS, SUCCESS``);
    its ERROR lines become ``checker_messages``.
    """
    with tempfile.TemporaryDirectory(prefix="mlhpc-package-check-") as scratch:
        copy = Path(scratch) / result.root.name
        shutil.copytree(result.root, copy)
        try:
            result.rcp_bypass = rcp_bypass
            proc = subprocess.run(
                [sys.executable, "-m", *package_checker_command(copy.name, ruleset),
                 *(["--rcp-bypass"] if rcp_bypass else []),
                 "--log_output", str(Path(scratch) / "package_checker.log")],
                cwd=scratch, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            result.checker_ok = False
            result.checker_messages = [f"package_checker did not finish in {timeout_s:.0f} s"]
            return result
    output = (proc.stdout + "\n" + proc.stderr).splitlines()
    result.checker_ok = proc.returncode == 0 and any(SUCCESS_LINE in line for line in output)
    result.checker_messages = [line.strip() for line in output if line.startswith("ERROR")]
    if not result.checker_ok and not result.checker_messages:
        tail = [line for line in output if line.strip()]
        result.checker_messages = tail[-1:] or [f"package_checker exited with status {proc.returncode}"]
    return result
