"""Verify an LMDB file's page structure before liblmdb maps it.

liblmdb reads through a memory map and trusts every page number and offset on disk: one changed
byte in a branch node's child, a leaf's overflow page or a node offset sends it past the end of
the file, and the process dies of SIGBUS with no message. `verify_pages` walks the tree the
newest meta page names, reading the file through Python's bounds-checked ``mmap``, and checks
each pointer liblmdb would follow: a page number inside the file, a page of the expected kind
naming itself, node offsets and sizes inside their page, overflow runs inside the file. A file
that fails is refused (`DataError`, naming it and the page) before liblmdb touches it.

Layout followed: liblmdb's ``mdb.c`` (LMDB 0.9, 64-bit): 16-byte page header ``mp_pgno`` (u64),
``mp_pad`` (u16), ``mp_flags`` (u16), ``mp_lower``/``mp_upper`` (u16, u16) or ``mp_pages`` (u32);
``MDB_meta`` after the header of pages 0 and 1 (``mm_magic`` 0xBEEFC0DE, page size in the free
DB's ``md_pad``, main DB root at offset 128, ``mm_last_pg`` 136, ``mm_txnid`` 144); a node is
``mn_lo, mn_hi, mn_flags, mn_ksize`` (u16 each) then the key and data.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

from mlhpc.data.inputs import open_input
from mlhpc.errors import DataError

#: The largest LMDB file read (OC20's largest published file is about 20 GB).
MAX_FILE_BYTES = 1 << 40
HEADER_BYTES = 16
MAGIC = 0xBEEFC0DE
P_BRANCH, P_LEAF, P_OVERFLOW, P_META = 0x01, 0x02, 0x04, 0x08
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04
INVALID_PAGE = (1 << 64) - 1
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")
_KIND = {P_BRANCH | P_LEAF: "branch or leaf", P_OVERFLOW: "overflow"}


class _Pages:
    """The file's bytes (bounds-checked) and its page size and count."""

    def __init__(self, data: mmap.mmap, psize: int, path: Path) -> None:
        self.data, self.psize, self.path = data, psize, path
        self.count = len(data) // psize

    def bad(self, pgno: int, what: str) -> DataError:
        return DataError(f"corrupt LMDB file (page {pgno}: {what}); refused before "
                         "reading it", path=self.path)

    def header(self, pgno: int, kinds: int) -> tuple[int, int, int]:
        """``(flags, lower, upper)`` of page ``pgno``, which must be inside the file, name
        itself and be one of ``kinds``."""
        if not 2 <= pgno < self.count:
            raise self.bad(pgno, f"outside the file's {self.count} pages")
        base = pgno * self.psize
        if _U64.unpack_from(self.data, base)[0] != pgno:
            raise self.bad(pgno, "its header names another page")
        flags = _U16.unpack_from(self.data, base + 10)[0]
        kind = flags & 0x6F  # P_DIRTY (0x10) and the in-memory high bits aside
        if kind not in (P_BRANCH, P_LEAF, P_OVERFLOW) or not kind & kinds:
            raise self.bad(pgno, f"page flags {flags:#x} where a {_KIND[kinds]} page belongs")
        lower, upper = _U16.unpack_from(self.data, base + 12)[0], _U16.unpack_from(self.data, base + 14)[0]
        return flags, lower, upper


def _meta(data: mmap.mmap, base: int) -> tuple[int, int, int, int] | None:
    """``(txnid, page size, main root, last page)`` of the meta page at ``base``, or None."""
    if len(data) < base + 152 or _U32.unpack_from(data, base + 16)[0] != MAGIC:
        return None
    return (_U64.unpack_from(data, base + 144)[0], _U32.unpack_from(data, base + 40)[0],
            _U64.unpack_from(data, base + 128)[0], _U64.unpack_from(data, base + 136)[0])


def _nodes(pages: _Pages, pgno: int, lower: int, upper: int):
    """``(offset in file, flags, lo|hi, key size)`` of each node of a branch or leaf page."""
    psize, base = pages.psize, pgno * pages.psize
    if not HEADER_BYTES <= lower <= upper <= psize:
        raise pages.bad(pgno, f"free space {lower}..{upper} outside the page")
    for i in range((lower - HEADER_BYTES) // 2):
        at = _U16.unpack_from(pages.data, base + HEADER_BYTES + 2 * i)[0]
        if not upper <= at <= psize - 8:
            raise pages.bad(pgno, f"node {i} at offset {at}, outside the page's nodes")
        lo, hi, flags, ksize = struct.unpack_from("<4H", pages.data, base + at)
        if at + 8 + ksize > psize:
            raise pages.bad(pgno, f"node {i}'s key runs past the page")
        yield base + at, flags, lo | hi << 16, ksize


def _leaf(pages: _Pages, pgno: int, lower: int, upper: int) -> None:
    for at, flags, size, ksize in _nodes(pages, pgno, lower, upper):
        if flags & (F_SUBDATA | F_DUPDATA):
            raise pages.bad(pgno, "a sub-database or duplicate-sorted node, which no OC20 file holds")
        end = at - pgno * pages.psize + 8 + ksize
        if not flags & F_BIGDATA:
            if end + size > pages.psize:
                raise pages.bad(pgno, f"a value of {size} bytes runs past the page")
            continue
        if end + 8 > pages.psize:
            raise pages.bad(pgno, "an overflow page number runs past the page")
        first = _U64.unpack_from(pages.data, at + 8 + ksize)[0]
        pages.header(first, P_OVERFLOW)
        run = _U32.unpack_from(pages.data, first * pages.psize + 12)[0]
        if first + run > pages.count or size > run * pages.psize - HEADER_BYTES:
            raise pages.bad(first, f"an overflow run of {run} pages for {size} bytes passes the file's end")


def verify_pages(path: Path) -> None:
    """Check every page pointer of the LMDB file ``path`` liblmdb would follow (module doc).

    Raises:
        DataError: refused by `mlhpc.data.inputs` (a FIFO, a link out of its folder), no valid meta page, a page size that is not a power of two in 512..65536,
            or any pointer out of its page or the file (names the file and page).
    """
    fd = open_input(path, MAX_FILE_BYTES, Path(path).parent, "LMDB file", DataError)
    try:
        size = os.fstat(fd).st_size
        if size < 2 * 512:
            raise DataError(f"not a readable LMDB file ({size} bytes)", path=path)
        with mmap.mmap(fd, size, access=mmap.ACCESS_READ) as data:
            _verify(data, path)
    finally:
        os.close(fd)


def _verify(data: mmap.mmap, path: Path) -> None:
    first = _meta(data, 0)
    psize = first[1] if first else 0
    if first is None or psize < 512 or psize > 65536 or psize & (psize - 1):
        raise DataError("not a readable LMDB file (no valid meta page)", path=path)
    metas = [m for m in (first, _meta(data, psize)) if m is not None]
    _, _, root, last = max(metas, key=lambda m: m[0])
    pages = _Pages(data, psize, path)
    if last >= pages.count:
        raise DataError(f"truncated LMDB file ({len(data)} bytes, its pages need {(last + 1) * psize})", path=path)
    if root == INVALID_PAGE:
        return
    todo, seen = [root], set()
    while todo:
        pgno = todo.pop()
        if pgno in seen:
            raise pages.bad(pgno, "reached twice (a cycle)")
        seen.add(pgno)
        flags, lower, upper = pages.header(pgno, P_BRANCH | P_LEAF)
        if flags & P_BRANCH:
            todo += [lo_hi | node_flags << 32 for _, node_flags, lo_hi, _ in _nodes(pages, pgno, lower, upper)]
        else:
            _leaf(pages, pgno, lower, upper)
