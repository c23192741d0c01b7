"""Embedded (synthetic) datasets that are complete or absent, never half-written.

A workload's ``synthesize(out_dir, synth_config, seed, progress)`` writes its official on-disk layout. This
module wraps it so that an interrupted synthesis (SIGKILL, a full disk, a node failure) can never
be trained or evaluated on:

1. synthesis writes into a hidden sibling folder ``.<name>.mlhpc-synth`` (same file system), with
   an intent record ``.mlhpc-intent.json`` (workload, seed, synth settings) written first;
2. leftover partial files (``.*.part``, ``.*.tmp-<pid>``: the per-file temporaries of the
   workloads' writers) are removed before it resumes, so they are never staged or read;
3. when ``synthesize`` returns, the marker ``.mlhpc-complete.json`` is written last, holding the
   workload, seed, synth settings and, per split folder and top-level file, the number of files
   and bytes; then the folder is renamed into place (one atomic ``rename``).

On use, a folder with a marker is checked against it (file and byte counts per split, and the
synth settings against the config's): a disagreement means mlhpc's own data were changed or
truncated, and they are synthesised again (or refused when ``data.synthesize_if_missing`` is
false). A folder without a marker that holds data -- a real dataset, a user's own files -- is
used as it is and never rewritten; one that holds the partial files of an interrupted mlhpc
writer is completed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from mlhpc.config import SEED_MAX
from mlhpc.data.files import is_part_file, write_text_atomic
from mlhpc.data.formats import splits_of
from mlhpc.data.inputs import read_text_input
from mlhpc.data.manifest import require_complete
from mlhpc.errors import ConfigError, DataError
from mlhpc.workload import SynthProgress

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime
    from mlhpc.workload import Workload

MARKER = ".mlhpc-complete.json"
INTENT = ".mlhpc-intent.json"
MARKER_FORMAT = 1
#: Synth settings that change how fast data are written, not which bytes.
NOT_CONTENT = frozenset({"workers"})
#: The longest a synthesis goes without a ``synth_progress`` event, in seconds.
TICK_S = 1.0

ProgressFn = Callable[[dict[str, Any]], None]


class SynthWatch(SynthProgress):
    """What a running synthesis has done, told to ``on_progress`` (None: nothing is watched).

    A workload's ``synthesize`` is handed this watch as its ``progress``
    (`mlhpc.workload.SynthProgress`): ``plan(n, b)`` before it writes its first sample (``n``
    samples about to be written, ``b`` their estimated size in bytes, or None), then ``done(k)``
    each time ``k`` more are written. A workload that says nothing is watched through the bytes
    under its output folder alone. A thread reports at
    least every `TICK_S` seconds, so a slow sample never leaves a log silent.

    Events: ``{"kind": "synth_plan", "path", "samples", "bytes"}``, then ``{"kind":
    "synth_progress", "path", "done", "samples", "bytes" (on disk now), "planned_bytes",
    "elapsed_s", "eta_s"}``; ``done``, ``samples``, ``planned_bytes`` and ``eta_s`` are None
    where the workload reports nothing to base them on.
    """

    def __init__(self, folder: Path, path: Path, on_progress: ProgressFn | None) -> None:
        self.folder, self.path, self.emit = Path(folder), Path(path), on_progress
        self.samples: int | None = None
        self.planned_bytes: int | None = None
        self.done_samples: int | None = None
        self._planned = False
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "SynthWatch":
        if self.emit is not None:
            self._thread = threading.Thread(target=self._tick, name="mlhpc-synth-progress",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def run(self, synthesize: Callable[..., None], synth: Any, seed: int) -> None:
        """``synthesize(folder, synth, seed, self)``."""
        synthesize(self.folder, synth, seed, self)

    def plan(self, samples: int, size_bytes: int | None = None) -> None:
        """The workload is about to write ``samples`` samples, about ``size_bytes`` bytes."""
        with self._lock:
            self.samples, self.done_samples = int(samples), 0
            self.planned_bytes = size_bytes
            self.start = time.monotonic()  # rates from here: set-up before is not writing
            self._planned = True
        self._emit({"kind": "synth_plan", "path": str(self.path.absolute()),
                    "samples": self.samples, "bytes": self.planned_bytes})

    def done(self, samples: int = 1) -> None:
        """``samples`` more are written."""
        with self._lock:
            self.done_samples = (self.done_samples or 0) + int(samples)
        self.report()

    def report(self) -> None:
        """One ``synth_progress`` event: samples done, bytes on disk, elapsed, remaining (after
        a ``synth_plan`` of unknown size when the workload has announced none)."""
        if not self._planned:
            self._planned = True
            self._emit({"kind": "synth_plan", "path": str(self.path.absolute()), "samples": None,
                        "bytes": None})
        with self._lock:
            elapsed_s = time.monotonic() - self.start
            written = _bytes_under(self.folder)
            eta_s = None
            if self.samples is not None:  # from the samples written, once there are some
                eta_s = (elapsed_s * (self.samples - self.done_samples) / self.done_samples
                         if self.done_samples else None)
            elif self.planned_bytes and written:
                eta_s = max(0.0, elapsed_s * (self.planned_bytes - written) / written)
            self._emit({"kind": "synth_progress", "path": str(self.path.absolute()), "done": self.done_samples,
                        "samples": self.samples, "bytes": written,
                        "planned_bytes": self.planned_bytes, "elapsed_s": elapsed_s,
                        "eta_s": eta_s})

    def _emit(self, event: dict[str, Any]) -> None:
        if self.emit is not None:
            self.emit(event)

    def _tick(self) -> None:
        while not self._stop.wait(TICK_S):
            self.report()


def _bytes_under(folder: Path) -> int:
    """Bytes of the files under ``folder`` now (links not followed; files that vanish while
    counted, such as a renamed temporary, are skipped)."""
    total = 0
    for top, _dirs, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(top, name)).st_size
            except OSError:
                continue
    return total


def staging_folder(path: Path) -> Path:
    """The hidden sibling folder a synthesis of ``path`` writes into before it is renamed."""
    return path.parent / f".{path.name}.mlhpc-synth"


def _settings(workload: str, synth: Any, seed: int) -> dict[str, Any]:
    dumped = synth.model_dump(mode="json") if synth is not None else {}
    return {"workload": workload, "seed": seed,
            "synth": {k: v for k, v in dumped.items() if k not in NOT_CONTENT}}


def inventory(path: Path) -> dict[str, dict[str, int]]:
    """``{entry: {"files": n, "bytes": b}}`` for each split folder and top-level file of
    ``path`` (hidden names, such as the marker, excluded; files counted recursively).

    Raises:
        OSError: a folder cannot be listed.
    """
    counts: dict[str, dict[str, int]] = {}
    for entry in sorted(Path(path).iterdir()):
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            files = [p for p in entry.rglob("*") if p.is_file()]
            counts[entry.name] = {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}
        elif entry.is_file():
            counts[entry.name] = {"files": 1, "bytes": entry.stat().st_size}
    return counts


def _partial_files(path: Path) -> list[Path]:
    return [p for p in Path(path).rglob(".*") if p.is_file() and is_part_file(p.name)]


def read_marker(path: Path) -> dict[str, Any] | None:
    """The completion marker of dataset folder ``path``, or None when it has none or it is not
    a JSON object of the expected format."""
    try:
        marker = json.loads(read_text_input(Path(path) / MARKER, root=path, what="completion marker"))
    except (DataError, ValueError, RecursionError):
        return None
    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        return None
    return marker


def check_complete(path: Path, marker: dict[str, Any]) -> str | None:
    """Why the files under ``path`` disagree with its ``marker`` (one phrase), or None when they
    agree: every split folder and top-level file with the recorded file and byte counts."""
    try:
        found = inventory(path)
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    expected = marker.get("inventory") or {}
    if not any(want.get("files", 0) and name in found for name, want in expected.items()):
        return "the marker records no data folder"
    for name, want in expected.items():
        have = found.get(name)
        if have is None:
            return f"{name} is missing"
        if have != want:
            return (f"{name} holds {have['files']} files / {have['bytes']} bytes, the synthesis "
                    f"wrote {want['files']} files / {want['bytes']} bytes")
    extra = sorted(set(found) - set(expected))
    if extra:
        return f"{extra[0]} was not written by the synthesis"
    partial = _partial_files(path)
    if partial:
        return f"{partial[0].relative_to(path)} is a partial file"
    return None


def _first_difference(recorded: dict[str, Any], wanted: dict[str, Any]) -> str | None:
    for key in ("workload", "seed"):
        if recorded.get(key) != wanted[key]:
            return f"{key}={recorded.get(key)!r}, the config asks for {wanted[key]!r}"
    old, new = recorded.get("synth") or {}, wanted["synth"]
    for key in sorted(set(old) | set(new)):
        if key not in NOT_CONTENT and old.get(key) != new.get(key):
            return f"synth.{key}={old.get(key)!r}, the config asks for {new.get(key)!r}"
    return None


def check_seed(seed: Any) -> int:
    """``seed`` if it is an integer in ``0 .. 2**63 - 1`` (what `mlhpc.config` allows for
    ``train.seed``).

    Raises:
        ConfigError: any other value (the message names the seed).
    """
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        raise ConfigError(f"seed {seed!r}: must be an integer within 0 .. {SEED_MAX}")
    return seed


@contextmanager
def _lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path``'s parent folder while ``path`` is synthesised
    (concurrent runs on one folder); the folder itself is locked, so no lock file is left."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _remove(path: Path) -> None:
    """Delete a folder mlhpc wrote: renamed aside first, so no half-deleted dataset is seen."""
    if not path.exists():
        return
    aside = path.parent / f".{path.name}.mlhpc-stale-{os.getpid()}"
    os.rename(path, aside)
    shutil.rmtree(aside)


def synthesize(path: Path, workload: "Workload", synth: Any, seed: int,
               on_progress: ProgressFn | None = None) -> bool:
    """Make ``path`` a complete embedded dataset of ``workload`` (synth settings ``synth``, seed
    ``seed``), marked as such. Used by `ensure_data` and ``mlhpc data synth``.

    ``on_progress`` receives the events of `SynthWatch` (``synth_plan`` before the first sample
    is written, then ``synth_progress`` at least every `TICK_S` seconds and after each batch of
    samples the workload reports) while anything is written.

    Nothing is done to a folder whose marker agrees with its files and with these settings. A
    marked folder whose files disagree with its marker is synthesised again from nothing. An
    unmarked folder is completed: moved into the hidden staging folder, its partial files
    removed, the missing files written by ``workload.synthesize`` (which keeps the files
    present), marked, and renamed back.

    Returns:
        True when anything was written, False when ``path`` was already complete.

    Raises:
        ConfigError: ``seed`` outside 0 .. 2**63 - 1 (checked before anything is written).
        DataError: ``path`` is marked as synthesised with other settings (names the first
            differing key), is not a folder, or cannot be written (names the folder).
    """
    seed = check_seed(seed)
    path = Path(path)
    wanted = _settings(workload.name, synth, seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path):
            if not _needs_synthesis(path, wanted):
                return False
            _synthesize_into_place(path, workload, synth, seed, wanted, on_progress)
    except OSError as exc:
        where = exc.filename or path
        raise DataError(f"{where}: cannot write the synthetic dataset "
                        f"({exc.strerror or exc})") from None
    return True


def _needs_synthesis(path: Path, wanted: dict[str, Any]) -> bool:
    """False when ``path`` is marked with the ``wanted`` settings and its files agree; a marked
    folder whose files changed is removed (mlhpc's own data), and True returned.

    Raises:
        DataError: ``path`` is a file, or is marked with other settings (the first differing key).
    """
    if path.exists() and not path.is_dir():
        raise DataError(f"{path}: data.path is a file, not a dataset folder")
    marker = read_marker(path) if path.is_dir() else None
    if marker is None:
        return True
    differs = _first_difference(marker, wanted)
    if differs:
        raise DataError(f"{path}: data were synthesised with {differs}; delete the "
                        "folder or choose another data.path")
    if check_complete(path, marker) is None:
        return False
    _remove(path)  # mlhpc's own data, changed since: synthesise afresh
    return True


def _synthesize_into_place(path: Path, workload: "Workload", synth: Any, seed: int,
                           wanted: dict[str, Any], on_progress: ProgressFn | None) -> None:
    """Write the dataset in the hidden staging folder beside ``path`` (completing an unmarked
    ``path`` moved there, or an interrupted synthesis with the same settings), mark it, and
    rename it to ``path``. Called under `_lock`; OSError propagates."""
    tmp = staging_folder(path)
    intent = _read_json(tmp / INTENT) if tmp.is_dir() else None
    if tmp.exists() and intent != wanted:
        _remove(tmp)  # a different, interrupted synthesis: start afresh
    adopted = path.is_dir()
    if adopted:  # unmarked (older mlhpc, interrupted, or the user's): complete it
        if tmp.exists():
            _remove(tmp)
        os.rename(path, tmp)
    tmp.mkdir(exist_ok=True)
    _write_json(tmp / INTENT, wanted)
    for leftover in _partial_files(tmp):
        leftover.unlink()
    try:
        with SynthWatch(tmp, path, on_progress) as watch:
            watch.run(workload.synthesize, synth, seed)
    except BaseException:
        if adopted and not path.exists():  # give the folder back where it was
            (tmp / INTENT).unlink(missing_ok=True)
            os.rename(tmp, path)
        raise
    for leftover in _partial_files(tmp):
        leftover.unlink()
    (tmp / INTENT).unlink()
    _write_json(tmp / MARKER, {"format": MARKER_FORMAT, **wanted, "inventory": inventory(tmp)})
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(read_text_input(path, root=path.parent, what="synthesis record"))
    except (DataError, ValueError, RecursionError):
        return None


def _write_json(path: Path, value: Any) -> None:
    write_text_atomic(path, json.dumps(value, indent=1, sort_keys=True, allow_nan=False) + "\n")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def describe(path: Path) -> str:
    """What ``path`` holds, for messages and `ensure_data`: ``"missing"``, ``"complete"``
    (marked and agreeing), ``"changed"`` (marked, files disagree), ``"interrupted"`` (no marker,
    partial files of an mlhpc writer, or an interrupted hidden synthesis folder beside it),
    ``"unmarked"`` (data without a marker: used as they are) or ``"empty"``."""
    path = Path(path)
    if not path.is_dir():
        return "interrupted" if staging_folder(path).is_dir() else "missing"
    marker = read_marker(path)
    if marker is not None:
        return "complete" if check_complete(path, marker) is None else "changed"
    if _partial_files(path):
        return "interrupted"
    if not any(p.is_file() for p in path.rglob("*") if not p.name.startswith(".")):
        return "empty"
    return "unmarked"


def ensure_data(config: "Config", workload: "Workload", rt: "Runtime",
                on_progress: ProgressFn | None = None) -> float:
    """Make sure ``config.data.path`` holds a complete dataset before anything reads it;
    synthesise the embedded one when it is missing, was interrupted, or (mlhpc's own) no longer
    matches its completion marker, and ``data.synthesize_if_missing`` allows it.

    Rank 0 writes (telling ``on_progress`` what it does: `SynthWatch`); every rank first
    looks, then waits, then checks the result. A folder without a marker that holds data (a real
    dataset) is used as it is.

    Returns:
        Seconds spent synthesising (0.0 when the data were there).

    Raises:
        DataError: the data are missing, interrupted or changed and synthesis is not allowed (the
            message says which and names the folder); synthesised with other settings; a split
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
    if state == "complete":  # every rank, so that all raise together
        marker = read_marker(path) or {}
        differs = _first_difference(marker, _settings(workload.name, config.synth, config.data.synth_seed))
        if differs:
            raise DataError(f"{path}: data were synthesised with {differs}; delete the folder or "
                            "choose another data.path")
    runtime.barrier(rt)  # ... so all ranks agree on `state`
    start = time.perf_counter()
    work = state in ("missing", "changed", "interrupted", "empty")
    if work:
        if not config.data.synthesize_if_missing:
            reason = {"missing": "dataset folder not found (expected train/ and validation/)",
                      "empty": "dataset folder is empty",
                      "changed": "files differ from the completion marker of the synthesis "
                                 f"({check_complete(path, read_marker(path) or {})})",
                      "interrupted": "an interrupted synthesis (partial files, no completion marker)",
                      }[state]
            raise DataError(f"{path}: {reason}; set data.synthesize_if_missing: true to "
                            "synthesise it, or data.path")
        if rt.is_main:
            synthesize(path, workload, config.synth, config.data.synth_seed, on_progress)
        runtime.barrier(rt)
    _require_splits(path, workload, state)
    return time.perf_counter() - start if work else 0.0


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
