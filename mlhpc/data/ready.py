"""A run's data ready before anything reads them: the embedded dataset synthesised when missing
or interrupted (`mlhpc.data.embedded.synthesize`), a synthesised one checked against its
manifest and the config's settings, a user's own dataset checked for its split folders.
Used by ``mlhpc run``, ``mlhpc profile``, ``mlhpc validate`` and ``mlhpc automl``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from mlhpc.data.embedded import (
    _first_difference,
    _settings,
    changed_message,
    check_complete,
    describe,
    synth_manifest,
    synthesize,
)
from mlhpc.data.files import is_part_file
from mlhpc.data.formats import splits_of
from mlhpc.data.manifest import require_complete
from mlhpc.data.synthwatch import ProgressFn
from mlhpc.errors import DataError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime
    from mlhpc.workload import Workload


def ensure_source(config: "Config", workload: "Workload", world: "Runtime", progress: ProgressFn) -> float:
    """`ensure_data` on ``data.path``, unless the source is gone and every node
    already holds its complete staged copy (`mlhpc.data.stage.staged_copy_present`): a run after a
    separate ``mlhpc stage`` step then needs no source (and synthesises none). Every rank of the
    job (``world``) takes the same branch. Returns the seconds spent synthesising."""
    from mlhpc import runtime
    from mlhpc.data import stage as staging  # the staging package reads datasets this module makes

    present = (not Path(config.data.path).exists()
               and staging.staged_copy_present(config, world))
    if runtime.all_reduce([float(not present)], world, op="max")[0] == 0.0:
        return 0.0
    seconds = ensure_data(config, workload, world, progress)
    if world.is_main and seconds > 0:
        progress({"kind": "synthesised", "path": str(config.data.path), "seconds": seconds})
    return seconds


def ensure_data(config: "Config", workload: "Workload", rt: "Runtime",
                on_progress: ProgressFn | None = None) -> float:
    """Make sure ``config.data.path`` holds a complete dataset before anything reads it;
    synthesise the embedded one when it is missing or was interrupted, and
    ``data.synthesize_if_missing`` allows it. Data that no longer match their synthesis manifest
    are refused, never deleted.

    Rank 0 writes (telling ``on_progress`` what it is about to make, a ``synthesis`` event, then
    what it does: `SynthWatch`); every rank first
    looks, then waits, then checks the result. A folder without a record that holds data (a real
    dataset) is used as it is; so is a complete synthesis under a config that may not synthesise
    (``data.synthesize_if_missing: false``), whatever its settings: a reference config reading a
    fraction of its data set made by ``mlhpc data synth --fraction``.

    Returns:
        Seconds spent synthesising (0.0 when the data were there).

    Raises:
        DataError: the data changed since their synthesis; or are missing or interrupted and
            synthesis is not allowed (the message says which and names the folder); synthesised with other settings; a split
            folder (train/, validation/) is missing or empty; the folder cannot be written.
        ConfigError: ``data.synth_seed`` outside what synthesis accepts.
    """
    from mlhpc import runtime

    path = Path(config.data.path)
    runtime.barrier(rt)  # every rank looks before rank 0 may start writing ...
    state = describe(path)
    if state == "unmarked":  # a folder made by data convert / prepare must carry its manifest
        require_complete(path, DataError, resume="the mlhpc data convert or prepare command that "
                                                 "made it, with the same arguments")
    # a config that may synthesise wants its own settings; one that may not (a reference config
    # reading data made by `mlhpc data synth --fraction`) uses a complete folder as it is
    if state == "complete" and config.data.synthesize_if_missing:  # every rank: all raise together
        record = synth_manifest(path) or {}
        differs = _first_difference(record, _settings(workload.name, config.synth, config.data.synth_seed))
        if differs:
            raise DataError(f"{path}: data were synthesised with {differs}; delete the folder or "
                            "choose another data.path")
    runtime.barrier(rt)  # ... so all ranks agree on `state`
    start = time.perf_counter()
    if state == "changed":  # never deleted, never rewritten
        raise DataError(changed_message(path, str(check_complete(path, synth_manifest(path) or {}))))
    work = state in ("missing", "interrupted", "empty")
    if work:
        if not config.data.synthesize_if_missing:
            reason = {"missing": "dataset folder not found (expected train/ and validation/)",
                      "empty": "dataset folder is empty",
                      "interrupted": "an interrupted synthesis (partial files, no manifest)",
                      }[state]
            raise DataError(f"{path}: {reason}; set data.synthesize_if_missing: true to "
                            "synthesise it, or data.path")
        if rt.is_main:
            _synthesize(config, workload, state, on_progress)
        runtime.barrier(rt)
    _require_splits(path, workload, state)
    return time.perf_counter() - start if work else 0.0


def _synthesize(config: "Config", workload: "Workload", state: str, on_progress: ProgressFn | None) -> None:
    """Rank 0's synthesis of ``data.path``, said first (a ``synthesis`` event: what is about to
    be made, and how big)."""
    path = Path(config.data.path)
    if on_progress is not None:
        counts = config.synth.model_dump() if config.synth is not None else {}
        on_progress({"kind": "synthesis", "path": str(path), "state": state, "workload": workload.name,
                     "samples": {k: v for k, v in counts.items() if k.endswith("_samples")}})
    synthesize(path, workload, config.synth, config.data.synth_seed, on_progress)


def _holds_files(folder: Path) -> bool:
    """A data file in ``folder`` or in one of its sub-folders (a dataset may group its files,
    e.g. structures and alignments); a linked sub-folder is not entered."""
    def files(where: Path) -> bool:
        return any(p.is_file() and not is_part_file(p.name) for p in where.iterdir())
    return files(folder) or any(p.is_dir() and not p.is_symlink() and files(p)
                                for p in folder.iterdir())


def _split_names(path: Path, workload: "Workload", state: str) -> tuple[str, ...]:
    """The split folders of ``path`` as the workload's data tools name them (``find_splits``: a
    dataset laid out as its reference lays it out, e.g. ``train/`` and ``val_id/``), or the
    names it writes (`splits_of`) where the tools find none in data of mlhpc's own. Raises the
    tools' DataError for a user's (``unmarked``) folder they cannot split."""
    tools = workload.data_tools
    if tools is not None and path.is_dir():
        try:
            return tuple(tools.find_splits(path))
        except DataError:
            if state == "unmarked":
                raise
    return splits_of(tools)


def _require_splits(path: Path, workload: "Workload", state: str) -> None:
    """Raises DataError when a split folder of ``path`` (`_split_names`) is missing or holds no
    data file."""
    for split in _split_names(path, workload, state):
        folder = path / split
        if not folder.is_dir() or not _holds_files(folder):
            hint = ""
            if state == "unmarked" and not folder.exists():  # someone's own data, not ours
                hint = (f"; a folder of raw data (e.g. whole simulated universes) is made into "
                        f"its split folders by `mlhpc data prepare {workload.name} {path} DST`")
            names = " and ".join(f"{s}/" for s in splits_of(workload.data_tools))
            raise DataError(f"{folder}: dataset folder is missing or empty "
                            f"(expected {names} with data files){hint}")
