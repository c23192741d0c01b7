"""Per-run compliance verdicts from MLCommons' own checker (mlperf_logging.compliance_checker).

The official rules are data (``hpc_<ruleset>/*.yaml``) interpreted by
``mlp_compliance.ComplianceChecker``. We hand it the records we already parsed, as the
``mlp_parser.LogLine`` tuples it reads, and collect its messages instead of letting it log them.
The checker re-reads its YAML rule files for every log (80% of its run time) and compiles
each rule's Python expression again for every record; while `check_run` runs, both are served
from caches (rule files by path, expressions by source text). Nothing the rules say changes,
and a whole round is checked in seconds.
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import yaml

from mlhpc.errors import ConfigError
from mlhpc.report.parse import TOKEN, ParsedLog

SUPPORTED_RULESETS = ("1.0.0", "2.0.0", "3.0.0")
DEFAULT_RULESET = "3.0.0"
_ROUND_RE = re.compile(r"(?:^|[_\-/])v(\d+)\.(\d+)(?:$|[_\-/])")
_lock = threading.Lock()


@dataclass(frozen=True)
class Verdict:
    """The checker's verdict on one log: ``ok`` and its messages (empty when ok)."""

    ok: bool
    ruleset: str
    messages: tuple[str, ...] = ()


def ruleset_for(path: Path | str, override: str | None = None) -> str:
    """The hpc ruleset a log is checked against.

    ``override`` wins; otherwise the round named in the path (``hpc_results_v1.0`` -> ``1.0.0``,
    ``v2.0`` -> ``2.0.0``, ``v0.7`` -> ``1.0.0``, the oldest hpc ruleset mlperf_logging ships);
    otherwise ``3.0.0`` (the rules mlhpc's own logs follow).

    Raises:
        ConfigError: ``override`` is not one of `SUPPORTED_RULESETS`.
    """
    if override is not None:
        if override not in SUPPORTED_RULESETS:
            raise ConfigError(f"--ruleset {override}: expected one of {', '.join(SUPPORTED_RULESETS)}")
        return override
    for part in reversed(Path(path).parts):
        match = _ROUND_RE.search("/" + part + "/")
        if match:
            major, minor = int(match.group(1)), int(match.group(2))
            if major == 0:
                return "1.0.0"
            candidate = f"{major}.{minor}.0"
            if candidate in SUPPORTED_RULESETS:
                return candidate
    return DEFAULT_RULESET


class _CachedYaml:
    """Stands in for the ``yaml`` module inside mlp_compliance: ``load`` of a rule file is cached."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(yaml, name)

    def load(self, stream: Any, Loader: Any = None) -> Any:  # noqa: N803 - yaml's own name
        name = getattr(stream, "name", None)
        if name is None:
            return yaml.load(stream, Loader=Loader)
        key = (name, Loader)
        if key not in self._cache:
            self._cache[key] = yaml.load(stream, Loader=getattr(yaml, "CBaseLoader", Loader)
                                         if Loader is yaml.BaseLoader else Loader)
        return self._cache[key]


_CACHED_YAML = _CachedYaml()


@functools.lru_cache(maxsize=4096)
def _compiled(source: str, mode: str) -> Any:
    return compile(source, "<mlperf rule>", mode)


def _cached_eval(source: Any, *args: Any) -> Any:
    code = _compiled(source, "eval") if isinstance(source, str) else source
    return eval(code, *args)  # noqa: S307 - the official rule expressions, as mlp_compliance does


def _cached_exec(source: Any, *args: Any) -> Any:
    code = _compiled(source, "exec") if isinstance(source, str) else source
    return exec(code, *args)  # noqa: S102 - the official rule code, as mlp_compliance does


@contextlib.contextmanager
def _cached_rules() -> Iterator[Any]:
    from mlperf_logging.compliance_checker import mlp_compliance

    with _lock:
        saved = mlp_compliance.yaml
        mlp_compliance.enqueued_configs.clear()
        mlp_compliance.yaml = _CACHED_YAML
        mlp_compliance.eval, mlp_compliance.exec = _cached_eval, _cached_exec
        try:
            yield mlp_compliance
        finally:
            mlp_compliance.yaml = saved
            del mlp_compliance.eval, mlp_compliance.exec
            mlp_compliance.enqueued_configs.clear()


def check_run(parsed: ParsedLog, ruleset: str = DEFAULT_RULESET) -> Verdict:
    """Run MLCommons' compliance checker (``hpc_<ruleset>/common.yaml``) on one parsed log.

    Follows ``mlp_compliance.ComplianceChecker.check_file`` as result_summarizer and
    package_checker call it (``quiet=True, werror=False``): a log with a malformed record line
    fails ("Log lines had parsing errors."), then every rule file is applied.

    Args:
        parsed: the log, from `mlhpc.report.parse.parse_log`.
        ruleset: ``"1.0.0"``, ``"2.0.0"`` or ``"3.0.0"``.

    Returns:
        a `Verdict`; never raises for a bad log (the checker's own failures become messages).
    """
    from mlperf_logging.compliance_checker.mlp_parser.ruleset_300 import LogLine

    lines = [LogLine(TOKEN + "{...}", e.time_ms, e.key, {"value": e.value, "metadata": e.metadata},
                     e.record_index) for e in parsed.events]
    with _cached_rules() as mlp_compliance:
        checker = mlp_compliance.make_checker(usage="hpc", ruleset=ruleset, quiet=True, werror=False)
        if parsed.malformed:
            checker.put_message("Log lines had parsing errors.")
        try:
            checker.check_loglines(lines, f"hpc_{ruleset}/common.yaml")
        except Exception as exc:  # the checker evaluates rule code; report, never crash
            checker.put_message(f"compliance checker failed: {type(exc).__name__}: {exc}")
        messages = (*checker.overwritable.values(), *checker.not_overwritable)
    first_lines = tuple(str(m).splitlines()[0] if str(m) else "" for m in messages)
    return Verdict(ok=not messages, ruleset=ruleset, messages=first_lines)
