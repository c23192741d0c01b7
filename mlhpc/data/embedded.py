"""Embedded (synthetic) datasets that are complete or absent, never half-written.

A workload's ``synthesize(out_dir, synth_config, seed, progress)`` writes its official on-disk layout. This
module wraps it so that an interrupted synthesis (SIGKILL, a full disk, a node failure) can never
be trained or evaluated on:

1. synthesis writes into a hidden sibling folder ``.<name>.mlhpc-synth`` (same file system),
   made new and private by mlhpc and claimed at once (`mlhpc.data.claims`, kind `SYNTH_KIND`),
   with an intent record ``.mlhpc-intent.json`` (workload, seed, synth settings) written first;
   each file put in place there is recorded as it lands (`mlhpc.data.statefiles.recording`): all
   that removing it may delete; a hidden folder of that name without a valid claim is never used
   or removed;
2. what unfinished writers left (files and folders under the project's temporary name,
   `mlhpc.data.files.part_path`; a workload writes its split folders through `splits_written`)
   is removed before it resumes, so it is never staged or read;
3. when ``synthesize`` returns, the folder's manifest (`mlhpc.data.manifest`, kind ``"synth"``,
   the completion record of every folder mlhpc writes) is written last, holding the
   workload, seed, synth settings and every file with its size and checksum; the folder is
   renamed into place (one atomic ``rename``; an empty folder of that name is replaced) and only
   then is its claim released (a finished dataset is the user's: mlhpc never deletes it), so the
   next synthesis finishes a folder whose rename failed rather than refuse it as not mlhpc's.

On use, a folder with a synthesis manifest is checked against it (file and byte counts per
split, and the synth settings against the config's): a disagreement (the data changed, were
truncated, or the user left files in it) is refused with one line naming the first difference;
the folder is never deleted or rewritten (move it away, and the next run synthesises afresh). A
folder without one that holds data -- a real dataset, a user's own files -- is used as it is and
never rewritten or adopted.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mlhpc.config import SEED_MAX
from mlhpc.data import manifest
from mlhpc.data.claims import (
    claim_problem,
    make_claimed_dir,
    release,
    remove_claimed,
    remove_leftovers,
    remove_own_part,
)
from mlhpc.data.files import checksum, is_part_file, part_path, reason, write_text_atomic
from mlhpc.data.formats import splits_of
from mlhpc.data.inputs import read_text_input
from mlhpc.data.manifest import require_complete
from mlhpc.data.statefiles import record_tree, recording
from mlhpc.data.synthwatch import ProgressFn, SynthWatch
from mlhpc.errors import ConfigError, DataError, MlhpcError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.runtime import Runtime
    from mlhpc.workload import Workload

INTENT = ".mlhpc-intent.json"
#: The manifest kind of a synthesised folder.
KIND = "synth"
#: The claim kind of the hidden folder a synthesis writes into (`mlhpc.data.claims`).
SYNTH_KIND = "synthesis"
#: Synth settings that change how fast data are written, not which bytes.
NOT_CONTENT = frozenset({"workers"})

def staging_folder(path: Path) -> Path:
    """The hidden sibling folder a synthesis of ``path`` writes into before it is renamed."""
    return path.parent / f".{path.name}.mlhpc-synth"


def _settings(workload: str, synth: Any, seed: int) -> dict[str, Any]:
    dumped = synth.model_dump(mode="json") if synth is not None else {}
    return {"workload": workload, "seed": seed,
            "synth": {k: v for k, v in dumped.items() if k not in NOT_CONTENT}}


def inventory(path: Path) -> dict[str, dict[str, int]]:
    """``{entry: {"files": n, "bytes": b}}`` for each split folder and top-level file of
    ``path`` (hidden names, such as the manifest, excluded; files counted recursively).

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
    """What unfinished writers left under ``path``: files and folders with the project's
    temporary name (`mlhpc.data.files.part_path`), outermost first (a link is listed, never
    followed)."""
    found = [p for p in Path(path).rglob(".*") if is_part_file(p.name)
             and (p.is_symlink() or p.is_file() or p.is_dir())]
    return sorted(found, key=lambda p: len(p.parts))


@contextmanager
def splits_written(out_dir: Path, splits: list[str]) -> Iterator[dict[str, Path]]:
    """Split folders written complete or absent, for a workload's ``synthesize``: yields
    ``{split: folder to write it in}``, each ``part_path(out_dir/split)`` (its bytes count under
    ``out_dir`` while written). A block that ends normally has every split renamed into place,
    all or none; otherwise the temporaries, any split renamed and an ``out_dir`` made here are
    removed. What a killed writer left, the next synthesis removes (`_partial_files`).

    Raises:
        OSError: a rename failed (nothing of the splits is left in place).
    """
    out_dir = Path(out_dir)
    made = not out_dir.exists()
    out_dir.mkdir(parents=True, exist_ok=True)
    temporary = {split: part_path(out_dir / split) for split in splits}
    moved: list[str] = []
    try:
        yield temporary
        for split in splits:
            os.rename(temporary[split], out_dir / split)
            moved.append(split)
            record_tree(out_dir / split)  # in place: counted as mlhpc's in a claimed folder
    except BaseException:
        for split in moved:  # back under this process's temporary name, then removed with it
            os.rename(out_dir / split, temporary[split])
        raise
    finally:
        for folder in temporary.values():
            remove_own_part(folder)
        if made and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # absent again after a failure, as it was


def synth_manifest(path: Path) -> dict[str, Any] | None:
    """The synthesis manifest of dataset folder ``path`` (`mlhpc.data.manifest.load`, kind
    `KIND`), or None when it has none, or a manifest another writer (convert, prepare, stage)
    wrote."""
    doc = manifest.load(Path(path))
    if doc is None or doc.get("kind") != KIND:
        return None
    return doc


def recorded_inventory(doc: dict[str, Any]) -> dict[str, dict[str, int]]:
    """`inventory` as a synthesis manifest ``doc`` records it: per split folder and top-level
    file, its files and bytes."""
    counts: dict[str, dict[str, int]] = {}
    for entry in doc.get("files") or []:
        top = entry["path"].split("/", 1)[0]
        have = counts.setdefault(top, {"files": 0, "bytes": 0})
        have["files"] += 1
        have["bytes"] += entry["bytes"]
    return counts


def _entries(path: Path) -> list[dict[str, Any]]:
    """The manifest entries (path, bytes, xxh3_128) of every file `inventory` counts."""
    found = []
    for entry in sorted(Path(path).iterdir()):
        if entry.name.startswith("."):
            continue
        files = [p for p in entry.rglob("*") if p.is_file()] if entry.is_dir() else [entry]
        for file in sorted(files):
            found.append({"path": file.relative_to(path).as_posix(),
                          "bytes": file.stat().st_size, "xxh3_128": checksum(file)})
    return found


def check_complete(path: Path, record: dict[str, Any]) -> str | None:
    """Why the files under ``path`` disagree with its synthesis manifest ``record`` (one
    phrase), or None when they agree: every split folder and top-level file with the recorded
    file and byte counts."""
    try:
        found = inventory(path)
    except OSError as exc:
        return f"cannot be listed ({exc.strerror or exc})"
    expected = recorded_inventory(record)
    if not any(want.get("files", 0) and name in found for name, want in expected.items()):
        return "the manifest records no data folder"
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
    fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)  # a folder only, never a FIFO
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def synthesize(path: Path, workload: "Workload", synth: Any, seed: int,
               on_progress: ProgressFn | None = None) -> bool:
    """Make ``path`` a complete embedded dataset of ``workload`` (synth settings ``synth``, seed
    ``seed``), marked as such. Used by `ensure_data` and ``mlhpc data synth``.

    ``on_progress`` receives the events of `SynthWatch` (``synth_plan`` before the first sample
    is written, then ``synth_progress`` at least every `mlhpc.data.synthwatch.TICK_S` seconds
    and after each batch of samples the workload reports) while anything is written.

    Nothing is done to a folder whose record agrees with its files and with these settings. A
    recorded folder whose files disagree with its manifest, and a folder of data without one,
    are refused and never touched; a missing or empty one is written in the hidden claimed
    folder (resuming an interrupted synthesis with these settings) and renamed into place.

    Returns:
        True when anything was written, False when ``path`` was already complete.

    Raises:
        ConfigError: ``seed`` outside 0 .. 2**63 - 1 (checked before anything is written).
        DataError: ``path`` is marked as synthesised with other settings (names the first
            differing key), changed since its synthesis, holds data that are not a synthesis,
            is not a folder, or cannot be written (names the folder).
    """
    seed = check_seed(seed)
    path = Path(path)
    wanted = _settings(workload.name, synth, seed)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path):
            if not _needs_synthesis(path, wanted):
                if claim_problem(path, SYNTH_KIND) is None:  # renamed into place, not yet released
                    _finish(path)
                return False
            _synthesize_into_place(path, workload, synth, seed, wanted, on_progress)
    except OSError as exc:
        where = exc.filename or path
        raise DataError(f"{where}: cannot write the synthetic dataset "
                        f"({exc.strerror or exc})") from None
    return True


def _needs_synthesis(path: Path, wanted: dict[str, Any]) -> bool:
    """False when ``path`` is marked with the ``wanted`` settings and its files agree; True when
    it is missing or empty.

    Raises:
        DataError: ``path`` is a file; holds data without a synthesis manifest (never adopted);
            is marked with other settings (the first differing key); or its files differ from
            its manifest (never deleted: the first difference is named).
    """
    if path.exists() and not path.is_dir():
        raise DataError(f"{path}: data.path is a file, not a dataset folder")
    if not path.is_dir() or describe(path) == "empty":
        return True
    record = synth_manifest(path)
    if record is None:
        raise DataError(f"{path}: holds files that are not a synthesis of mlhpc; it is never "
                        "rewritten: choose an empty or new folder")
    differs = _first_difference(record, wanted)
    if differs:
        raise DataError(f"{path}: data were synthesised with {differs}; delete the "
                        "folder or choose another data.path")
    changed = check_complete(path, record)
    if changed is None:
        return False
    raise DataError(changed_message(path, changed))


def changed_message(path: Path, why: str) -> str:
    """The error line for a synthesised folder whose files differ from its manifest."""
    return (f"{path}: files differ from the manifest of the synthesis ({why}); mlhpc never "
            "deletes them: move the folder away (or delete it yourself) and run again to "
            "synthesise it afresh, or set data.path")


def _synthesize_into_place(path: Path, workload: "Workload", synth: Any, seed: int,
                           wanted: dict[str, Any], on_progress: ProgressFn | None) -> None:
    """Write the dataset in the hidden claimed folder beside ``path`` (resuming an interrupted
    synthesis with the same settings), mark it, rename it to ``path`` (missing or empty) and
    only then release its claim (`_finish`). Called under `_lock`; OSError propagates.

    Raises:
        DataError: a hidden folder of that name not claimed by mlhpc for this user, or holding
            a file mlhpc did not record making (named; nothing removed); the rename failed (the
            folder stays claimed for the next run to finish).
    """
    tmp = staging_folder(path)
    if os.path.lexists(tmp):
        problem = claim_problem(tmp, SYNTH_KIND)
        if problem is not None:  # someone else's, or not made by mlhpc: neither read nor removed
            raise DataError(f"{tmp}: the hidden folder synthesis writes into is not mlhpc's "
                            f"({problem}); move it away, or set data.path")
        if _read_json(tmp / INTENT) != wanted:  # a different, interrupted synthesis: start afresh
            remove_claimed(tmp, SYNTH_KIND, "hidden synthesis folder")
    if not os.path.lexists(tmp):
        make_claimed_dir(tmp, SYNTH_KIND)  # new and private while written; the usual mode once complete
    with recording(tmp):
        _write_json(tmp / INTENT, wanted)
        remove_leftovers(tmp, SYNTH_KIND)
        with SynthWatch(tmp, path, on_progress) as watch:
            watch.run(workload.synthesize, synth, seed)
        remove_leftovers(tmp, SYNTH_KIND)
        manifest.write(tmp, KIND, _entries(tmp), **wanted)
    try:
        os.rename(tmp, path)  # replaces an empty folder of that name
    except OSError as exc:
        raise DataError(f"{path}: the synthesised data could not be put in place ({reason(exc)}); "
                        f"they stay complete, and mlhpc's, in {tmp}: move {path} away (or empty "
                        "it) and run again to put them there") from None
    _fsync_dir(path.parent)
    _finish(path)


def _finish(path: Path) -> None:
    """Release the claim of a synthesis in its final place ``path`` (the data are the user's from
    here) and give the folder the usual mode (``0777`` less the umask; private while written)."""
    release(path, SYNTH_KIND, [INTENT])
    os.chmod(path, 0o777 & ~_umask())


def _umask() -> int:
    """The process's umask, read without changing it (Linux /proc; else 0o077, the strictest)."""
    try:
        for line in read_text_input("/proc/self/status", 1 << 16, what="process status").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (MlhpcError, OSError, ValueError):
        pass
    return 0o077


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
    (a synthesis manifest, the files agreeing), ``"changed"`` (the files disagree with it),
    ``"interrupted"`` (no manifest, partial files of an mlhpc writer, or an interrupted hidden
    synthesis folder beside it), ``"unmarked"`` (data without a synthesis manifest: used as they
    are) or ``"empty"``."""
    path = Path(path)
    if not path.is_dir():
        return "interrupted" if staging_folder(path).is_dir() else "missing"
    record = synth_manifest(path)
    if record is not None:
        return "complete" if check_complete(path, record) is None else "changed"
    if _partial_files(path):
        return "interrupted"
    if not any(p.is_file() for p in path.rglob("*") if not p.name.startswith(".")):
        return "empty"
    return "unmarked"


def ensure_data(config: "Config", workload: "Workload", rt: "Runtime",
                on_progress: ProgressFn | None = None) -> float:
    """Make sure ``config.data.path`` holds a complete dataset before anything reads it;
    synthesise the embedded one when it is missing or was interrupted, and
    ``data.synthesize_if_missing`` allows it. Data that no longer match their synthesis manifest
    are refused, never deleted.

    Rank 0 writes (telling ``on_progress`` what it does: `SynthWatch`); every rank first
    looks, then waits, then checks the result. A folder without a record that holds data (a real
    dataset) is used as it is.

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
    if state == "complete":  # every rank, so that all raise together
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
