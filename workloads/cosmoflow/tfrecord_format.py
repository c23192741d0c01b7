"""CosmoFlow's TFRecord form (`formats` describes every form): one ``tf.train.Example`` per
record, feature ``x`` the bytes of int16 counts ``(S, S, S, 4)``, feature ``y`` 4 floats; GZIP or
plain, CRCs verified (`tfrecord_io`). Written by mlcommons/hpc ``cosmoflow/prepare.py``
(``write_record``), read by its ``cosmoflow/data/cosmo.py`` ``_parse_data``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlhpc.errors import DataError

from . import tfrecord_io
from .formats import (
    DATA_LIST,
    DECODED_CACHE_BYTES,
    N_CHANNELS,
    N_TARGETS,
    TFRECORD_SUFFIXES,
    FileInfo,
    Source,
    _list_file,
    _present,
    _try_identity,
    check_counts,
    check_targets,
    cube_of,
    stem,
)


def decode_examples(path: Path, cube: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every Example of a TFRecord file (GZIP or plain): counts int16 ``(n, S, S, S, 4)`` and
    targets float32 ``(n, 4)``; counts >= 0 and finite targets are checked.

    Layout of mlcommons/hpc ``cosmoflow/prepare.py``; decoding as ``cosmo.py`` ``_parse_data``.

    Raises:
        DataError: naming the file and record: unreadable, truncated or corrupt GZIP, CRC
            mismatch, not an Example, feature ``x`` or ``y`` missing or of the wrong type or size,
            a cube size other than ``cube``, a negative count or a non-finite target.
    """
    from google.protobuf.message import DecodeError
    from tfrecord import example_pb2

    data = tfrecord_io.read_file(path)
    xs: list[np.ndarray] = []
    ys: list[list[float]] = []
    for index, payload in enumerate(tfrecord_io.records(data, path)):
        example = example_pb2.Example()
        try:
            example.ParseFromString(payload)
        except DecodeError:
            raise DataError(f"{path}: record {index}: not a tf.train.Example") from None
        feature = example.features.feature
        if "x" not in feature or "y" not in feature:
            missing = "y (labels)" if "x" in feature else "x (counts)"
            raise DataError(f"{path}: record {index}: feature {missing} missing; expected x "
                            f"(bytes of int16 counts) and y (4 floats)")
        x_list, y_list = feature["x"].bytes_list.value, feature["y"].float_list.value
        if len(x_list) != 1:
            raise DataError(f"{path}: record {index}: feature x is not one bytes value "
                            f"(int16 counts as bytes)")
        if len(y_list) != N_TARGETS:
            raise DataError(f"{path}: record {index}: feature y holds {len(y_list)} floats; "
                            f"expected {N_TARGETS} (labels missing or wrong)")
        raw = x_list[0]
        if len(raw) % 2:
            raise DataError(f"{path}: record {index}: feature x has {len(raw)} bytes; expected "
                            f"int16 counts (an even number of bytes)")
        try:
            side = cube_of(len(raw) // 2, "feature x")
        except ValueError as exc:
            raise DataError(f"{path}: record {index}: {exc}") from None
        if cube is not None and side != cube:
            raise DataError(f"{path}: record {index}: cube size {side}; expected {cube} like the "
                            f"rest of the dataset")
        cube = side
        xs.append(np.frombuffer(raw, dtype="<i2").reshape((side,) * 3 + (N_CHANNELS,)))
        ys.append(list(y_list))
    if not xs:
        raise DataError(f"{path}: no records (an empty TFRecord file)")
    counts = xs[0][None] if len(xs) == 1 else np.stack(xs)
    targets = np.asarray(ys, dtype=np.float32)
    check_targets(path, targets)
    check_counts(path, counts)
    return counts, targets


def _delimited(n_bytes: int) -> int:
    """Encoded size of a length-delimited protobuf field of ``n_bytes`` (field number < 16)."""
    varint = 1
    while n_bytes >= 1 << (7 * varint):
        varint += 1
    return 1 + varint + n_bytes


def example_length(cube: int) -> int:
    """Serialised size of the Example ``prepare.py`` writes for a cube of side ``cube``: features
    ``x`` (one bytes value of int16 counts) and ``y`` (4 packed floats), nothing else."""
    x_entry = _delimited(1) + _delimited(_delimited(_delimited(cube**3 * N_CHANNELS * 2)))
    y_entry = _delimited(1) + _delimited(_delimited(_delimited(N_TARGETS * 4)))
    return _delimited(_delimited(x_entry) + _delimited(y_entry))


class TFRecordFormat:
    """Reader of TFRecord files (GZIP or plain), see the module doc and `tfrecord_io`.

    Each file is read and inflated once when first used in a process (once per epoch under a
    shuffled sampler when a file holds one Example, as distributed); decoded files are kept up to
    `DECODED_CACHE_BYTES` per process, so files of several Examples are decoded once an epoch
    when the budget holds them."""

    name = "tfrecord"

    def __init__(self) -> None:
        self.max_open = 8

    def list_files(self, folder: Path) -> list[Path]:
        names = _list_file(folder, DATA_LIST)
        if names is not None:
            files = _present(folder, names, DATA_LIST)
        else:
            files = [p for p in folder.iterdir() if p.name.endswith(TFRECORD_SUFFIXES) and p.is_file()]
        return sorted(files, key=lambda p: (stem(p.name), p.name))

    def inspect(self, path: Path, full: bool = False) -> FileInfo:
        """``full``: decode the file (targets known, every value checked). Otherwise, for an
        uncompressed file, every record's header is read and its framing checked
        (`tfrecord_io.count_frames`); for GZIP only the first record's header and the GZIP
        trailer are read (framing inside the stream needs the whole file inflated): the sample
        count is exact for files of equal-sized records, and checked again when the file is read.
        Raises DataError naming the file."""
        identity = _try_identity(path)
        if full:
            counts, targets = decode_examples(path)
            return FileInfo(counts.shape[0], counts.shape[1], targets, identity)
        length, gz, total = tfrecord_io.peek_first_length(path)
        frame = length + tfrecord_io.FRAME_OVERHEAD_BYTES
        side = max(1, round((length / (2 * N_CHANNELS)) ** (1 / 3)))
        while side > 1 and side**3 * 2 * N_CHANNELS > length:
            side -= 1
        if length != example_length(side):  # not the plain x/y Example: decode it to say why
            return self.inspect(path, full=True)
        if not gz:  # every record's framing is checked: one small read per record
            n = tfrecord_io.count_frames(path)
        elif total % frame == 0 and total // frame >= 1 and total < 2**32:
            n = total // frame
        else:  # records of several sizes, or a stream over 4 GiB: count them for real
            n = sum(1 for _ in tfrecord_io.records(tfrecord_io.read_file(path), path))
        return FileInfo(int(n), int(side), None, identity)

    def open(self, path: Path, info: FileInfo) -> Source:
        counts, targets = decode_examples(path, info.cube)
        if counts.shape[0] != info.n_samples:
            raise DataError(f"{path}: {counts.shape[0]} records; the index expected "
                            f"{info.n_samples} (records of several sizes, or the file changed)")
        self.max_open = max(2, DECODED_CACHE_BYTES // max(1, counts.nbytes))
        return Source(counts, targets, checked=True)
