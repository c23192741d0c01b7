"""The references file of ``mlhpc results check --references`` as ReFrame's ``reference`` table.

One file says what "as fast as before" means for both: `mlhpc.store.check.load_references` reads
it (system -> benchmark -> figure -> ``[value, lower, upper, unit]``, ``lower``/``upper`` as
fractions of ``value``, as ReFrame keeps them), and `reference_table` hands the entries of one
benchmark to ReFrame under the same system keys. A key ``daint:gpu`` is one ReFrame partition, a
key ``daint`` every partition of that system, ``*`` every system (ReFrame's scoping); the checks
log ``submission_platform`` as the partition's full name, so ``mlhpc results check`` finds the
same runs under the same key.

Figures map to the checks' performance variables in ReFrame's units:

=====================  ===================  =========
file figure            ReFrame variable     unit
=====================  ===================  =========
``time_to_train_s``    ``time_to_train``    min
``samples_per_s``      ``throughput``       samples/s
``energy_to_train_j``  ``energy_to_train``  kJ
=====================  ===================  =========

``mlhpc results check`` calls a figure outside its bounds on the better side "improved" and
passes it; ReFrame would fail it. So that one file gives one verdict, the bound on the better
side (``lower`` of a time or energy, ``upper`` of a throughput) is left out of ReFrame's table:
both fail a run only when it is worse than the bound.
"""

from __future__ import annotations

from pathlib import Path

from mlhpc.store.check import FIGURES, load_references

#: file figure -> (ReFrame performance variable, its unit, factor from the stored unit to it)
PERF_VARIABLES: dict[str, tuple[str, str, float]] = {
    "time_to_train_s": ("time_to_train", "min", 1 / 60.0),
    "samples_per_s": ("throughput", "samples/s", 1.0),
    "energy_to_train_j": ("energy_to_train", "kJ", 1e-3),
}

Entry = tuple[float, "float | None", "float | None", str]


def reference_table(path: Path | str, benchmark: str) -> dict[str, dict[str, Entry]]:
    """ReFrame's ``reference`` for ``benchmark`` from the references file at ``path``.

    Args:
        path: a references file (docs/store.md, "check").
        benchmark: the MLPerf benchmark name the run logged (``submission_benchmark``).

    Returns:
        ``{system key: {performance variable: (value, lower, upper, unit)}}`` in the units of
        `PERF_VARIABLES`, the better-side bound dropped (module docstring); empty when the file
        names no reference for ``benchmark``.

    Raises:
        mlhpc.errors.ConfigError: the file is unreadable, not YAML or malformed (one line naming
            the file and the entry, as ``mlhpc results check`` says it).
    """
    table: dict[str, dict[str, Entry]] = {}
    for ref in load_references(Path(path)):
        if ref.benchmark != benchmark:
            continue
        name, unit, factor = PERF_VARIABLES[ref.figure]
        lower_better = FIGURES[ref.figure][1] == "lower"
        lower, upper = (None, ref.upper) if lower_better else (ref.lower, None)
        table.setdefault(ref.system, {})[name] = (ref.value * factor, lower, upper, unit)
    return table
