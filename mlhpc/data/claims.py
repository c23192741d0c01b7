"""Claim records and the remover, `remove_claimed`: mlhpc deletes only what it recorded making.

A folder mlhpc makes for its own writing (a staged copy, the hidden folder a synthesis writes
into, a benchmark's scratch folder) gets a **claim record** at its top, ``.mlhpc-claim.json``,
written when the folder is made:

- ``kind``: what the folder is (``staged-copy``, ``synthesis``, ``scratch``);
- who and when: the user (uid and name), host, process, UTC time;
- the folder's identity: device and inode of the folder the record was written in, so a record
  copied, moved or planted into another folder licenses nothing;
- ``files``: the relative paths mlhpc wrote there. Files also count when the folder's own
  records list them: a staged copy's manifest and journals, which staging writes as it copies,
  and the journals its writers keep under `mlhpc.data.statefiles.recording` (a synthesis's hidden
  folder: each file put in place is recorded as it lands). A folder mlhpc made empty and
  private is no exception: a file nothing records (one the user put there) is never mlhpc's.

`remove_claimed` is the only code of the project that deletes a tree. It checks the record (a
regular file, not a link, in a real folder owned by the invoking user and writable by nobody
else, naming that user and that folder's identity, of the kind the caller expects), then walks
the folder without following links and refuses, with one line and before anything is touched,
when anything is there that the record does not list (a user's file, a run's results, a link).
Only then does it unlink the listed files, relative to folder descriptors (``os.fwalk``: a link
swapped in is never followed), remove the folders left empty, the record last, then the folder.
A file that appears in the meantime is not listed, so it is left with its folder, and said.
`prune_claimed` removes, by the same rules, the listed files a new plan no longer holds.

See docs/data.md, "What mlhpc deletes".
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import stat
import time
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

from mlhpc.data.files import is_part_file, part_path, write_text_atomic
from mlhpc.data.inputs import journal_objects, read_text_input
from mlhpc.data.statefiles import MADE_JOURNAL
from mlhpc.errors import DataError, MlhpcError

CLAIM_NAME = ".mlhpc-claim.json"
CLAIM_FORMAT = "mlhpc-claim"
CLAIM_VERSION = 1
#: The most bytes a claim record may hold (one path per file of a large copy).
MAX_CLAIM_BYTES = 1 << 30
#: mlhpc's own state files at the top of a claimed folder (claim, manifest, lock, readers' lock,
#: synthesis intent); journals are ``.mlhpc-journal-*.jsonl``. Only ever counted as mlhpc's inside
#: a folder whose claim holds.
STATE_NAMES = frozenset({CLAIM_NAME, ".mlhpc-manifest.json", ".mlhpc-lock", ".mlhpc-readers",
                         ".mlhpc-intent.json"})
JOURNAL_PREFIX, JOURNAL_SUFFIX = ".mlhpc-journal-", ".jsonl"


class RemovalRefused(DataError):
    """A removal mlhpc refused (no valid claim, or something there the claim does not list);
    nothing was deleted."""


@dataclass(frozen=True)
class Claim:
    """A folder's claim record, valid for that folder (`read_claim`)."""

    folder: Path
    kind: str
    files: frozenset[str]
    user: str
    made_at: str


def _user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"


def write_claim(folder: Path, kind: str, files: Iterable[str] = ()) -> None:
    """Write (or replace) ``folder``'s claim record: ``kind``, the invoking user, host, process,
    UTC time, the folder's device and inode and the relative ``files`` mlhpc wrote there (see
    the module docstring), written by `mlhpc.data.files.write_text_atomic`.

    Raises:
        OSError: the folder is missing, a link, not private, or not writable.
    """
    info = os.lstat(folder)
    doc = {"format": CLAIM_FORMAT, "version": CLAIM_VERSION, "kind": kind,
           "uid": os.geteuid(), "user": _user(), "host": socket.gethostname(), "pid": os.getpid(),
           "made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
           "folder": {"dev": info.st_dev, "ino": info.st_ino},
           "files": sorted(set(files))}
    write_text_atomic(Path(folder) / CLAIM_NAME, json.dumps(doc, indent=0, sort_keys=True) + "\n")


def claim_problem(folder: Path, kind: str) -> Optional[str]:
    """Why ``folder`` holds no valid claim of ``kind`` for this user (one phrase), or None."""
    return _checked(Path(folder), kind)[0]


def read_claim(folder: Path, kind: str) -> Optional[Claim]:
    """``folder``'s claim of ``kind`` when it is valid for this user and this folder (see
    `claim_problem`), else None."""
    problem, doc = _checked(Path(folder), kind)
    if problem is not None:
        return None
    return Claim(Path(folder), kind, frozenset(doc["files"]), str(doc.get("user"))[:64],
                 str(doc.get("made_at"))[:32])


def _checked(folder: Path, kind: str) -> tuple[Optional[str], dict[str, Any]]:
    """``(why the claim is not valid, or None; the record read)``, the record read once."""
    try:
        info = os.lstat(folder)
    except OSError:
        return "not found", {}
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder (a link or a file)", {}
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o022:
        return "not a private folder of yours", {}
    try:
        doc = json.loads(read_text_input(folder / CLAIM_NAME, MAX_CLAIM_BYTES, folder, "claim record"))
    except (MlhpcError, ValueError, RecursionError):
        return f"no claim record of mlhpc ({CLAIM_NAME}) in it", {}
    if not isinstance(doc, dict) or doc.get("format") != CLAIM_FORMAT:
        return f"{CLAIM_NAME} is not a claim record of mlhpc", {}
    where = doc.get("folder") if isinstance(doc.get("folder"), dict) else {}
    if (where.get("dev"), where.get("ino")) != (info.st_dev, info.st_ino):
        return "its claim record was written for another folder", doc
    if doc.get("uid") != os.geteuid():
        return "claimed by another user", doc
    if doc.get("kind") != kind:
        return f"claimed as {str(doc.get('kind'))[:40]!r}, not {kind!r}", doc
    if not isinstance(doc.get("files"), list) or not all(isinstance(f, str) for f in doc["files"]):
        return f"{CLAIM_NAME} lists no files", doc
    return None, doc


def _entries(folder: Path) -> list[tuple[str, bool]]:
    """``(relative path, is a real folder)`` of everything under ``folder``, links listed and
    never followed, deepest first."""
    found = []
    for root, dirs, names, _fd in os.fwalk(folder, topdown=False, follow_symlinks=False):
        rel = Path(root).relative_to(folder)
        for name in names:
            found.append(((rel / name).as_posix(), False))
        for name in dirs:
            entry = (rel / name).as_posix()
            is_link = os.path.islink(Path(root) / name)
            found.append((entry, not is_link))
    return found


def is_state_file(rel: str) -> bool:
    """mlhpc's own state at the top of a claimed folder (`STATE_NAMES`, journals), or a
    temporary file or folder of an unfinished mlhpc writer anywhere below it."""
    name = rel.rsplit("/", 1)[-1]
    top = "/" not in rel
    return (top and (name in STATE_NAMES or (name.startswith(JOURNAL_PREFIX) and name.endswith(JOURNAL_SUFFIX)))) \
        or is_part_file(name)


def foreign(claim: Claim, recorded: Iterable[str] = ()) -> list[str]:
    """What lies under the claimed folder that neither its claim nor ``recorded`` (the files the
    folder's own records list, e.g. a staged copy's manifest) lists, sorted; folders count only
    through what they hold."""
    listed = claim.files | frozenset(recorded)
    inside_part = set()
    found = []
    for rel, is_dir in _entries(claim.folder):
        if is_dir:
            if is_part_file(rel.rsplit("/", 1)[-1]):
                inside_part.add(rel + "/")
            continue
        if rel in listed or is_state_file(rel) or any(rel.startswith(p) for p in inside_part):
            continue
        found.append(rel)
    return sorted(found)


def made_files(folder: Path) -> set[str]:
    """The files mlhpc's writers recorded putting in place in ``folder``
    (`mlhpc.data.statefiles.recording`: its journals ``MADE_JOURNAL*.jsonl``, read by
    `mlhpc.data.inputs.journal_objects`, which passes over unreadable journals and torn lines)."""
    entries = journal_objects(folder, MADE_JOURNAL + "*" + JOURNAL_SUFFIX, MAX_CLAIM_BYTES)
    return {entry["path"] for entry in entries if isinstance(entry.get("path"), str)}


def _refuse(claim: Claim, strays: list[str], what: str) -> RemovalRefused:
    more = f" and {len(strays) - 1} more" if len(strays) > 1 else ""
    return RemovalRefused(f"{claim.folder / strays[0]}{more}: not made by mlhpc in this {what}; "
                          f"nothing removed (move what is yours elsewhere, then remove {claim.folder} "
                          "yourself or run again)")


def remove_claimed(folder: Path, kind: str, what: str, recorded: Iterable[str] = ()) -> tuple[int, int]:
    """Delete ``folder``, the only way mlhpc deletes a folder (module docstring). ``recorded``: the
    files the folder's own records list besides its claim and its writers' journals
    (`made_files`). Returns ``(bytes, files)`` removed.

    Raises:
        RemovalRefused: no valid claim of ``kind`` (naming why), or something there the claim
            does not list (naming it); nothing was deleted.
        OSError: a deletion failed part way (what was listed and deleted stays deleted).
    """
    folder = Path(folder)
    claim = read_claim(folder, kind)
    if claim is None:
        raise RemovalRefused(f"{folder}: not removed: {claim_problem(folder, kind)}")
    recorded = frozenset(recorded) | made_files(folder)
    strays = foreign(claim, recorded)
    if strays:
        raise _refuse(claim, strays, what)
    removed = _delete_listed(claim, recorded, keep=frozenset())
    os.rmdir(folder)
    return removed


def prune_claimed(folder: Path, kind: str, keep: set[str], recorded: Iterable[str] = ()) -> int:
    """Delete the files under claimed ``folder`` that its claim or ``recorded`` list and ``keep``
    does not, and what unfinished mlhpc writers left there (`mlhpc.data.files.is_part_file`);
    mlhpc's own state at the top stays; then folders left empty. Returns the count.

    Raises:
        RemovalRefused: no valid claim of ``kind``; nothing was deleted.
    """
    claim = read_claim(folder, kind)
    if claim is None:
        raise RemovalRefused(f"{folder}: not pruned: {claim_problem(folder, kind)}")
    recorded = frozenset(recorded) | made_files(folder)
    return _delete_listed(claim, recorded, keep=frozenset(keep), state=False)[1]


def _delete_listed(claim: Claim, recorded: frozenset[str], keep: frozenset[str],
                   state: bool = True) -> tuple[int, int]:
    """Unlink, relative to folder descriptors and never through a link, each file below the
    claimed folder that is listed (claim, ``recorded``; with ``state``, mlhpc's
    own state files too) and not in ``keep``; the record itself last; then every folder left
    empty below. Returns ``(bytes, files)``."""
    listed = claim.files | recorded
    total = count = 0
    in_part: list[str] = []
    for root, dirs, names, root_fd in os.fwalk(claim.folder, topdown=True, follow_symlinks=False):
        rel_root = Path(root).relative_to(claim.folder).as_posix()
        prefix = "" if rel_root == "." else rel_root + "/"
        in_part += [prefix + d + "/" for d in dirs if is_part_file(d)]
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            rel = prefix + name
            ours = (rel in listed or any(rel.startswith(p) for p in in_part)
                    or (is_part_file(name)) or (state and is_state_file(rel)))
            if not ours or rel in keep or rel == CLAIM_NAME or \
                    (not state and is_state_file(rel) and not is_part_file(name)):
                continue
            info = os.lstat(name, dir_fd=root_fd)
            os.unlink(name, dir_fd=root_fd)
            total, count = total + (info.st_size if stat.S_ISREG(info.st_mode) else 0), count + 1
    for root, dirs, _names, root_fd in os.fwalk(claim.folder, topdown=False, follow_symlinks=False):
        for name in dirs:
            try:
                os.rmdir(name, dir_fd=root_fd)  # only an empty folder goes
            except OSError:
                pass
    if state:
        os.unlink(claim.folder / CLAIM_NAME)
    return total, count


def make_claimed_dir(path: Path, kind: str) -> Path:
    """Create ``path`` new (``0700``; it must not exist: a folder someone made beforehand is
    never adopted) and write its claim of ``kind``, listing no file yet: what mlhpc writes there
    counts as its own once recorded (`mlhpc.data.statefiles.recording`). Raises OSError
    (FileExistsError included)."""
    os.mkdir(path, 0o700)
    write_claim(path, kind)
    return Path(path)


def remove_own_part(path: Path) -> None:
    """Delete ``path``, a file or folder this process wrote under its temporary name
    (`mlhpc.data.files.part_path`: the name carries this host and process, so the name is the
    record), with everything in it, never through a link. Anything else is left alone."""
    path = Path(path)
    suffix = part_path(Path("x")).name[len(".x"):]  # ".HOST-PID.mlhpc-part" of this process
    if not (path.name.startswith(".") and path.name.endswith(suffix)) or not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, names, root_fd in os.fwalk(path, topdown=False, follow_symlinks=False):
            for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                os.unlink(name, dir_fd=root_fd)
            for name in dirs:
                if not os.path.islink(os.path.join(root, name)):
                    os.rmdir(name, dir_fd=root_fd)
        os.rmdir(path)
    else:
        os.unlink(path)


def remove_leftovers(folder: Path, kind: str) -> int:
    """In a folder whose claim of ``kind`` holds, delete what unfinished writers left: files and
    folders under the temporary name (`mlhpc.data.files.is_part_file`) with all they hold, never
    through a link. Returns the number of entries removed (0 without a valid claim)."""
    if read_claim(folder, kind) is None:
        return 0
    count = 0
    for root, dirs, names, root_fd in os.fwalk(folder, topdown=False, follow_symlinks=False):
        inside = any(is_part_file(part) for part in Path(root).relative_to(folder).parts)
        for name in names + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            if inside or is_part_file(name):
                os.unlink(name, dir_fd=root_fd)
                count += 1
        for name in dirs:
            if (inside or is_part_file(name)) and not os.path.islink(os.path.join(root, name)):
                os.rmdir(name, dir_fd=root_fd)
                count += 1
    return count


def release(folder: Path, kind: str, names: Iterable[str]) -> None:
    """Close a claimed folder that becomes the user's to keep (a synthesis once renamed into
    place: a finished dataset mlhpc never deletes): its state files ``names`` (of
    `STATE_NAMES`), its journals, and then its claim record are removed. Called only once the
    folder is in its final place: until then the claim is what lets a later run finish or remove
    it. Nothing is done without a valid claim of ``kind``."""
    if read_claim(folder, kind) is None:
        return
    with os.scandir(folder) as entries:
        journals = [e.name for e in entries if is_state_file(e.name) and e.name.startswith(JOURNAL_PREFIX)]
    for name in [*names, *journals]:
        if name in STATE_NAMES and name != CLAIM_NAME or name in journals:
            with suppress(FileNotFoundError):
                os.unlink(Path(folder) / name)
    os.unlink(Path(folder) / CLAIM_NAME)
