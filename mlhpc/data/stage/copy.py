"""Staging, the copy strategy: each planned file read once, hashed (XXH3-128), written under a
temporary name through directory descriptors that follow no link, read back (``verify``) and
renamed into place; each finished file journalled.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any, Callable, Optional

from mlhpc.data import pool
from mlhpc.data.checksums import checksum, new_digest, thread_buffers
from mlhpc.data.files import (
    copy_mode,
    dest_error,
    open_dir,
    open_root,
    part_path,
    reason,
)
from mlhpc.data.manifest import Journal, identity
from mlhpc.data.stage.dest import open_parents
from mlhpc.data.stage.job import Copy, Counts
from mlhpc.data.stage.plan import Planned
from mlhpc.data.trees import resolved
from mlhpc.errors import StagingError


def copy_share(job: Copy, share: list[Planned], known: dict[str, dict[str, Any]], counts: Counts) -> None:
    """Copy (or verify and skip) every file of ``share`` with ``job.workers`` threads; adds to ``counts``."""
    if not share:
        return
    folders = open_parents(job.dest, share)  # each destination folder opened once, no link followed
    journal = Journal(job.dest, job.host)
    src_root = str(resolved(job.source))
    lock = threading.Lock()

    def one(item: Planned) -> None:
        entry = known.get(item.rel)
        if entry is not None and _still_good(job.dest / item.rel, item, entry, job.verify):
            with lock:
                counts.skipped_files += 1
            return
        dst = job.dest / item.rel
        size, digest = copy_file(job.source / item.rel, dst, job.host, job.verify, folders[dst.parent])
        journal.add({"path": item.rel, "bytes": size, "xxh3_128": digest,
                     **identity(item), "source": src_root})
        with lock:
            counts.copied_files += 1
            counts.copied_bytes += size

    try:
        run_all(one, share, job.workers)
    finally:
        journal.close()
        for fd in folders.values():
            os.close(fd)


def run_all(task: Callable[[Planned], None], items: list[Planned], workers: int) -> None:
    """``task`` on every item with ``workers`` threads (`mlhpc.data.pool.run_all`, the one
    parallel driver); the first failure cancels what has not started and is raised."""
    for _ in pool.run_all(task, [(item,) for item in items], workers, kind="thread"):
        pass

def _still_good(dst: Path, item: Planned, entry: dict[str, Any], verify: bool) -> bool:
    """The recorded copy is of the current source (same size, mtime, ctime and inode: a rewrite
    that keeps size and mtime still moves the ctime) and is intact on disk."""
    if entry["bytes"] != item.size_bytes or any(entry[k] != v for k, v in identity(item).items()):
        return False
    try:
        if os.stat(dst).st_size != item.size_bytes:
            return False
        return not verify or checksum(dst) == entry["xxh3_128"]
    except OSError:
        return False


def copy_file(src: Path, dst: Path, host: str, verify: bool = True,
              root: Optional[Path | int] = None) -> tuple[int, str]:
    """Copy ``src`` to ``dst`` through a temporary name; ``(bytes, XXH3-128 hex)`` of the bytes
    read from ``src``.

    One pass: each chunk is read once, hashed, written, and with ``verify`` read back from the
    destination at its offset and compared byte for byte with what was hashed -- as strong as
    hashing the finished copy again, for one hash per byte instead of two.

    Never through a link: the destination folder is opened component by component below
    ``root`` (default: ``dst``'s own folder; an int: a descriptor of ``dst``'s folder already
    opened that way, left open) with ``O_NOFOLLOW``, the temporary file is created
    there with ``O_EXCL | O_NOFOLLOW`` and renamed within that folder, so a link planted anywhere
    in the destination makes the copy fail instead of writing elsewhere. The copy gets the
    source's read/write permission bits at most (`mlhpc.data.files.copy_mode`).

    Raises:
        StagingError: the source cannot be read; the destination is a link, full, read-only, or
            does not read back as written (named, with the source).
    """
    tmp = part_path(dst)
    try:
        fin = open(src, "rb", buffering=0)
    except OSError as exc:
        raise StagingError(f"{src}: cannot read source file ({reason(exc)})") from None
    with fin:
        dir_fd = root if isinstance(root, int) else _open_parent(dst, root, src)
        try:
            size, digest = _copy_into(fin, dir_fd, tmp, verify, src)
            try:
                os.replace(tmp.name, dst.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                raise dest_error(dst, exc, src) from None
        except BaseException:
            _unlink_at(dir_fd, tmp.name)
            raise
        finally:
            if not isinstance(root, int):
                os.close(dir_fd)
    return size, digest


def _open_parent(dst: Path, root: Optional[Path], src: Path) -> int:
    """A descriptor of ``dst``'s folder, opened without following any link below ``root``."""
    try:
        if root is None:
            return open_root(dst.parent)
        root_fd = open_root(root)
        try:
            return open_dir(root_fd, dst.parent.relative_to(root).parts, create=False)
        finally:
            os.close(root_fd)
    except OSError as exc:
        raise StagingError(f"{dst.parent}: staging destination folder cannot be opened without "
                           f"following a link ({reason(exc)}; copying {src})") from None


def _unlink_at(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _copy_into(fin: Any, dir_fd: int, tmp: Path, verify: bool, src: Path) -> tuple[int, str]:
    """Write ``fin``'s bytes to a new file ``tmp.name`` in ``dir_fd``; ``(bytes, hex digest)``."""
    mode = copy_mode(os.fstat(fin.fileno()).st_mode)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        try:
            fd = os.open(tmp.name, flags, mode, dir_fd=dir_fd)
        except FileExistsError:  # a leftover of this very host and pid (a recycled pid), or a link
            os.unlink(tmp.name, dir_fd=dir_fd)
            fd = os.open(tmp.name, flags, mode, dir_fd=dir_fd)
    except OSError as exc:
        raise dest_error(tmp, exc, src) from None
    digest = new_digest()
    size = 0
    buf, back = thread_buffers()
    view, back_view = memoryview(buf), memoryview(back)
    try:
        while True:
            try:
                n = fin.readinto(buf)
            except OSError as exc:
                raise StagingError(f"{src}: cannot read source file ({reason(exc)})") from None
            if not n:
                break
            digest.update(view[:n])
            write_all(fd, view[:n], tmp, src)
            if verify:
                _check_written(fd, view[:n], back_view, size, tmp, src)
            size += n
    finally:
        os.close(fd)
    return size, digest.hexdigest()


def _check_written(fd: int, chunk: memoryview, back_view: memoryview, offset: int, tmp: Path, src: Path) -> None:
    """Read ``len(chunk)`` bytes at ``offset`` back from ``fd`` into ``back_view``; they must equal
    ``chunk`` (the head of a buffer as large as ``back_view``'s)."""
    n = len(chunk)
    try:
        got = os.preadv(fd, [back_view[:n]], offset)
    except OSError as exc:
        raise StagingError(f"{tmp}: cannot read back staged file ({reason(exc)})") from None
    whole = memoryview(chunk.obj)  # type: ignore[arg-type]
    if n < len(whole):
        back_view[n:] = whole[n:]  # same tail in both, so one whole-buffer memcmp decides
    if got != n or chunk.obj != back_view.obj:
        raise StagingError(f"{tmp}: staged copy does not read back as written (copying {src})")


def write_all(fd: int, data: memoryview, path: Path, src: Path) -> None:
    while len(data):
        try:
            written = os.write(fd, data)
        except OSError as exc:
            raise dest_error(path, exc, src) from None
        data = data[written:]
