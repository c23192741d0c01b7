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

`package_report` lays out the runs of a report, read once (`report_runs`), then has MLCommons'
package checker check the result (`mlhpc.report.package_check.check_package`).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.data.files import PRIVATE_FILE_MODE, copy_mode, reason, write_under
from mlhpc.data.inputs import open_input, walk_files
from mlhpc.data.trees import is_under, make_private_dir, refuse_overlap, resolved
from mlhpc.errors import ConfigError, LogFormatError
from mlhpc.log.facts import RunSummary
from mlhpc.log.parse import MAX_LOG_BYTES, parse_log
from mlhpc.log.summary import summarize_run, superseded_logs
from mlhpc.report.energy import POWER_DIR, is_power_log, power_folder
from mlhpc.report.folders import RESULT_RE, natural, read_mapping, side_mapping, sidecars
from mlhpc.report.package_check import check_package
from mlhpc.report.score import Report
from mlhpc.text import clip

SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+\-]*$")
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


@dataclass(frozen=True)
class PackageOptions:
    """Lay the runs out as a submission: `package_runs` into ``out`` under ``org``/``system``
    (default: the logs' names), then `check_package` on a scratch copy when ``check``, with
    ``--rcp-bypass`` only when ``rcp_bypass``."""

    out: Path
    org: str | None = None
    system: str | None = None
    check: bool = True
    rcp_bypass: bool = False


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
        warnings: a line per name given that differs from the one the logs carry.
    """

    org: str
    system: str
    config: dict[str, Any]
    env: dict[str, Any]
    submission: dict[str, Any]
    first_log: Path
    first: RunSummary
    warnings: tuple[str, ...] = ()


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


def _refuse_broken(log: Path, resumed: bool, later: dict[Path, set[str]]) -> None:
    """Refuses ``log`` when it is a resumed run, or a stopped one that a resume continues
    (`mlhpc.log.summary.superseded_logs` of its folder, kept in ``later`` to be read once per
    folder; the resume may not be among the runs packaged).

    Raises:
        ConfigError: naming the log and the rule.
    """
    if log.parent not in later:
        later[log.parent] = superseded_logs(sorted(log.parent.glob("result_*.txt")))
    if resumed or log.name in later[log.parent]:
        what = "a resumed run" if resumed else "a stopped run continued by --resume"
        raise ConfigError(f"--package: {log} is {what}; the rules time a run as one contiguous "
                          "period (\"The clock may not be paused during the run\"), so a "
                          "submission holds only runs that trained from the start unbroken")


def _read_unbroken_runs(logs: list[Path]) -> list[tuple[Path, RunSummary]]:
    """``(log, summary)`` per log; a resumed run, or a stopped one that a resume continues, is refused."""
    runs, later = [], {}
    for log in logs:
        run = summarize_run(parse_log(log))
        _refuse_broken(log, run.timing.resumed, later)
        runs.append((log, run))
    return runs


def report_runs(report: Report) -> list[tuple[Path, RunSummary]]:
    """``(log, summary)`` of every run of ``report``, as `package_runs` reads them from its logs;
    the report has read and summarised them once already (`mlhpc.report.folders.read_folder`).

    Raises:
        ConfigError: a folder of the report is not an mlhpc run folder; a resumed run, or a
            stopped one that a resume continues.
    """
    if any(f.kind != "runs" for f in report.folders):
        raise ConfigError("--package: give mlhpc run folders, not an MLCommons results tree")
    runs = [(Path(run.facts.path), run.facts) for f in report.folders for run in f.runs]
    later: dict[Path, set[str]] = {}
    for log, facts in runs:
        _refuse_broken(log, facts.timing.resumed, later)
    return runs


def package_report(report: Report, options: PackageOptions) -> PackageResult:
    """The runs of ``report`` (`report_runs`) laid out as a submission under ``options.out``
    (`lay_out`), then checked by MLCommons' package checker when ``options.check``
    (`check_package`).

    Raises:
        ConfigError: see `report_runs` and `lay_out`.
    """
    runs = report_runs(report)
    result = lay_out(runs, Path(options.out), options.org, options.system)
    if options.check:
        check_package(result, rcp_bypass=options.rcp_bypass)
    return result


def _submission(runs: list[tuple[Path, RunSummary]], out: Path, org: str | None, system: str | None) -> _Submission:
    """What the package of ``runs`` in ``out`` will be, checked: no run folder and ``out`` hold
    each other; org and system names (given, else the logs', else the config's), checked to be folder
    names, with the first run's side files (`mlhpc.report.folders.side_mapping`); every run
    names its benchmark, and all share one division and one node count; a warning per name
    given that differs from the one the logs carry.

    Raises:
        ConfigError: ``out`` and a run folder contain each other; a name that is not a folder
            name; runs of two divisions or node counts; a side file that cannot be read.
        LogFormatError: a run names no benchmark, or one that is not a folder name.
    """
    for log, _ in runs:  # a package inside a run folder would be read back as its runs
        refuse_overlap(log.parent, out, "--package", ConfigError)
    first_log, first = runs[0]
    config, env = (side_mapping(first_log, stem, suffix) for stem, suffix in (("config", ".yaml"), ("env", ".json")))
    submission = config.get("submission") if isinstance(config.get("submission"), dict) else {}
    org = org or first.submission.org or submission.get("org")
    system = system or first.submission.platform or submission.get("platform")
    for label, name in (("--org", org), ("--system", system)):
        if not name or not SAFE_NAME.match(str(name)):
            raise ConfigError(f"--package: {label} {name!r} must be a folder name (letters, digits, _ . + -)")
    said_first = first.submission
    for log, run in runs:
        said = run.submission
        if said.benchmark is None:
            raise LogFormatError(f"{log}: no submission_benchmark record; cannot place it in a package")
        if not SAFE_NAME.match(said.benchmark) or said.benchmark in (".", ".."):  # becomes a folder name
            raise LogFormatError(f"{log}: submission_benchmark {clip(said.benchmark, 80)!r} is not a folder "
                                 "name (letters, digits, _ . + -); cannot place it in a package")
        if said_first.division and said.division and said.division != said_first.division:
            raise ConfigError(f"--package: {log} is {said.division} division, {first_log} is {said_first.division}")
        if said.number_of_nodes != said_first.number_of_nodes:
            raise ConfigError(f"--package: {log} ran on {said.number_of_nodes} nodes, {first_log} on "
                              f"{said_first.number_of_nodes}; one system name per node count")
    warnings = tuple(f"{label} {given} differs from the logs' {key} {logged}" for label, given, logged, key in (
        ("--org", str(org), said_first.org, "submission_org"),
        ("--system", str(system), said_first.platform, "submission_platform"))
        if logged and given != logged)
    return _Submission(str(org), str(system), config, env, submission, first_log, first, warnings)


def package_runs(run_dirs: list[Path | str], out: Path | str, org: str | None = None,
                 system: str | None = None) -> PackageResult:
    """Copy the runs' ``result_*.txt`` into ``out/ORG/results/SYSTEM/strong/<benchmark>/`` and
    write ``out/ORG/systems/SYSTEM.json`` (`lay_out` of the runs read from their logs).

    Args:
        run_dirs: mlhpc run folders (``result_N.txt`` with ``config_N.yaml``/``env_N.json``), or
            single result logs.
        out: the folder the package goes in; created if missing.
        org / system: submitter and system name (default: the logs' ``submission_org`` and
            ``submission_platform``).

    Returns:
        a `PackageResult` (not yet checked: see `check_package`).

    Raises:
        ConfigError: no run found; a resumed run or one a resume continues; see `lay_out`.
        LogFormatError: a log cannot be read.
    """
    return lay_out(_read_unbroken_runs(_find_logs(run_dirs)), Path(out), org, system)


def lay_out(runs: list[tuple[Path, RunSummary]], out: Path, org: str | None = None,
            system: str | None = None) -> PackageResult:
    """The runs (``(log, summary)``, in order) copied into ``out/ORG/results/SYSTEM/strong/<benchmark>/``
    as ``result_<i>.txt``, with their power logs and the source that ran, and
    ``out/ORG/systems/SYSTEM.json`` written.

    Raises:
        ConfigError: ``out`` and a run folder contain each other; ``out`` is a link, a file, not
            the invoking user's or writable by others (naming owner and mode); a name that is
            not a safe folder name, runs disagreeing on org/division or node count, a
            destination benchmark folder that already holds results, a link planted below
            ``out``, or a file that cannot be written (named, with the cause).
        LogFormatError: a run names no benchmark, or one that is not a folder name.
    """
    sub = _submission(runs, out, org, system)
    make_private_dir(out, ConfigError, "--package destination")
    result = PackageResult(root=out / sub.org, warnings=list(sub.warnings))
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
    workloads = {str(read_mapping(c, "config").get("workload") or benchmark) for c in config_files}
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
                   for c in sidecars(log, "config", ".yaml")]
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
