"""ReFrame checks that drive ``mlhpc run`` and ``mlhpc stage`` and judge them by the run's own
files (the extra ``mlhpc[reframe]``, ReFrame 4.7 or later; docs/reframe.md).

A centre points ReFrame at the installed checks, nothing copied by hand::

    reframe -C "$(python -m mlhpc.reframe --config laptop)" -c "$(python -m mlhpc.reframe)" -r

Modules, one job each:

- `verdict`: the check's sanity and performance figures, from the run's exit status, its result
  log and side files, through `mlhpc report`'s own reader and the official compliance checker
  (`mlhpc.report.score.score_folder`), so ReFrame and ``mlhpc report`` cannot disagree;
- `references`: the references file ``mlhpc results check --references`` reads
  (`mlhpc.store.check`) as ReFrame's ``reference`` table, per ``system:partition``;
- `base`: the ReFrame test classes (``MlhpcRunBase``, ``MlhpcStageBase``), the only module that
  imports ReFrame;
- ``checks/mlhpc_checks.py``: the file ReFrame loads (``-c``), registering the two checks;
- ``config/laptop.yaml``, ``config/slurm.yaml``: example ReFrame configurations.

Nothing here imports ReFrame but `base` and the checks file, so the paths below are found with
only mlhpc installed.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The checks file to give ``reframe -c``.
CHECKS_FILE = HERE / "checks" / "mlhpc_checks.py"
#: The example ReFrame configurations, by name (``reframe -C``).
CONFIGS = {path.stem: path for path in sorted((HERE / "config").glob("*.yaml"))}

__all__ = ["CHECKS_FILE", "CONFIGS", "HERE"]
