"""Reference convergence point (RCP) verdicts, taken from MLCommons' own rcp_checker.

mlperf_logging is the authority on RCPs. `check_folder` calls the checker's public entry point
``mlperf_logging.rcp_checker.rcp_checker.check_directory`` exactly as ``package_checker`` and
``result_summarizer`` call it (usage ``hpc``, ``rcp_pass="pruned_rcps"``, no bypass), but with
``set_scaling=False``, so it reads the folder and writes nothing. Its verdict, message and
normalisation factor are returned as they are; the figures shown beside them (the RCP mean, the
smallest mean a submission may show, the submission's mean) are the ones the checker itself logs
while it decides ("RCP Record: ...", "Submission mean epochs: ..."), and the submission's epochs
come from its public ``get_submission_epochs``, as result_summarizer reads them. mlhpc computes
nothing here: it presents.

When no verdict applies the reason says why, and no factor is applied:

- open division: the official tools run no RCP check on open results (package_checker and
  result_summarizer: ``division == 'closed'``);
- a round for which mlperf_logging ships no hpc ruleset (v0.7: its rules had no RCPs);
- a benchmark without an RCP file in that ruleset.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.report.compliance import mlperf_logging_version
from mlhpc.log.parse import log_sha256

RCP_PASS = "pruned_rcps"
_lock = threading.Lock()
_cache: dict[tuple[Any, ...], "RcpVerdict"] = {}


@dataclass(frozen=True)
class RcpVerdict:
    """rcp_checker's verdict on one result folder.

    Attributes:
        passed: the checker's verdict; ``None`` when no check applies (``message`` says why).
        message: the checker's own message (``"RCP found"``, ``"RCP Interpolation"``,
            ``"Insufficient convergence"``, ``"RCP not found but slower convergence on smaller
            batch size"``, ``"Missing RCP, please submit RCP with BS = 8"``, ...), or
            ``"not checked: <reason>"``.
        normalization: the factor the checker computes (``RCP mean / submission mean`` when the
            runs converge faster than the RCP mean, else 1.0); the factor a score is multiplied by
            when the checker writes ``scaling.json``.
        global_batch_size: as the checker read it (``None`` when not checked).
        mean_epochs: olympic mean of the runs' epochs (samples for OpenFold) to converge, as the
            checker and result_summarizer compute it; ``None`` with more than one run not
            converged, or fewer than three runs.
        rcp_mean_epochs / rcp_min_epochs: the RCP the checker compared with (exact, interpolated
            or the smallest batch size's), its mean and ``mean / max speed-up``; ``None`` when it
            compared with none.
    """

    passed: bool | None
    message: str
    normalization: float = 1.0
    global_batch_size: int | None = None
    mean_epochs: float | None = None
    rcp_mean_epochs: float | None = None
    rcp_min_epochs: float | None = None
    epochs: tuple[float, ...] = field(default=(), repr=False)

    @property
    def label(self) -> str:
        """``pass``/``FAIL`` with the checker's message, or the reason it was not checked."""
        if self.passed is None:
            return self.message
        return f"{'pass' if self.passed else 'FAIL'}: {self.message}"


def rcp_rulesets() -> tuple[str, ...]:
    """The hpc rulesets for which the installed mlperf_logging ships RCP files."""
    from mlhpc.log import mlperf_adapter

    return mlperf_adapter.rcp_rulesets()


def has_rcps(benchmark: str | None, ruleset: str) -> bool:
    """mlperf_logging ships ``hpc_<ruleset>/rcps_<benchmark>.json``."""
    from mlhpc.log import mlperf_adapter

    return bool(benchmark) and (mlperf_adapter.rcp_dir(ruleset) / f"rcps_{benchmark}.json").is_file()


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _fingerprint(files: list[Path]) -> tuple[tuple[str, str], ...]:
    return tuple((f.name, log_sha256(f)) for f in files)


def _olympic(epochs: list[float]) -> float | None:
    ordered = sorted(epochs)[1:-1]
    return float(sum(ordered) / len(ordered)) if ordered else None


def _not_checked(benchmark: str | None, ruleset: str | None, division: str | None) -> RcpVerdict | None:
    """The verdict when no RCP check applies (open division, no RCPs for the round or the
    benchmark), else None."""
    if division == "open":
        return RcpVerdict(None, "not checked: open division (the official tools check closed results only)")
    if ruleset is None or ruleset not in rcp_rulesets():
        return RcpVerdict(None, f"not checked: no RCPs for this round in mlperf-logging {mlperf_logging_version()}")
    if not has_rcps(benchmark, ruleset):
        return RcpVerdict(None, f"not checked: no RCPs for {benchmark or 'an unnamed benchmark'} in hpc "
                                f"{ruleset} (mlperf-logging {mlperf_logging_version()})")
    return None


def _run_checker(folder: Path, ruleset: str) -> tuple[tuple[Any, Any, Any], tuple[Any, Any], list[logging.LogRecord]]:
    """``check_directory``'s ``(passed, message, normalization)``, ``get_submission_epochs``'
    ``(global batch size, epochs)`` and the log records the checker wrote meanwhile (the root
    logger is swapped under a lock, as the checker logs through it)."""
    from mlhpc.log.mlperf_adapter import rcp_checker as adapter_rcp

    rcp_checker = adapter_rcp()

    capture = _Capture()
    root = logging.getLogger()
    with _lock:
        saved_handlers, saved_level = root.handlers[:], root.level
        root.handlers[:] = [capture]
        root.setLevel(logging.INFO)
        try:
            checked = rcp_checker.check_directory(
                str(folder), "hpc", ruleset, False, False, rcp_pass=RCP_PASS, rcp_bypass=False,
                set_scaling=False)
            gbs, epochs, _ = rcp_checker.get_submission_epochs(
                [str(f) for f in sorted(folder.glob("result_*.txt"))], ruleset, False)
        finally:
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
    return checked, (gbs, epochs), capture.records


def _verdict(checked: tuple[Any, Any, Any], submission: tuple[Any, Any],
             records: list[logging.LogRecord]) -> RcpVerdict:
    """The checker's results as an `RcpVerdict`, with the figures it logged while deciding."""
    passed, message, norm = checked
    gbs, epochs = submission
    record: dict[str, Any] | None = None
    mean = None
    for rec in records:
        if rec.msg == " RCP Record: %s" and rec.args:
            record = rec.args[0] if isinstance(rec.args, tuple) else rec.args  # type: ignore[assignment]
        elif rec.msg == " Submission mean epochs: %.4f" and rec.args:
            mean = float(rec.args[0])  # type: ignore[index]
    converged = [float(e) for e in epochs] if epochs else []
    if mean is None and converged:
        mean = _olympic(converged)
    if mean is not None and not math.isfinite(mean):
        mean = None
    rcp_mean = rcp_min = None
    if isinstance(record, dict) and "RCP Mean" in record:
        rcp_mean = float(record["RCP Mean"])
        rcp_min = rcp_mean / float(record["Max Speedup"])
    return RcpVerdict(bool(passed), str(message), float(norm),
                      None if gbs in (None, -1) else int(gbs), mean, rcp_mean, rcp_min, tuple(converged))


def check_folder(folder: Path | str, *, benchmark: str | None, ruleset: str | None,
                 division: str | None, files: list[Path] | None = None) -> RcpVerdict:
    """rcp_checker's verdict on the ``result_*.txt`` files of ``folder``.

    Args:
        folder: a result folder (read, never written).
        benchmark / division: from the logs (``submission_benchmark``/``submission_division``).
        ruleset: the hpc ruleset of the round (``None``: the round has none in mlperf_logging).
        files: the folder's result files (for the cache key; default: ``result_*.txt``).

    Returns:
        an `RcpVerdict`; never raises for a bad or missing folder (the reason is the message).
        Verdicts are cached in-process by the files' content hashes.
    """
    skipped = _not_checked(benchmark, ruleset, division)
    if skipped is not None:
        return skipped
    assert ruleset is not None  # _not_checked returns a verdict without one
    folder = Path(folder)
    files = sorted(files if files is not None else folder.glob("result_*.txt"))
    try:
        key = (str(folder.resolve()), ruleset, _fingerprint(files))
    except OSError:
        key = None
    if key is not None and key in _cache:
        return _cache[key]
    from mlhpc.log.parse import MAX_RECORD_CHARS, oversize_line

    for path in files:  # the checker's regular expressions would run for minutes over such a line
        too_long = oversize_line(path)
        if too_long is not None:
            return RcpVerdict(None, f"not checked: {path.name} {too_long}, over the "
                                    f"{MAX_RECORD_CHARS} an MLLOG record may hold")
    try:
        checked, submission, records = _run_checker(folder, ruleset)
    except Exception as exc:  # the checker raises bare exceptions on unreadable folders
        return RcpVerdict(False, f"rcp_checker failed: {type(exc).__name__}: {exc}")
    verdict = _verdict(checked, submission, records)
    if key is not None:
        _cache[key] = verdict
    return verdict
