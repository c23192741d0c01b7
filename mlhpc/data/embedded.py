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
   `mlhpc.data.files.part_path`; a workload writes each file through
   `mlhpc.data.files.atomic_output`) is removed before it resumes, so it is never staged or
   read; the files already in place are kept, and the workload writes only the missing ones;
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
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from mlhpc.config import SEED_MAX
from mlhpc.data import manifest
from mlhpc.data.checksums import checksum
from mlhpc.data.claims import (
    claim_problem,
    make_claimed_dir,
    release,
    remove_claimed,
    remove_leftovers,
)
from mlhpc.data.files import is_part_file, reason, write_text_atomic
from mlhpc.data.inputs import read_text_input
from mlhpc.data.statefiles import recording
from mlhpc.data.synthteam import QuietRankError, SynthTeam
from mlhpc.data.synthwatch import ProgressFn, SynthWatch
from mlhpc.errors import ConfigError, DataError, MlhpcError

if TYPE_CHECKING:  # pragma: no cover - typing only
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


def _listing(path: Path) -> list[str]:
    """The relative paths of every file `inventory` counts, sorted."""
    found = []
    for entry in sorted(Path(path).iterdir()):
        if entry.name.startswith("."):
            continue
        files = [p for p in entry.rglob("*") if p.is_file()] if entry.is_dir() else [entry]
        found.extend(file.relative_to(path).as_posix() for file in sorted(files))
    return found


def _entry(path: Path, rel: str) -> dict[str, Any]:
    """The manifest entry (path, bytes, xxh3_128) of file ``rel`` under ``path``."""
    file = Path(path) / rel
    return {"path": rel, "bytes": file.stat().st_size, "xxh3_128": checksum(file)}


def _entries(path: Path) -> list[dict[str, Any]]:
    """The manifest entries of every file `inventory` counts."""
    return [_entry(path, rel) for rel in _listing(path)]


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
               on_progress: ProgressFn | None = None, team: SynthTeam = SynthTeam()) -> bool:
    """Make ``path`` a complete embedded dataset of ``workload`` (synth settings ``synth``, seed
    ``seed``), marked as such. Used by `ensure_data` and ``mlhpc data synth``.

    ``on_progress`` receives the events of `SynthWatch` (``synth_plan`` before the first sample
    is written, then ``synth_progress`` at least every `mlhpc.data.synthwatch.TICK_S` seconds
    and after each batch of samples the workload reports) while anything is written, and on
    rank 0 one ``synth_done`` event (`synth_done`) at the end.

    Nothing is done to a folder whose record agrees with its files and with these settings. A
    recorded folder whose files disagree with its manifest, and a folder of data without one,
    are refused and never touched; a missing or empty one is written in the hidden claimed
    folder (resuming an interrupted synthesis with these settings) and renamed into place.

    ``team`` (`SynthTeam`): with several ranks, every rank calls this on one folder (a file
    system they share); rank 0 decides and prepares, every rank writes its share and checksums
    its share of the files, rank 0 writes the manifest and renames the folder into place.

    Returns:
        True when anything was written, False when ``path`` was already complete.

    Raises:
        ConfigError: ``seed`` outside 0 .. 2**63 - 1 (checked before anything is written).
        DataError: ``path`` is marked as synthesised with other settings (names the first
            differing key), changed since its synthesis, holds data that are not a synthesis,
            is not a folder, or cannot be written (names the folder); on every rank.
    """
    seed = check_seed(seed)
    path = Path(path)
    wanted = _settings(workload.name, synth, seed)
    try:
        if team.is_main:  # the lock is taken on the parent folder
            path.parent.mkdir(parents=True, exist_ok=True)
        with _lock(path) if team.is_main else nullcontext():
            if not _on_main(team, _prepared, path, wanted):
                return False
            tmp = staging_folder(path)
            with recording(tmp), SynthWatch(tmp, path, on_progress, team) as watch:
                watch.run(workload.synthesize, synth, seed)
                figures = team.everyone(watch.rank_figures())
            entries = team.gather([_entry(tmp, rel) for rel in team.share(_listing(tmp))])
            _on_main(team, _put_in_place, path, wanted, entries)
    except OSError as exc:
        where = exc.filename or path
        raise DataError(f"{where}: cannot write the synthetic dataset "
                        f"({exc.strerror or exc})") from None
    if team.is_main and on_progress is not None:
        on_progress(synth_done(path, figures, entries))
    return True


def _on_main(team: SynthTeam, fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on rank 0; its result, or its error as a DataError, on every rank."""
    outcome: tuple[str, Any] = ("ok", None)
    if team.is_main:
        try:
            outcome = ("ok", fn(*args))
        except (MlhpcError, OSError) as exc:
            if team.ranks == 1:
                raise
            outcome = ("error", exc)
    outcome = team.from_main(outcome if team.ranks == 1 else (outcome[0], _picklable(outcome[1])))
    if outcome[0] == "error":
        raise QuietRankError(str(outcome[1])) if not team.is_main else outcome[1]
    return outcome[1]


def _picklable(value: Any) -> Any:
    """``value`` as it crosses to the other ranks: an error as its text."""
    return str(value) if isinstance(value, BaseException) else value


def _prepared(path: Path, wanted: dict[str, Any]) -> bool:
    """Rank 0's first step: False when ``path`` is complete with these settings (its claim
    released if a rename was interrupted), else True with the hidden folder ready to write."""
    if not _needs_synthesis(path, wanted):
        if claim_problem(path, SYNTH_KIND) is None:  # renamed into place, not yet released
            _finish(path)
        return False
    _prepare_hidden(path, wanted)
    return True


def synth_done(path: Path, figures: list[dict[str, Any]], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """The ``synth_done`` event: every rank's figures (`SynthWatch.rank_figures`), the bytes of
    the whole data set and the slowest rank's seconds."""
    return {"kind": "synth_done", "path": str(Path(path).absolute()), "ranks": figures,
            "files": len(entries), "bytes": sum(e["bytes"] for e in entries),
            "elapsed_s": max(f["elapsed_s"] for f in figures)}


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


def _prepare_hidden(path: Path, wanted: dict[str, Any]) -> None:
    """Make (or resume) the hidden claimed folder beside ``path`` to write the dataset in: its
    intent record written, what unfinished writers left removed. Called by rank 0 under `_lock`;
    OSError propagates.

    Raises:
        DataError: a hidden folder of that name not claimed by mlhpc for this user, or holding
            a file mlhpc did not record making (named; nothing removed).
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


def _put_in_place(path: Path, wanted: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    """Rank 0's last step, once every rank has written its share: the manifest (``entries``)
    written, the hidden folder renamed to ``path`` (missing or empty) and only then its claim
    released (`_finish`).

    Raises:
        DataError: the rename failed (the folder stays claimed for the next run to finish).
    """
    tmp = staging_folder(path)
    with recording(tmp):
        if remove_leftovers(tmp, SYNTH_KIND):  # a writer's temporary left behind: listed above
            entries = _entries(tmp)
        manifest.write(tmp, KIND, entries, wanted)
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
