"""The manifest of a dataset folder, its parser, and the journals of unfinished writers.

Every folder mlhpc produces (``mlhpc data convert | prepare``, a staged copy) holds one
``.mlhpc-manifest.json``, written last, atomically, by one writer, after every file it lists is
on disk, the way MosaicML streaming's ``index.json`` closes a dataset. Its schema (version 3):

``format``
    ``"mlhpc-manifest"``; ``version``: 3; ``algorithm``: ``"xxh3_128"``;
``kind``
    ``"stage"``, ``"convert"`` or ``"prepare"``: what wrote it;
``complete``
    ``true``: a folder without a manifest saying so is unfinished (`require_complete`);
``files``
    one entry per file: ``path`` (POSIX, relative), ``bytes``, ``xxh3_128`` (hex), and where
    known ``samples``, ``from`` (the source file it was made from) and the source's identity
    (``source_mtime_ns``, ``source_ctime_ns``, ``source_ino``);
``total_bytes``, ``samples``
    sums over ``files``; and what the writer adds: ``source``, ``shard``, ``to``, ``from``,
    ``sources`` (staging and conversion), ``source_files``.

While a writer works, each finished file is appended as one JSON line to a journal
(``.mlhpc-journal-HOST-PID.jsonl``); a later run resumes from the manifest and the journals, and a
folder that holds journals but no complete manifest is an interrupted one. A conversion (staging
that converts, ``mlhpc data convert | prepare``) journals each source with its outputs in one
form (`Conversion.entry`), read back by one function (`read_convert_state`) and reused by one
rule (`conversion_reusable`: the same source file, its outputs intact).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional

from mlhpc.data.checksums import CHECKSUM, checksum
from mlhpc.data.files import (
    dest_error,
    is_part_file,
    narrow_mode,
    reason,
    safe_name,
    unlink_quietly,
    write_text_atomic,
)
from mlhpc.data.inputs import journal_objects, read_text_input
from mlhpc.data.statefiles import open_state_file
from mlhpc.data.trees import is_under, resolved
from mlhpc.errors import DataError, MlhpcError, StagingError

#: Staging's plan entries, job and shard (`mlhpc.data.stage`), named here only in annotations:
#: the manifest sits below staging and imports nothing of it.
Planned = Copy = Shard = Any

MANIFEST_NAME = ".mlhpc-manifest.json"
JOURNAL_PREFIX = ".mlhpc-journal-"
MANIFEST_FORMAT = "mlhpc-manifest"
MANIFEST_VERSION = 3  # 3: one schema for staging, conversion and preparation; "complete"
MAX_MANIFEST_BYTES = 1 << 30  # a manifest of ~10 million files; anything larger is not ours
IDENTITY = ("source_mtime_ns", "source_ctime_ns", "source_ino")  # with bytes: "same file"


#: The largest conversion journal read (one short JSON line per file written).
JOURNAL_MAX_BYTES = 1 << 30


def describe_output(root: Path, path: Path, samples: int, mode: int) -> dict[str, Any]:
    """The manifest entry ``{path (POSIX, relative to root), bytes, xxh3_128, samples}`` of a
    file a workload's converter just wrote, its permission bits first narrowed to ``mode``
    (`mlhpc.data.files.narrow_mode`: never wider than its source). The only description of a
    converted file, for ``data convert | prepare`` and for staging that converts.

    Raises:
        ValueError: ``path`` lies outside ``root`` (after resolving links).
        OSError: it cannot be read or changed (ELOOP: it is a link).
    """
    path = Path(path)
    if not is_under(resolved(path), resolved(root)):
        raise ValueError(f"{path} lies outside {root}")
    rel = path.relative_to(root).as_posix()
    narrow_mode(path, mode)
    return {"path": rel, "bytes": os.stat(path).st_size, "xxh3_128": checksum(path), "samples": samples}


def load(folder: Path) -> Optional[dict[str, Any]]:
    """The manifest of ``folder`` when it is a valid, complete one of this schema; ``None`` when
    it is missing, unreadable, of another version, incomplete or malformed. The parser:
    every reader of a manifest goes through it."""
    path = Path(folder) / MANIFEST_NAME
    try:
        doc = json.loads(read_text_input(path, MAX_MANIFEST_BYTES, folder, "manifest"))
    except (DataError, ValueError, RecursionError):
        return None
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT \
            or doc.get("version") != MANIFEST_VERSION or doc.get("algorithm") != CHECKSUM \
            or doc.get("complete") is not True or not isinstance(doc.get("files"), list) \
            or not all(valid_output(e) for e in doc["files"]):
        return None
    return doc


def write(folder: Path, kind: str, files: list[dict[str, Any]],
          fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write ``folder``'s manifest atomically (the last step of a writer) and return it.

    Args:
        kind: ``"stage"``, ``"convert"`` or ``"prepare"``.
        files: entries with at least ``path``, ``bytes`` and ``xxh3_128``; sorted here by path.
        fields: the writer's own keys (``source``, ``shard``, ``to``, ``from``, ``sources``, ...),
            in the manifest's order.

    Raises:
        OSError: the manifest cannot be written (the folder is left without one: unfinished).
    """
    files = sorted(files, key=lambda e: e["path"])
    doc = {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "algorithm": CHECKSUM,
           "kind": kind, "complete": True, **(fields or {}), "files": files,
           "total_bytes": sum(e["bytes"] for e in files),
           "samples": sum(int(e.get("samples") or 0) for e in files)}
    write_text_atomic(Path(folder) / MANIFEST_NAME, json.dumps(doc, indent=1) + "\n")
    return doc


def unfinished(folder: Path) -> Optional[str]:
    """Why ``folder`` is an unfinished output of an mlhpc writer (journals or temporary files at
    its top and no complete manifest), or ``None`` when it is not one."""
    folder = Path(folder)
    if load(folder) is not None:
        return None
    try:
        names = os.listdir(folder)
    except OSError:
        return None
    if (folder / MANIFEST_NAME).exists():
        return f"its {MANIFEST_NAME} is not a complete manifest"
    if any(n.startswith(JOURNAL_PREFIX) for n in names):
        return "a writer's journal is there but no manifest (interrupted)"
    if any(is_part_file(n) for n in names):
        return "temporary files of an interrupted writer are there and no manifest"
    return None


def require_complete(folder: Path, error: type[MlhpcError] = DataError, resume: str = "") -> None:
    """Raise ``error`` when ``folder`` is an unfinished output (`unfinished`), saying how to
    resume (``resume``: the command that finishes it)."""
    why = unfinished(folder)
    if why is not None:
        how = f"; finish it with: {resume}" if resume else "; run the command that made it again to resume"
        raise error(f"{folder}: unfinished dataset ({why}){how}")


def read_manifest(dest: Path) -> dict[str, dict[str, Any]]:
    """The files of a finished folder's manifest: relative path -> ``{bytes, xxh3_128, ...}``.

    Raises:
        StagingError: no manifest, or one that is not a complete mlhpc manifest of this version.
    """
    path = Path(dest) / MANIFEST_NAME
    if not path.exists():
        raise StagingError(f"{path}: no manifest (the writer never finished here)")
    doc = load(dest)
    if doc is None:
        raise StagingError(f"{path}: not a complete mlhpc manifest (version {MANIFEST_VERSION})")
    return {entry["path"]: entry for entry in doc["files"]}


def read_state(dest: Path, source: Path) -> dict[str, dict[str, Any]]:
    """Entries from the manifest, then from every journal (later wins); for this source only."""
    known: dict[str, dict[str, Any]] = {}
    src = str(resolved(source))
    doc = load(dest)  # none, or a damaged one: nothing is trusted, everything is checked or copied
    if doc is not None and doc.get("kind") == "stage" and doc.get("source") == src:
        known.update({e["path"]: e for e in doc["files"] if valid_entry(e)})
    for entry in journal_entries(dest):
        if entry.get("source") == src and "to" not in entry and valid_entry(entry):
            known[entry["path"]] = entry
    return known


def journal_entries(dest: Path) -> Iterator[dict[str, Any]]:
    """Every entry (a JSON object) of the journals at the top of ``dest``, in journal order; unreadable
    journals and lines torn by an interruption are passed over (`mlhpc.data.inputs.journal_objects`)."""
    return journal_objects(dest, JOURNAL_PREFIX + "*.jsonl", JOURNAL_MAX_BYTES)


def valid_entry(entry: Any) -> bool:
    """A staged copy's record: path, bytes, checksum and the source's identity."""
    return (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and isinstance(entry.get("bytes"), int) and isinstance(entry.get("xxh3_128"), str)
            and all(isinstance(entry.get(key), int) for key in IDENTITY))


def identity(item: Planned) -> dict[str, int]:
    """The identity fields of a planned source file (with its size: \"the same file\")."""
    return {"source_mtime_ns": item.mtime_ns, "source_ctime_ns": item.ctime_ns, "source_ino": item.ino}


def stat_identity(st: os.stat_result) -> dict[str, int]:
    """`identity` of a source file from its stat."""
    return {"source_mtime_ns": st.st_mtime_ns, "source_ctime_ns": st.st_ctime_ns, "source_ino": st.st_ino}


def write_manifest(dest: Path, source: Path, plan: list[Planned], known: dict[str, dict[str, Any]],
                    shard: Optional[dict[str, Any]] = None) -> None:
    """Check every planned file is recorded and on disk, write the manifest atomically, drop journals."""
    entries = []
    for item in plan:
        entry = known.get(item.rel)
        if entry is None or entry["bytes"] != item.size_bytes:
            raise StagingError(f"{dest / item.rel}: staged file missing from every journal")
        try:
            on_disk = os.stat(dest / item.rel).st_size
        except OSError as exc:
            raise StagingError(f"{dest / item.rel}: staged file vanished ({reason(exc)})") from None
        if on_disk != item.size_bytes:
            raise StagingError(f"{dest / item.rel}: staged file has {on_disk} bytes, expected {item.size_bytes}")
        entries.append({"path": item.rel, "bytes": item.size_bytes, "xxh3_128": entry["xxh3_128"],
                        **{key: entry[key] for key in IDENTITY}})
    try:
        write(dest, "stage", entries, {"source": str(resolved(source)), "shard": shard, "to": "none"})
    except OSError as exc:
        raise dest_error(dest / MANIFEST_NAME, exc) from None
    drop_journals(dest)


def drop_journals(folder: Path) -> None:
    """Remove the journals of ``folder`` (after its manifest is written)."""
    for journal in Path(folder).glob(JOURNAL_PREFIX + "*.jsonl"):
        unlink_quietly(journal)


class Journal:
    """Append-only JSON-lines record of the files this process finished (thread-safe), at
    ``folder/.mlhpc-journal-HOST-PID.jsonl``, opened without following a link.

    Args:
        error: the error class raised when the journal cannot be written (default: the staging
            destination's `StagingError` wording).
    """

    def __init__(self, dest: Path, host: str, error: Optional[type[MlhpcError]] = None) -> None:
        self.path = Path(dest) / f"{JOURNAL_PREFIX}{safe_name(host)}-{os.getpid()}.jsonl"
        self._error = error
        self._lock = threading.Lock()
        self._file: Any = None

    def add(self, entry: dict[str, Any]) -> None:
        """Append ``entry`` as one line, flushed."""
        line = json.dumps(entry, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                if self._file is None:
                    fd = open_state_file(self.path, os.O_WRONLY | os.O_APPEND, "journal",
                                         self._error or StagingError)
                    self._file = os.fdopen(fd, "a", encoding="utf-8")
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                if self._error is None:
                    raise dest_error(self.path, exc) from None
                raise self._error(f"{self.path}: cannot write journal ({reason(exc)})") from None

    def close(self) -> None:
        """Close the journal file (entries stay on disk)."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def converted_doc(dest: Path, source: Path, shard: Optional[Shard], to: str) -> Optional[dict[str, Any]]:
    """The manifest of a finished conversion of ``source`` (and ``shard``) to ``to`` at ``dest``."""
    doc = load(dest)
    if doc is None:
        return None
    wanted = None if shard is None else {**shard.to_dict(), "node_rank": shard.node_rank}
    if doc.get("kind") != "stage" \
            or doc.get("source") not in (str(source.absolute()), str(resolved(source))) \
            or doc.get("shard") != wanted or doc.get("to") != to or not isinstance(doc.get("from"), str):
        return None
    files, sources = doc.get("files"), doc.get("sources")
    if not isinstance(files, list) or not files or not isinstance(sources, list) \
            or not all(valid_output(e) for e in files) \
            or not all(_valid_source(e, recorded=True) and isinstance(e.get("convert"), bool)
                       for e in sources):
        return None
    return doc


def valid_output(entry: Any) -> bool:
    """A manifest file entry: path, bytes and checksum of the right types."""
    return (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and isinstance(entry.get("bytes"), int) and isinstance(entry.get("xxh3_128"), str))


def _valid_source(entry: Any, recorded: bool = False) -> bool:
    """A source's record: in a journal its ``outputs`` are output entries; in the manifest
    (``recorded``) the paths of entries under ``files``."""
    valid = (lambda o: isinstance(o, str)) if recorded else valid_output
    return (isinstance(entry, dict) and isinstance(entry.get("path"), str)
            and isinstance(entry.get("bytes"), int)
            and all(isinstance(entry.get(key), int) for key in IDENTITY)
            and isinstance(entry.get("outputs"), list) and all(valid(o) for o in entry["outputs"]))


@dataclass(frozen=True)
class Conversion:
    """One conversion of a dataset: of the files under ``source``, by ``kind`` (``"stage"``,
    ``"convert"`` or ``"prepare"``), into the form ``to``; its journal's entries come from
    `entry`."""

    source: Path
    kind: str
    to: str

    def entry(self, rel: str, size_bytes: int, source_identity: dict[str, int],
              outputs: list[dict[str, Any]], convert: bool = True) -> dict[str, Any]:
        """The conversion journal's entry of source file ``rel`` (``size_bytes``, its
        `identity` taken before it was read): ``{path, bytes, <identity>, source, kind, to,
        convert, outputs: [{path, bytes, xxh3_128, samples}]}``; ``convert`` False for a file
        copied as it is."""
        return {"path": rel, "bytes": size_bytes, **source_identity, "source": str(resolved(self.source)),
                "kind": self.kind, "to": self.to, "convert": convert, "outputs": outputs}


def read_convert_state(dest: Path, source: Path, to: str, kind: str = "stage") -> dict[str, dict[str, Any]]:
    """Source path -> ``{bytes, <identity>, outputs: [{path, bytes, xxh3_128}]}`` of every
    source a conversion of ``source`` to form ``to`` by ``kind`` finished at ``dest``: from the
    manifest of an earlier one (its ``sources``), then from every journal (later wins). The
    conversion journal, read the same way by staging and by ``mlhpc data convert |
    prepare``; whether an entry is reused is decided by `conversion_reusable` alone."""
    src = str(resolved(source))
    known: dict[str, dict[str, Any]] = {}
    doc = load(dest)  # none, or a damaged one: every source is converted again
    if doc is not None and doc.get("kind") == kind and doc.get("source") == src \
            and doc.get("to") == to and isinstance(doc.get("sources"), list):
        files = {e["path"]: e for e in doc["files"]}
        for entry in doc["sources"]:
            if isinstance(entry, dict) and isinstance(entry.get("outputs"), list):
                entry = {**entry, "outputs": [files.get(o) for o in entry["outputs"]]}
                if _valid_source(entry):
                    known[entry["path"]] = entry
    for entry in journal_entries(dest):
        if entry.get("source") == src and entry.get("to") == to \
                and entry.get("kind", "stage") == kind and _valid_source(entry):
            known[entry["path"]] = entry
    return known


def conversion_reusable(dest: Path, entry: dict[str, Any] | None, size_bytes: int,
                        source_identity: dict[str, int], verify: bool = False) -> bool:
    """The resume rule of a conversion: ``entry``'s outputs are reused when it was made from
    the current source (same size, mtime, ctime and inode) and each output is on disk under
    ``dest`` with its recorded size (with ``verify``, also its checksum)."""
    if entry is None or entry["bytes"] != size_bytes \
            or any(entry.get(k) != v for k, v in source_identity.items()):
        return False
    try:
        for out in entry["outputs"]:
            if os.stat(Path(dest) / out["path"]).st_size != out["bytes"]:
                return False
            if verify and checksum(Path(dest) / out["path"]) != out["xxh3_128"]:
                return False
    except OSError:
        return False
    return bool(entry["outputs"])


def source_records(known: dict[str, dict[str, Any]], rels: list[str]) -> list[dict[str, Any]]:
    """The manifest's ``sources``: for each of ``rels``, its journal entry's identity and the
    paths of its outputs."""
    return [{"path": rel, "bytes": known[rel]["bytes"], **{k: known[rel][k] for k in IDENTITY},
             "convert": known[rel].get("convert", True),
             "outputs": [o["path"] for o in known[rel]["outputs"]]} for rel in rels]


def finish_files_recorded(job: Copy) -> set[str]:
    """Paths of the files ``finish_split`` wrote at the last conversion to this form (file
    lists), kept through the first prune so that a resumed stage does not count them pruned."""
    doc = load(job.dest)
    if doc is None or doc.get("to") != (job.convert.to if job.convert else None):
        return set()
    return {e["path"] for e in doc["files"] if e.get("from") is None}
