"""The workload registry: benchmark name -> `mlhpc.workload.Workload`.

Workloads are found through the ``mlhpc.workloads`` entry-point group, so a third-party package
adds one by declaring ``[project.entry-points."mlhpc.workloads"] name = "pkg.module:WORKLOAD"``.
The two MLPerf HPC workloads shipped here are registered the same way.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from mlhpc.errors import ConfigError
from mlhpc.workload import Workload

ENTRY_POINT_GROUP = "mlhpc.workloads"
_REGISTERED: dict[str, Workload] = {}


def register(workload: Workload) -> None:
    """Register ``workload`` in this process (benchmarks, tests, notebooks); entry points are the
    way for installed packages."""
    _REGISTERED[workload.name] = workload


def names() -> list[str]:
    """Sorted names of every registered workload."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)} | set(_REGISTERED))


def get(name: str) -> Workload:
    """The workload registered as ``name``.

    Raises:
        ConfigError: no workload of that name is registered (the message lists the known ones).
    """
    if name in _REGISTERED:
        return _REGISTERED[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            workload = ep.load()
            if not isinstance(workload, Workload):
                raise ConfigError(f"workload {name!r}: entry point {ep.value} is not a Workload")
            return workload
    raise ConfigError(f"workload: unknown workload {name!r}; known: {', '.join(names()) or 'none'}")
