"""Every call mlhpc makes into mlperf_logging's internals, in this module alone.

mlperf_logging is the authority on compliance, RCPs and scores, and mlhpc takes its verdicts from
its tools. Some of what mlhpc calls is not a documented API: the compliance checker's
``make_checker`` / ``check_loglines`` and its ``LogLine`` tuple, the module global
``enqueued_configs``, the RCP checker's ``check_directory`` / ``get_submission_epochs``,
``benchmark_meta.get_result_file_counts``, and the layout of the rule and RCP files inside the
installed package (``compliance_checker/hpc_<ruleset>/closed_<benchmark>.yaml``,
``rcp_checker/hpc_<ruleset>/rcps_<benchmark>.json``). Everything that leans on those goes through
this module, so that a new mlperf_logging release that changes one of them fails in one place:
`self_check` names each thing relied on, and tests/test_mlperf_adapter.py runs it.

pyproject.toml bounds the version (``mlperf-logging>=4.1,<4.2``); the bound moves when
`self_check` passes on a new release.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from pathlib import Path
from typing import Any

import yaml

from mlhpc import rules

#: What this module relies on: (module, attribute, the parameters a callable must accept).
RELIED_ON: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("mlperf_logging.compliance_checker.mlp_compliance", "make_checker", ("usage", "ruleset", "quiet", "werror")),
    ("mlperf_logging.compliance_checker.mlp_compliance", "enqueued_configs", ()),
    ("mlperf_logging.compliance_checker.mlp_parser.ruleset_300", "LogLine", ()),
    ("mlperf_logging.rcp_checker.rcp_checker", "check_directory", ("dir", "usage", "version", "verbose", "bert_train_samples")),
    ("mlperf_logging.rcp_checker.rcp_checker", "get_submission_epochs", ("result_files", "ruleset", "bert_train_samples")),
    ("mlperf_logging.benchmark_meta", "get_result_file_counts", ("usage",)),
    ("mlperf_logging.mllog", "constants", ()),
)
#: Methods of the checker object `make_checker` returns, and its attributes read after a check.
CHECKER_METHODS = ("check_loglines", "put_message")
CHECKER_ATTRIBUTES = ("overwritable", "not_overwritable")


def _module(name: str) -> Any:
    return importlib.import_module(name)


def version() -> str:
    """The installed mlperf-logging version (``"unknown"`` when its metadata is missing)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mlperf-logging")
    except PackageNotFoundError:
        return "unknown"


def compliance_checker() -> tuple[Any, Any]:
    """``(mlp_compliance module, LogLine)`` of the compliance checker."""
    return (_module("mlperf_logging.compliance_checker.mlp_compliance"),
            _module("mlperf_logging.compliance_checker.mlp_parser.ruleset_300").LogLine)


def rcp_checker() -> Any:
    """The ``rcp_checker.rcp_checker`` module (``check_directory``, ``get_submission_epochs``)."""
    return _module("mlperf_logging.rcp_checker.rcp_checker")


def result_file_counts(usage: str = "hpc") -> dict[str, int]:
    """Result files each benchmark needs (``benchmark_meta.get_result_file_counts``)."""
    return dict(_module("mlperf_logging.benchmark_meta").get_result_file_counts(usage))


def rules_dir(ruleset: str) -> Path:
    """The folder of the compliance rule files of ``hpc_<ruleset>`` inside the package."""
    return Path(_module("mlperf_logging.compliance_checker").__file__).parent / f"hpc_{ruleset}"


#: The quality-metric keys of the HPC rules.
METRIC_KEYS = ("eval_error", "eval_accuracy")
_TARGET_RE = re.compile(r"v\[['\"]value['\"]\]\s*(<=|>=|<|>)\s*([0-9][0-9.eE+\-]*)")


@functools.lru_cache(maxsize=None)
def quality_target(benchmark: str | None, ruleset: str | None = None) -> tuple[str, float, str] | None:
    """``(metric key, target, "min"|"max")`` of a closed-division benchmark, read from
    mlperf_logging's own rule file ``compliance_checker/hpc_<ruleset>/closed_<benchmark>.yaml``
    (the ``ATLEAST_ONE_CHECK`` of its ``eval_error``/``eval_accuracy`` key, e.g.
    ``v['value'] <= 0.124``) of ``ruleset`` (default: `mlhpc.rules`' current one); ``None`` when the file or the check is missing. The rules are the
    one source of the reference targets: mlhpc keeps no copy of them.
    """
    if not benchmark:
        return None
    path = rules_dir(ruleset or rules.ruleset().version) / f"closed_{benchmark}.yaml"
    try:
        checks = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    for rule in checks if isinstance(checks, list) else []:
        key = rule.get("KEY") if isinstance(rule, dict) else None
        if not isinstance(key, dict) or key.get("NAME") not in METRIC_KEYS:
            continue
        match = _TARGET_RE.search(str(key.get("ATLEAST_ONE_CHECK", "")))
        if match:
            return key["NAME"], float(match.group(2)), "min" if match.group(1).startswith("<") else "max"
    return None


def rcp_dir(ruleset: str) -> Path:
    """The folder of the RCP files of ``hpc_<ruleset>`` inside the package."""
    return Path(_module("mlperf_logging.rcp_checker").__file__).parent / f"hpc_{ruleset}"


def rcp_rulesets() -> tuple[str, ...]:
    """The hpc rulesets for which the installed package ships RCP files."""
    root = Path(_module("mlperf_logging.rcp_checker").__file__).parent
    return tuple(sorted(p.name.split("_", 1)[1] for p in root.glob("hpc_*") if p.is_dir()))


def package_checker_command(org_dir: str, ruleset: str) -> list[str]:
    """The arguments after ``python -m`` that run the package checker on ``org_dir``."""
    return ["mlperf_logging.package_checker", org_dir, "hpc", ruleset]


def self_check() -> list[str]:
    """Every thing relied on that the installed mlperf_logging no longer provides, one line
    each naming it (an empty list when all is there): missing modules, attributes, parameters
    of the functions called, methods of the checker object, and the naming of hpc 3.0.0's rule
    and RCP files (``closed_<benchmark>.yaml``, ``rcps_<benchmark>.json``: one of each there)."""
    problems: list[str] = []
    for module, attribute, params in RELIED_ON:
        try:
            found = getattr(_module(module), attribute)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{module}.{attribute}: missing ({type(exc).__name__})")
            continue
        if params:
            have = set(inspect.signature(found).parameters)
            problems += [f"{module}.{attribute}: no parameter {p!r}" for p in params if p not in have]
    if not problems:
        mlp, _ = compliance_checker()
        checker = mlp.make_checker(usage="hpc", ruleset="3.0.0", quiet=True, werror=False)
        problems += [f"make_checker(...).{m}: missing" for m in CHECKER_METHODS if not hasattr(checker, m)]
        problems += [f"make_checker(...).{a}: missing" for a in CHECKER_ATTRIBUTES if not hasattr(checker, a)]
        mlp.enqueued_configs.clear()
    # the file names `quality_target` and `mlhpc.report.rcp` build from a log's benchmark
    for folder, pattern in ((rules_dir("3.0.0"), "closed_*.yaml"), (rcp_dir("3.0.0"), "rcps_*.json")):
        if not any(path.is_file() for path in folder.glob(pattern)):
            problems.append(f"{folder / pattern}: rule file layout changed (no such file)")
    return problems
