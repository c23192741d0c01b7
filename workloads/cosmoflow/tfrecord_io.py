"""TFRecord files as TensorFlow writes them, read without TensorFlow, CRCs verified.

Format (TensorFlow ``tensorflow/core/lib/io/record_writer.cc``; the ``TFRecordDataset`` docs): a
file is a sequence of records, each::

    uint64 length              little-endian
    uint32 masked_crc32c(length bytes)
    byte   data[length]        here a serialised ``tf.train.Example`` protocol buffer
    uint32 masked_crc32c(data)

with ``masked_crc(c) = ((c >> 15) | (c << 17)) + 0xa282ead8`` (mod 2**32), CRC-32C (Castagnoli).
A file may be GZIP-compressed as a whole (``compression_type='GZIP'``, as the MLCommons CosmoFlow
dataset ``cosmoUniverse_2019_05_4parE_tf_v2`` is distributed and as NVIDIA's
``tools/convert_tfrecord_to_gzip.py``, mlcommons/hpc_results_v3.0, writes it with Python's
``gzip``); that is detected from the GZIP magic bytes ``1f 8b``, never from the file name.

Why frames are read here and not with the ``tfrecord`` package's ``tfrecord_iterator``: that
iterator (tfrecord 1.14) reads both CRCs but never checks them, and for a GZIP file it first
decompresses the whole stream once to learn its length, then again to read it, so every file
would be inflated twice. Here a file is read into memory once, inflated once with zlib (which
releases the GIL, so threads overlap), its frames walked over one buffer and both CRCs checked
with the ``crc32c`` package (hardware CRC-32C instructions where the CPU has them). The Example
protocol buffers are still decoded with the ``tfrecord`` package's ``example_pb2`` (the
``tf.train.Example`` schema compiled for the ``protobuf`` runtime).
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path

import crc32c as _crc32c

from mlhpc.data.inputs import input_chunks, read_input
from mlhpc.errors import DataError

GZIP_MAGIC = b"\x1f\x8b"
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")
FRAME_OVERHEAD_BYTES = _HEADER.size + _FOOTER.size  # 16 bytes around each record's data
#: The largest TFRecord file the streamed check reads (a CosmoFlow file holds one to a few
#: 16 MiB samples).
MAX_FILE_BYTES = 1 << 40
#: Compressed bytes inflated at a time by the streamed check.
_BLOCK_BYTES = 1 << 16
#: Inflated bytes produced at a time when a GZIP file is read whole.
_INFLATE_PIECE_BYTES = 1 << 26
#: A GZIP file read whole may inflate to 64 times its size (`inflated_cap_bytes`) ...
INFLATED_RATIO_MAX = 64
#: ... and to 256 MiB whatever its size (small files of small, very regular cubes).
MIN_INFLATED_BYTES = 256 << 20


def masked_crc(data: bytes | memoryview) -> int:
    """The TFRecord masked CRC-32C of ``data`` (uint32)."""
    crc = _crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def is_gzip(path: Path) -> bool:
    """True when the file starts with the GZIP magic bytes. Raises OSError."""
    with open(path, "rb") as handle:
        return handle.read(2) == GZIP_MAGIC


def inflated_cap_bytes(compressed_bytes: int) -> int:
    """The most bytes a GZIP TFRecord file of ``compressed_bytes`` may inflate to when no index
    says how many it holds: 64 times the file, and at least `MIN_INFLATED_BYTES`. Counts deflate
    little (the mini's synthesised int16 cubes: 1.33 to 1 with gzip), a crafted stream up to 1032
    to 1 (DEFLATE's limit)."""
    return max(MIN_INFLATED_BYTES, INFLATED_RATIO_MAX * compressed_bytes)


def gunzip(raw: bytes | memoryview, path: Path, cap_bytes: int | None = None) -> bytes:
    """The inflated contents of a GZIP stream (every member, concatenated), counted while
    inflating against ``cap_bytes`` (default `inflated_cap_bytes` of the stream's size), so a
    small file that inflates to gigabytes is stopped at the cap.

    Raises:
        DataError: naming ``path``: the stream is corrupt, ends before its last member does
            (a truncated download or copy), or inflates past ``cap_bytes``.
    """
    cap = inflated_cap_bytes(len(raw)) if cap_bytes is None else cap_bytes
    parts: list[bytes] = []
    rest = memoryview(raw)
    while True:
        inflater = zlib.decompressobj(wbits=31)
        try:
            _inflate_member(inflater, rest, parts, cap, path)
        except zlib.error as exc:
            raise DataError(f"{path}: corrupt GZIP stream ({exc})") from None
        if not inflater.eof:
            raise DataError(f"{path}: truncated GZIP stream (ends after {len(raw)} compressed "
                            f"bytes before the end of its data); fetch or copy the file again")
        rest = memoryview(inflater.unused_data)
        if bytes(rest[:2]) != GZIP_MAGIC:
            if bytes(rest).strip(b"\0"):
                raise DataError(f"{path}: {len(rest)} bytes of garbage after the GZIP stream")
            break  # trailing zero padding after the last member is allowed, as gzip(1) does
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _inflate_member(inflater, data: memoryview, parts: list[bytes], cap: int, path: Path) -> None:
    """Inflate one GZIP member of ``data`` into ``parts`` in pieces, refusing past ``cap`` bytes
    in all (``parts`` included)."""
    total = sum(len(part) for part in parts)
    while True:
        piece = inflater.decompress(data, _INFLATE_PIECE_BYTES)
        total += len(piece)
        if total > cap:
            raise DataError(f"{path}: GZIP stream inflates to more than the {cap} bytes this "
                            "TFRecord file may hold; refused")
        parts.append(piece)
        data = inflater.unconsumed_tail
        if inflater.eof or (not data and len(piece) < _INFLATE_PIECE_BYTES):
            return


def read_file(path: Path, cap_bytes: int | None = None) -> bytes:
    """The TFRecord bytes of a file, read once by `mlhpc.data.inputs.read_input` (a regular file of at most
    `MAX_FILE_BYTES`: a FIFO refused, never waited on) and inflated when it is GZIP (at most
    ``cap_bytes``, default `inflated_cap_bytes` of the file's size). Raises DataError naming it."""
    raw = read_input(path, MAX_FILE_BYTES, what="TFRecord file", error=DataError)
    return gunzip(raw, path, cap_bytes) if raw[:2] == GZIP_MAGIC else raw


def records(data: bytes | memoryview, path: Path) -> Iterator[memoryview]:
    """Each record's data in a TFRecord buffer, both CRCs checked, as views into ``data``.

    Raises:
        DataError: naming ``path`` and the record (0-based): a header or data CRC mismatch, or a
            record that runs past the end of the file (truncated).
    """
    view = memoryview(data)
    offset, index, end = 0, 0, len(view)
    while offset < end:
        if end - offset < _HEADER.size:
            raise DataError(f"{path}: record {index}: truncated header ({end - offset} bytes left "
                            f"at byte {offset})")
        length, length_crc = _HEADER.unpack_from(view, offset)
        if masked_crc(view[offset:offset + 8]) != length_crc:
            raise DataError(f"{path}: record {index}: length CRC mismatch at byte {offset} "
                            f"(corrupt or not a TFRecord file)")
        start = offset + _HEADER.size
        stop = start + length
        if stop + _FOOTER.size > end:
            raise DataError(f"{path}: record {index}: truncated ({length} data bytes announced, "
                            f"{max(0, end - start - _FOOTER.size)} present)")
        payload = view[start:stop]
        (data_crc,) = _FOOTER.unpack_from(view, stop)
        if masked_crc(payload) != data_crc:
            raise DataError(f"{path}: record {index}: data CRC mismatch (the file is corrupt)")
        yield payload
        offset = stop + _FOOTER.size
        index += 1


def peek_first_length(path: Path) -> tuple[int, bool, int]:
    """``(data length of record 0, gzip?, uncompressed size mod 2**32 or file size)`` without
    reading the file: for GZIP, only the first block is inflated and the size comes from the
    stream's ISIZE trailer (RFC 1952), exact for one member under 4 GiB.

    Raises:
        DataError: naming ``path``: empty, unreadable, or a first header that is short or whose
            CRC does not match.
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            head = handle.read(65536)
            gz = head[:2] == GZIP_MAGIC
            if gz:
                if size < 18:
                    raise DataError(f"{path}: truncated GZIP stream ({size} bytes)")
                handle.seek(size - 4)
                (total,) = struct.unpack("<I", handle.read(4))
                try:
                    head = zlib.decompressobj(wbits=31).decompress(head, _HEADER.size)
                except zlib.error as exc:
                    raise DataError(f"{path}: corrupt GZIP stream ({exc})") from None
            else:
                total = size
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    if len(head) < _HEADER.size:
        raise DataError(f"{path}: empty or truncated TFRecord file (no record header)")
    length, length_crc = _HEADER.unpack_from(head, 0)
    if masked_crc(head[:8]) != length_crc:
        raise DataError(f"{path}: record 0: length CRC mismatch (corrupt or not a TFRecord file)")
    return length, gz, total


def count_frames(path: Path) -> int:
    """The number of records of an uncompressed TFRecord file, from its framing alone: every
    record's 12-byte header is read and its length CRC checked, the data and footer are skipped
    (a seek), and the frames must end exactly at the end of the file. Costs one small read per
    record: what a quick check can afford (the data CRCs need every byte: a full check).

    Raises:
        DataError: naming ``path`` and the record: a header cut short, a length CRC mismatch, or
            a record running past the end of the file (truncated).
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            offset = n = 0
            while offset < size:
                head = handle.read(_HEADER.size)
                if len(head) < _HEADER.size:
                    raise DataError(f"{path}: record {n}: truncated (header cut short at byte {offset})")
                length, length_crc = _HEADER.unpack(head)
                if masked_crc(head[:8]) != length_crc:
                    raise DataError(f"{path}: record {n}: length CRC mismatch at byte {offset} (corrupt)")
                offset += length + FRAME_OVERHEAD_BYTES
                if offset > size:
                    raise DataError(f"{path}: record {n}: truncated (runs past the end of the file)")
                handle.seek(offset)
                n += 1
    except OSError as exc:
        raise DataError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    return n


class _FrameWalk:
    """Record framing walked over a byte stream fed in pieces: each header's length CRC
    checked, each record's data CRC computed as its bytes pass (incremental CRC-32C, nothing
    kept) and checked against its footer, records counted."""

    def __init__(self, path: Path) -> None:
        self.path, self.records, self.offset = path, 0, 0
        self.head, self.foot = b"", b""  # the header and footer being read
        self.data_left, self.crc = 0, 0  # data bytes of the record still to come, their CRC

    def feed(self, piece: bytes) -> None:
        at = 0
        while at < len(piece):
            if self.data_left:
                step = min(self.data_left, len(piece) - at)
                self.crc = _crc32c.crc32c(piece[at:at + step], self.crc)
                self.data_left, at, self.offset = self.data_left - step, at + step, self.offset + step
            elif len(self.head) == _HEADER.size:  # header done, data done: the footer
                take = min(_FOOTER.size - len(self.foot), len(piece) - at)
                self.foot, at, self.offset = self.foot + piece[at:at + take], at + take, self.offset + take
                if len(self.foot) == _FOOTER.size:
                    self._check_data()
            else:
                take = min(_HEADER.size - len(self.head), len(piece) - at)
                self.head, at, self.offset = self.head + piece[at:at + take], at + take, self.offset + take
                if len(self.head) == _HEADER.size:
                    self._start_record()

    def _start_record(self) -> None:
        length, length_crc = _HEADER.unpack(self.head)
        if masked_crc(self.head[:8]) != length_crc:
            raise DataError(f"{self.path}: record {self.records}: length CRC mismatch at byte "
                            f"{self.offset - _HEADER.size} of the inflated stream (corrupt)")
        self.data_left, self.crc, self.foot = length, 0, b""

    def _check_data(self) -> None:
        (data_crc,) = _FOOTER.unpack(self.foot)
        if (((self.crc >> 15) | (self.crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF != data_crc:
            raise DataError(f"{self.path}: record {self.records}: data CRC mismatch (the file is "
                            "corrupt; its GZIP stream is intact, so it was written so: make it again)")
        self.head, self.foot, self.records = b"", b"", self.records + 1

    def finish(self) -> int:
        if self.head or self.foot or self.data_left:
            raise DataError(f"{self.path}: record {self.records}: truncated "
                            "(runs past the end of the inflated stream)")
        return self.records


def count_gzip_frames(path: Path) -> int:
    """The number of records of a GZIP TFRecord file, its stream inflated once, `_BLOCK_BYTES`
    of it at a time (output discarded): every GZIP member's CRC-32 and size trailer (RFC 1952)
    verified by zlib, every record's header read and its length CRC checked, and every record's
    data CRC-32C computed in the same pass and checked against its footer (every byte is
    inflated anyway: the CRC costs little more), the frames ending exactly where the inflated
    data do (`count_frames`'s checks, inside the stream).

    Raises:
        DataError: naming ``path``: refused by `mlhpc.data.inputs` (a link out of its folder, not a
            regular file), a corrupt or truncated stream, a GZIP CRC or size mismatch, bytes
            after the last member, the framing errors of `count_frames`, or a record's data CRC
            mismatch (naming the record).
    """
    walk = _FrameWalk(path)
    blocks = input_chunks(path, MAX_FILE_BYTES, Path(path).parent, "TFRecord file", DataError,
                          chunk_bytes=_BLOCK_BYTES)
    try:
        for piece in _inflated(blocks, path):
            walk.feed(piece)
    finally:
        blocks.close()
    return walk.finish()


def _inflated(blocks: Iterator[bytes], path: Path) -> Iterator[bytes]:
    """The inflated bytes of every GZIP member read from ``blocks`` (the file's bytes, at most
    `_BLOCK_BYTES` a piece), one piece per block (at most 1032 times it: deflate's largest
    ratio). Raises DataError as `count_gzip_frames`."""
    inflater, block = zlib.decompressobj(wbits=31), b""
    while True:
        block = block or next(blocks, b"")
        if not block:
            raise DataError(f"{path}: truncated GZIP stream (ends before the end of its data); "
                            "fetch or copy the file again")
        try:
            piece = inflater.decompress(block)
        except zlib.error as exc:
            raise DataError(f"{path}: corrupt GZIP stream ({exc})") from None
        yield piece
        block = b""
        if inflater.eof:  # the member's CRC-32 and size matched; another member may follow
            block = inflater.unused_data
            while len(block) < 2:
                more = next(blocks, b"")
                if not more:
                    break
                block += more
            if block[:2] != GZIP_MAGIC:
                _only_padding(blocks, block, path)
                return
            inflater = zlib.decompressobj(wbits=31)


def _only_padding(blocks: Iterator[bytes], tail: bytes, path: Path) -> None:
    """Raise DataError unless ``tail`` and the rest of ``blocks`` are zero bytes (the padding
    gzip(1) allows after the last member)."""
    while tail:
        if tail.strip(b"\0"):
            raise DataError(f"{path}: bytes of garbage after the GZIP stream")
        tail = next(blocks, b"")
