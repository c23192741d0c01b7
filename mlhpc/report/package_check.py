"""MLCommons' package checker run on a submission package (`mlhpc.report.package`).

`check_package` runs ``python -m mlperf_logging.package_checker ORG hpc <ruleset>`` (default
`mlhpc.rules`' current one, 3.0.0) on a scratch copy (the checker writes ``scaling.json`` into
what it checks), as a submitter would: without ``--rcp-bypass`` unless asked, and the result
records which. The verdict is the checker's own.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc import rules
from mlhpc.log.mlperf_adapter import package_checker_command

if TYPE_CHECKING:
    from mlhpc.report.package import PackageResult

SUCCESS_LINE = "PACKAGE CHECKER FOUND NO ERRORS, SUCCESS"


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
