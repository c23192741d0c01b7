"""The catalogue of workloads for ``mlhpc workloads``: each registered workload with its data
forms, metric and target, and the config files that name it. It reads config files, so it lives
with the config (the workload contract below reads no file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlhpc.config import read_yaml
from mlhpc.errors import ConfigError
from mlhpc.workload import DataTools, get, names, prepare_options


def describe(config_dirs: tuple[Path, ...] = (Path("configs"),)) -> list[dict[str, Any]]:
    """One dict per registered workload, sorted by name: ``name``, ``formats`` (the forms its data
    tools read), ``convert_to``, ``splits``, ``metric`` (key), ``target``, ``direction`` and
    ``configs`` (the YAML files under ``config_dirs`` whose ``workload:`` names it).

    Raises:
        ConfigError: as `get` (a broken entry point).
    """
    configs: dict[str, list[str]] = {}
    for folder in config_dirs:
        for path in sorted(Path(folder).glob("*.yaml")) if Path(folder).is_dir() else []:
            if path.is_symlink():
                continue  # a config is read where it is, never through a link
            try:
                name = read_yaml(path).get("workload")
            except ConfigError:
                continue
            if isinstance(name, str):
                configs.setdefault(name, []).append(str(path))
    rows = []
    for name in names():
        workload = get(name)
        tools = workload.data_tools or DataTools()
        rows.append({"name": name, "formats": list(tools.formats),
                     "convert_to": list(tools.convert_to), "splits": list(tools.splits),
                     "prepare_options": prepare_options(tools),
                     "metric": workload.metric.key, "target": workload.metric.target,
                     "direction": workload.metric.direction, "configs": configs.get(name, [])})
    return rows
