"""Per-run compliance verdicts from MLCommons' own checker (mlperf_logging.compliance_checker).

The official rules are data (``hpc_<ruleset>/*.yaml``) interpreted by
``mlp_compliance.ComplianceChecker``. `check_run` hands the records already parsed to the
checker's public ``check_loglines`` (as ``mlp_parser.LogLine`` tuples, the form it reads) and
collects its messages instead of letting it log them. The checker itself is not altered.

The checker re-reads its rule files for every log (about 17 ms a log), so a round of a thousand
logs takes about 20 s; verdicts are therefore cached by the SHA-256 of the log's bytes, the
ruleset and the mlperf-logging version, in memory and on disk (``$MLHPC_CACHE_DIR``, else
``$XDG_CACHE_HOME/mlhpc``, else ``~/.cache/mlhpc``; a cache that cannot be written is skipped).
An unchanged log is checked once.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path

from mlhpc import rules
from mlhpc.data.files import write_text_atomic
from mlhpc.data.inputs import read_text_input
from mlhpc.data.trees import make_private_dir
from mlhpc.errors import ConfigError, DataError
from mlhpc.log.parse import TOKEN, ParsedLog
from mlhpc.log.summary import official_start_stop

#: The ruleset mlhpc's own logs are checked against: `mlhpc.rules`' current one.
DEFAULT_RULESET = rules.ruleset().version
_ROUND_RE = re.compile(r"(?:^|[_\-/])v(\d+)\.(\d+)(?:$|[_\-/])")
_lock = threading.Lock()
_memory: dict[tuple[str, str, str], "Verdict"] = {}


@dataclass(frozen=True)
class Verdict:
    """The checker's verdict on one log: ``ok`` and its messages (empty when ok)."""

    ok: bool
    ruleset: str
    messages: tuple[str, ...] = ()


@functools.lru_cache(maxsize=1)
def supported_rulesets() -> tuple[str, ...]:
    """The rulesets of `mlhpc.rules.RULESETS` for which the installed mlperf_logging ships hpc
    compliance rules (``compliance_checker/hpc_<ruleset>/common.yaml``): 1.0.0, 2.0.0 and 3.0.0
    with mlperf-logging 4.1 (none for 0.7.0: the v0.7 round had no hpc rules there)."""
    from mlhpc.log.mlperf_adapter import rules_dir

    return tuple(v for v in rules.RULESETS if (rules_dir(v) / "common.yaml").is_file())


@functools.lru_cache(maxsize=1)
def mlperf_logging_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("mlperf-logging")
    except PackageNotFoundError:
        return "?"


def round_of(path: Path | str) -> str | None:
    """The round named in ``path`` (``hpc_results_v1.0`` -> ``"v1.0"``), else ``None``."""
    for part in reversed(Path(path).parts):
        match = _ROUND_RE.search("/" + part + "/")
        if match:
            return f"v{int(match.group(1))}.{int(match.group(2))}"
    return None


def ruleset_of_round(round_: str | None) -> str | None:
    """The hpc ruleset mlperf_logging ships for a round (``"v2.0"`` -> ``"2.0.0"``); ``None`` for
    a round it has no rules for (v0.7). ``None`` round: mlhpc's own logs, `DEFAULT_RULESET`."""
    if round_ is None:
        return DEFAULT_RULESET
    candidate = round_.lstrip("v") + ".0"
    return candidate if candidate in supported_rulesets() else None


def not_checked_reason(round_: str | None) -> str:
    return f"not checked: no ruleset for round {round_} in mlperf-logging {mlperf_logging_version()}"


def ruleset_for(path: Path | str, override: str | None = None) -> str | None:
    """The hpc ruleset a log is checked against.

    ``override`` wins; otherwise the round named in the path (``hpc_results_v1.0`` -> ``1.0.0``,
    ``v2.0`` -> ``2.0.0``; ``v0.7`` -> ``None``: mlperf_logging ships no hpc ruleset for it);
    otherwise `DEFAULT_RULESET` (the rules mlhpc's own logs follow).

    Raises:
        ConfigError: ``override`` is not one of `supported_rulesets`.
    """
    if override is not None:
        if override not in supported_rulesets():
            raise ConfigError(f"--ruleset {override}: expected one of {', '.join(supported_rulesets())}")
        return override
    return ruleset_of_round(round_of(path))


@dataclass(frozen=True)
class FolderCheck:
    """How a result folder's logs are checked, decided once per folder.

    Attributes:
        enabled: run the compliance checker on each log (result_summarizer does).
        ruleset: the hpc ruleset (`ruleset_for`); ``None``: mlperf_logging has none for the round.
        note: why there is none (`not_checked_reason`), else ``None``.
    """

    enabled: bool
    ruleset: str | None
    note: str | None = None


def folder_check(folder: Path, round_: str | None, v07: bool, override: str | None,
                 enabled: bool) -> FolderCheck:
    """The `FolderCheck` of ``folder``: `ruleset_for` its path and ``override``, except that a
    folder of the v0.7 layout (no strong/weak level) has none unless ``override`` names one.
    ``round_``: the round folder the layout names (``hpc_results_v0.7``), for the note.

    Raises:
        ConfigError: ``override`` is not one of `supported_rulesets`.
    """
    ruleset = None if v07 and override is None else ruleset_for(folder, override)
    if ruleset is not None:
        return FolderCheck(enabled, ruleset)
    return FolderCheck(enabled, None, not_checked_reason(round_of(round_ or "") or round_))


@dataclass(frozen=True)
class RunCheck:
    """One log's verdict as result_summarizer takes it.

    Attributes:
        compliant: the checker's verdict (``None``: not checked).
        messages: the checker's messages, or why the log was not checked.
        drop: why the run does not count (compliance, parse error, run_start or run_stop
            missing), else ``None``.
    """

    compliant: bool | None
    messages: tuple[str, ...]
    drop: str | None


def run_check(parsed: ParsedLog, check: FolderCheck) -> RunCheck:
    """`check_run` of one log under ``check`` and the reason result_summarizer drops it, if it
    does: fails compliance, has a malformed record line, lacks run_start or run_stop
    (``_query_run_start_stop``); the first of these that applies. Never raises."""
    compliant, messages, reason = None, (), None
    if check.enabled and check.ruleset is not None:
        verdict = check_run(parsed, check.ruleset)
        compliant, messages = verdict.ok, verdict.messages
        if not verdict.ok:
            reason = "fails compliance: " + (verdict.messages[0] if verdict.messages else "?")
    elif check.enabled:
        messages = (check.note or "",)
    start, stop = official_start_stop(parsed.events)
    if reason is None and parsed.malformed:
        reason = f"parse error: {parsed.malformed[0].message}"
    if reason is None and start is None:
        reason = "run_start not recorded"
    if reason is None and stop is None:
        reason = "run_stop not recorded"
    return RunCheck(compliant, messages, reason)


def _cache_dir() -> Path:
    if os.environ.get("MLHPC_CACHE_DIR"):
        return Path(os.environ["MLHPC_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mlhpc"


def _disk_path(key: tuple[str, str, str]) -> Path:
    digest, ruleset, version = key
    return _cache_dir() / f"compliance-hpc-{ruleset}-mlperf-logging-{version}" / f"{digest}.json"


def _load(key: tuple[str, str, str]) -> Verdict | None:
    try:
        data = json.loads(read_text_input(_disk_path(key), what="compliance verdict"))
        return Verdict(ok=bool(data["ok"]), ruleset=key[1], messages=tuple(str(m) for m in data["messages"]))
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None


def _store(key: tuple[str, str, str], verdict: Verdict) -> None:
    path = _disk_path(key)
    try:
        make_private_dir(path.parent, ConfigError, "compliance cache")
        write_text_atomic(path, json.dumps({"ok": verdict.ok, "messages": list(verdict.messages)}))
    except (OSError, ConfigError):
        pass


def check_run(parsed: ParsedLog, ruleset: str = DEFAULT_RULESET) -> Verdict:
    """Run MLCommons' compliance checker (``hpc_<ruleset>/common.yaml``) on one parsed log.

    Follows ``mlp_compliance.ComplianceChecker.check_file`` as result_summarizer and
    package_checker call it (``quiet=True, werror=False``): a log with a malformed record line
    fails ("Log lines had parsing errors."), then every rule file is applied.

    Args:
        parsed: the log, from `mlhpc.log.parse.parse_log`.
        ruleset: ``"1.0.0"``, ``"2.0.0"`` or ``"3.0.0"``.

    Returns:
        a `Verdict`; never raises for a bad log (the checker's own failures become messages).
        Cached by the log's SHA-256 (`ParsedLog.sha256`), the ruleset and mlperf-logging's version.
    """
    key = (parsed.sha256, ruleset, mlperf_logging_version())
    on_disk = bool(parsed.sha256) and os.path.isfile(parsed.path)  # logs read from files only
    if parsed.sha256:
        cached = _memory.get(key) or (_load(key) if on_disk else None)
        if cached is not None:
            _memory[key] = cached
            return cached
    verdict = _check(parsed, ruleset)
    if parsed.sha256:
        _memory[key] = verdict
        if on_disk:
            _store(key, verdict)
    return verdict


def _check(parsed: ParsedLog, ruleset: str) -> Verdict:
    from mlhpc.log.mlperf_adapter import compliance_checker

    mlp_compliance, LogLine = compliance_checker()

    lines = [LogLine(TOKEN + "{...}", e.time_ms, e.key, {"value": e.value, "metadata": e.metadata},
                     e.record_index) for e in parsed.events]
    with _lock:  # the checker keeps its queue of rule files in a module global
        mlp_compliance.enqueued_configs.clear()
        checker = mlp_compliance.make_checker(usage="hpc", ruleset=ruleset, quiet=True, werror=False)
        if parsed.malformed:
            checker.put_message("Log lines had parsing errors.")
        try:
            checker.check_loglines(lines, f"hpc_{ruleset}/common.yaml")
        except Exception as exc:  # the checker evaluates rule code; report, never crash
            checker.put_message(f"compliance checker failed: {type(exc).__name__}: {exc}")
        messages = (*checker.overwritable.values(), *checker.not_overwritable)
        mlp_compliance.enqueued_configs.clear()
    first_lines = tuple(str(m).splitlines()[0] if str(m) else "" for m in messages)
    return Verdict(ok=not messages, ruleset=ruleset, messages=first_lines)
