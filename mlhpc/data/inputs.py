"""The input reader: every file mlhpc reads that a user, a published tree or a run folder supplies
(logs, side files, power logs, system descriptions, configs, raw inputs) is opened here.

A file is refused, with one line naming it and why (`InputRefused`, or the caller's error class):

- when it is, or is reached through, a symbolic link whose target lies outside ``root`` (the
  tree it was found in; the real path of the opened descriptor is checked after opening, so a
  link swapped in between is caught too);
- when it is not a regular file (a FIFO is opened non-blocking and refused, never waited on; a
  device, socket or folder likewise);
- when it holds more than ``cap_bytes`` (its size, and the bytes actually read, so a file that
  grows while read is caught).

Without ``root`` a path the user named directly is read, links and all, under the same file-kind
and size rules. See docs/architecture.md, "The data layer".
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mlhpc.data.files import reason
from mlhpc.data.statefiles import file_kind
from mlhpc.data.trees import descriptor_path, is_under, resolved
from mlhpc.errors import DataError, MlhpcError
from mlhpc.text import clip

#: A side file (JSON or YAML beside a log, a system description, a config): at most 16 MiB.
SIDE_FILE_BYTES = 16 << 20
#: The most bytes `inflated_chunks` yields at once.
_INFLATE_PIECE_BYTES = 1 << 20
_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC


class InputRefused(DataError):
    """A file mlhpc was asked to read is refused: a link out of its tree, not a regular file, or
    over its size cap (the message names the file and which)."""


def open_input(path: Path | str, cap_bytes: int, root: Path | str | None = None,
               what: str = "file", error: type[MlhpcError] = InputRefused) -> int:
    """A read-only descriptor of the regular file ``path`` (the caller closes it; reads must stop
    at ``cap_bytes``).

    Args:
        cap_bytes: the most bytes the file may hold.
        root: the tree ``path`` was found in: the file's real path must lie inside it.
        what: the file's role in messages (``"result log"``, ``"power log"``, ...).
        error: the error class raised (default `InputRefused`, a `DataError`).

    Raises:
        error: missing or unreadable, a link out of ``root``, not a regular file, or over
            ``cap_bytes`` (one line naming ``path``).
    """
    path = Path(path)
    top = Path(os.path.realpath(root)) if root is not None else None
    if top is not None and os.path.islink(path) and not is_under(resolved(path), top):
        raise error(f"{what} is a symbolic link out of {root} (to {resolved(path)}); refused", path=path)
    try:
        fd = os.open(path, _FLAGS)
    except OSError as exc:
        why = "a symbolic link loop" if exc.errno == errno.ELOOP else reason(exc)
        raise error(f"cannot read {what} ({why})", path=path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{what} is {file_kind(info.st_mode)}, not a regular file; refused", path=path)
        if top is not None and not is_under(descriptor_path(fd, path), top):
            raise error(f"{what} is a symbolic link out of {root}; refused", path=path)
        if info.st_size > cap_bytes:
            raise error(f"{what} of {info.st_size} bytes, over the {cap_bytes} bytes "
                        f"a {what} may hold; refused", path=path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def input_chunks(path: Path | str, cap_bytes: int, root: Path | str | None = None,
                 what: str = "file", error: type[MlhpcError] = InputRefused,
                 chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of ``path`` read through `open_input` (same arguments and errors), in pieces of
    at most ``chunk_bytes``, at most ``cap_bytes`` in all: for a reader that hashes or inflates
    as it goes rather than holding the file. The file is closed when the iteration ends or is
    abandoned.

    Raises:
        error: as `open_input`; a file that grew past the cap while read, or a read that fails
            (one line naming ``path``).
    """
    fd = open_input(path, cap_bytes, root, what, error)
    try:
        total = 0
        while chunk := os.read(fd, min(chunk_bytes, cap_bytes + 1 - total) or 1):
            total += len(chunk)
            if total > cap_bytes:
                raise error(f"{what} grew past the {cap_bytes} bytes a {what} may hold "
                            "while read; refused", path=path)
            yield chunk
    except OSError as exc:
        raise error(f"cannot read {what} ({reason(exc)})", path=path) from None
    finally:
        os.close(fd)


def inflated_chunks(path: Path | str, cap_bytes: int, inflated_cap_bytes: int,
                    root: Path | str | None = None, what: str = "file",
                    error: type[MlhpcError] = InputRefused) -> Iterator[bytes]:
    """The bytes a GZIP file (one member or several, as ``gzip.decompress`` reads) inflates to,
    in pieces of at most 1 MiB: the file read through `input_chunks` (same ``cap_bytes``,
    ``root``, ``what``, ``error``), its inflated bytes counted while inflating and refused past
    ``inflated_cap_bytes``, so a small file that inflates to much is stopped at the cap, never
    held (RFC 1952; Python's ``zlib`` with ``wbits=31``).

    Raises:
        error: as `input_chunks`; inflated bytes over ``inflated_cap_bytes``; not GZIP data, or
            data that end inside a member (a truncated file), one line naming ``path``.
    """
    inflater, fed, total = zlib.decompressobj(wbits=31), False, 0
    try:
        for data in input_chunks(path, cap_bytes, root, what, error):
            while True:
                piece = inflater.decompress(data, _INFLATE_PIECE_BYTES)
                fed, total = True, total + len(piece)
                if total > inflated_cap_bytes:
                    raise error(f"{what} inflates to more than the {inflated_cap_bytes} "
                                f"bytes a {what} may hold; refused", path=path)
                if piece:
                    yield piece
                if inflater.eof:  # a member ends; another may follow
                    data, inflater, fed = inflater.unused_data, zlib.decompressobj(wbits=31), False
                    if not data:
                        break
                else:  # a full piece may leave output held back: ask again
                    data = inflater.unconsumed_tail
                    if not data and len(piece) < _INFLATE_PIECE_BYTES:
                        break
    except zlib.error as exc:
        raise error(f"{what} is not readable GZIP data ({exc})", path=path) from None
    if fed and not inflater.eof:
        raise error(f"{what} ends inside its GZIP stream (a truncated file?)", path=path)


#: ZIP compression methods (PKWARE APPNOTE.TXT 4.4.5): stored and DEFLATE, the two that
#: ``torch.save`` (stored) and ``numpy.savez_compressed`` (DEFLATE) write.
_ZIP_STORED, _ZIP_DEFLATED = 0, 8
#: A ZIP local file header (APPNOTE.TXT 4.3.7): 30 bytes, the name's and extra field's lengths last.
_ZIP_LOCAL_HEADER = struct.Struct("<4s5H3L2H")


@dataclass(frozen=True)
class ZipReading:
    """How `zip_input` reads one ZIP archive.

    Attributes:
        cap_bytes: the most bytes the file may hold (`open_input`'s cap).
        inflated_cap_bytes: the most bytes its members may declare together (their sizes in the
            central directory: what a reader allocates).
        root: the tree the file must lie in (`open_input`'s); None: a path the user named.
        what: the file's kind, as messages name it ("checkpoint").
        error: the class of every refusal.
        compressed: whether a DEFLATE member is valid; False: stored members only (a torch
            checkpoint: ``torch.save`` writes every member stored).
    """

    cap_bytes: int
    inflated_cap_bytes: int
    root: Path | str | None = None
    what: str = "file"
    error: type[MlhpcError] = InputRefused
    compressed: bool = True

    def refused(self, path: Path | str, detail: str) -> MlhpcError:
        """The refusal ``PATH: DETAIL`` of class `error`."""
        return self.error(detail, path=path)


def zip_input(path: Path | str, reading: ZipReading) -> BinaryIO:
    """A ZIP archive (a torch checkpoint, NumPy's ``.npz``) opened through `open_input` (its
    ``cap_bytes``, ``root``, ``what`` and ``error`` from ``reading``), its members checked before
    anything reads them, so that what a reader (``torch.load``, ``numpy.load``) later allocates
    for them was counted here, whatever the file's own size:

    - its members together declare at most ``reading.inflated_cap_bytes``;
    - a stored member holds the bytes it declares, inside the file;
    - a DEFLATE member is inflated here, in pieces of at most 1 MiB counted and never held, and
      refused once it inflates past the size it declares; with ``reading.compressed`` False (a
      torch checkpoint, whose members each take at most the memory its file's bytes say) it is
      refused outright, before anything is inflated;
    - any other method, or a file that is not a ZIP archive, is refused.

    Returns:
        the open file, at its start (the caller closes it).

    Raises:
        reading.error: as `open_input`, or for each refusal above (one line naming ``path``).
    """
    fd = open_input(path, reading.cap_bytes, reading.root, reading.what, reading.error)
    handle = os.fdopen(fd, "rb")
    try:
        size = os.fstat(fd).st_size
        for info in _zip_members(handle, Path(path), size, reading):
            _check_member(handle, info, Path(path), size, reading)
        handle.seek(0)
    except OSError as exc:  # a read that fails (EIO): named, not a traceback
        handle.close()
        raise reading.refused(path, f"cannot read {reading.what} ({reason(exc)})") from None
    except BaseException:
        handle.close()
        raise
    return handle


def _zip_members(handle: BinaryIO, path: Path, size: int, reading: ZipReading) -> list[zipfile.ZipInfo]:
    """The members of the archive ``handle`` (``size`` bytes), refused unless zipfile parses its
    central directory and their declared sizes fit ``reading.inflated_cap_bytes``."""
    what, cap = reading.what, reading.inflated_cap_bytes
    try:
        members = zipfile.ZipFile(handle).infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, struct.error, OSError, ValueError, EOFError,
            NotImplementedError) as exc:  # the ways zipfile finds a file damaged
        why = "an empty file" if size == 0 else f"not a ZIP archive: {clip(str(exc), 80)}"
        raise reading.refused(path, f"cannot read {what} ({why})") from None
    declared = sum(info.file_size for info in members)
    if declared > cap:
        raise reading.refused(path, f"{what} members declare {declared} bytes once read, over the "
                                    f"{cap} bytes a {what} may take; refused")
    return members


def _check_member(handle: BinaryIO, info: zipfile.ZipInfo, path: Path, size: int,
                  reading: ZipReading) -> None:
    """Refuse the member ``info`` unless its method is allowed, its local header lies in the
    file, a stored member's bytes are inside it and a DEFLATE member inflates to its size."""
    what, name = reading.what, clip(info.filename, 80)
    if info.compress_type == _ZIP_DEFLATED and not reading.compressed:
        raise reading.refused(path, f"{what} member {name} is compressed (DEFLATE), not stored as "
                                    f"torch.save writes every member, so it could take more memory "
                                    f"than the file's {size} bytes; refused")
    if info.compress_type not in (_ZIP_STORED, _ZIP_DEFLATED):
        raise reading.refused(path, f"{what} member {name} is compressed with ZIP method "
                                    f"{info.compress_type}, neither stored nor DEFLATE; refused")
    head = b""
    if 0 <= info.header_offset <= size - _ZIP_LOCAL_HEADER.size:
        handle.seek(info.header_offset)
        head = handle.read(_ZIP_LOCAL_HEADER.size)
    if len(head) < _ZIP_LOCAL_HEADER.size or head[:4] != b"PK\x03\x04":
        raise reading.refused(path, f"{what} member {name}: no ZIP header at byte "
                                    f"{info.header_offset}; refused")
    start = info.header_offset + len(head) + sum(_ZIP_LOCAL_HEADER.unpack(head)[-2:])
    if start + info.compress_size > size or (
            info.compress_type == _ZIP_STORED and info.compress_size != info.file_size):
        raise reading.refused(path, f"{what} member {name} declares {info.file_size} bytes that "
                                    "the file does not hold; refused")
    if info.compress_type == _ZIP_DEFLATED:
        handle.seek(start)
        _count_inflated(handle, info, path, reading)


def _count_inflated(handle: BinaryIO, info: zipfile.ZipInfo, path: Path, reading: ZipReading) -> None:
    """Inflate the DEFLATE member ``info`` (raw, RFC 1951) from where ``handle`` stands, in
    pieces, discarding them, and refuse it once its bytes pass what it declares, or unless they
    end exactly there."""
    what, name = reading.what, clip(info.filename, 80)
    inflater, left, total = zlib.decompressobj(wbits=-15), info.compress_size, 0
    try:
        while left and not inflater.eof:
            data = handle.read(min(left, _INFLATE_PIECE_BYTES))
            if not data:
                break
            left -= len(data)
            while True:
                piece = inflater.decompress(data, _INFLATE_PIECE_BYTES)
                total += len(piece)
                if total > info.file_size:
                    raise reading.refused(path, f"{what} member {name} inflates past the "
                                                f"{info.file_size} bytes it declares; refused")
                data = inflater.unconsumed_tail
                if not data and len(piece) < _INFLATE_PIECE_BYTES:
                    break
    except zlib.error as exc:
        raise reading.refused(path, f"{what} member {name} is not readable DEFLATE data ({exc})") from None
    if not inflater.eof or total != info.file_size:
        raise reading.refused(path, f"{what} member {name} inflates to {total} bytes, not the "
                                    f"{info.file_size} it declares (a damaged file?); refused")


def read_input(path: Path | str, cap_bytes: int, root: Path | str | None = None,
               what: str = "file", error: type[MlhpcError] = InputRefused) -> bytes:
    """The bytes of ``path`` read through `open_input` (same arguments and errors), at most
    ``cap_bytes`` of them: a file that grew past the cap while read is refused too."""
    return b"".join(input_chunks(path, cap_bytes, root, what, error))


def read_text_input(path: Path | str, cap_bytes: int = SIDE_FILE_BYTES,
                    root: Path | str | None = None, what: str = "file",
                    error: type[MlhpcError] = InputRefused) -> str:
    """`read_input` decoded as UTF-8 (undecodable bytes replaced)."""
    return read_input(path, cap_bytes, root, what, error).decode("utf-8", errors="replace")


def journal_objects(folder: Path | str, pattern: str, cap_bytes: int) -> Iterator[dict[str, Any]]:
    """Every JSON object in the JSON Lines journals ``pattern`` at the top of ``folder``, journal
    by journal in name order, each read through `read_text_input` inside ``folder`` (at most
    ``cap_bytes``); unreadable journals and lines torn by an interruption are passed over."""
    for journal in sorted(Path(folder).glob(pattern)):
        try:
            lines = read_text_input(journal, cap_bytes, folder, "journal").splitlines()
        except DataError:
            continue
        for line in lines:
            try:
                entry = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a line torn by an interruption, or nested past what json reads
            if isinstance(entry, dict):
                yield entry


def read_json_object(path: Path | str, what: str = "file") -> dict[str, Any]:
    """The JSON object in ``path``, read through `read_text_input` under its own folder, or ``{}``
    where it cannot be read (refused, missing), is not JSON, or is not an object: for a side
    record whose absence or damage means nothing was recorded (a resume claim, a run's side
    files)."""
    try:
        value = json.loads(read_text_input(path, root=Path(path).parent, what=what))
    except (DataError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def input_problem(path: Path | str, cap_bytes: int, root: Path | str | None = None,
                  what: str = "file") -> str | None:
    """Why `open_input` would refuse ``path`` (its one-line message), or None when it would
    open it: for callers that skip a refused file with a warning instead of stopping."""
    try:
        os.close(open_input(path, cap_bytes, root, what))
    except InputRefused as exc:
        return str(exc)
    return None


# ---- walking a source tree ---------------------------------------------------------------------


def walk_files(root: Path, error: type[MlhpcError], follow_links: bool = False
               ) -> Iterator[tuple[str, os.stat_result]]:
    """``(relative POSIX path, stat)`` of every regular file under ``root``, never following a
    link out of it.

    A symbolic link (to a file or a folder) is refused with ``error`` naming it, unless
    ``follow_links``: then a link whose target (resolved) lies inside ``root`` is read as its
    target, and any other link is still refused. FIFOs, sockets and devices are skipped.

    Raises:
        error: a link (as above), or a folder that cannot be listed.
    """
    root = Path(root)
    top = resolved(root)
    yield from _walk(root, "", top, error, follow_links)


def _walk(folder: Path, prefix: str, top: Path, error: type[MlhpcError], follow: bool
          ) -> Iterator[tuple[str, os.stat_result]]:
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError as exc:
        raise error(f"cannot list folder ({reason(exc)})", path=folder) from None
    for entry in entries:
        rel = prefix + entry.name
        path = Path(entry.path)
        try:
            if entry.is_symlink():
                _check_link(path, top, error, follow)
            st = os.stat(path)
        except OSError as exc:
            raise error(f"cannot stat ({reason(exc)})", path=path) from None
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(path, rel + "/", top, error, follow)
        elif stat.S_ISREG(st.st_mode):
            yield rel, st


def _check_link(path: Path, top: Path, error: type[MlhpcError], follow: bool) -> None:
    target = resolved(path)
    if not follow:
        raise error(f"symbolic link in the source (to {os.readlink(path)}); links are not "
                    "followed (copy the file, or allow links to files inside the source with "
                    "--set data.staging.follow_links=true)", path=path)
    if not is_under(target, top) or target == top:
        raise error(f"symbolic link points outside the source tree (to {target}); refused", path=path)
    if target.is_dir():
        raise error(f"symbolic link to a folder ({target}); a linked folder would be read "
                    "twice, so it is refused even with data.staging.follow_links=true", path=path)
