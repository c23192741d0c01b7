"""Read MLPerf compliance logs (``:::MLLOG {json}`` lines) into events.

The line format is the one written by ``mlperf_logging.mllog`` and read by MLCommons'
``mlperf_logging.compliance_checker.mlp_parser``: anything may precede the token (a rank prefix
such as ``"  0: "``, a launcher's timestamp), the JSON object follows it, and lines without the
token are ordinary program output. As in ``mlp_parser``, the *last* token on a line starts the
record, lines are split the way Python's text files split them (``\\n``, ``\\r\\n``, ``\\r``), and
a record needs ``time_ms`` (a number of milliseconds since the epoch) and ``key``. Unlike
``mlp_parser``, a record without ``value`` or ``metadata`` is kept (``None`` and ``{}``) and a
broken line never stops the parse: it is listed in `ParsedLog.malformed` with its file and line.
Every key set from MLPerf HPC v0.7 to v3.0 parses the same way; meaning is given to keys later
(`mlhpc.log.summary`).
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.errors import LogFormatError
from mlhpc.log.plausible import log_value_problem

TOKEN = ":::MLLOG "


@dataclass(frozen=True)
class Event:
    """One compliance-log record.

    Attributes:
        time_ms: the record's ``time_ms`` (milliseconds since the Unix epoch, float64).
        key: the MLLOG key, e.g. ``"run_start"``, ``"eval_error"``.
        value: the decoded JSON ``value`` (``None`` when absent).
        metadata: the decoded JSON ``metadata`` object (``{}`` when absent).
        lineno: 1-based physical line number in the file.
        record_index: 0-based index among the lines that carry the token (the line number that
            MLCommons' ``mlp_parser`` reports).
        event_type: ``"POINT_IN_TIME"``, ``"INTERVAL_START"``, ``"INTERVAL_END"`` or ``""``.
    """

    time_ms: float
    key: str
    value: Any
    metadata: dict[str, Any]
    lineno: int
    record_index: int
    event_type: str = ""


@dataclass(frozen=True)
class Malformed:
    """A line that carries the token but is not a readable record.

    ``message`` is one line: ``"<file>:<line>: <what is wrong>"``.
    """

    path: str
    lineno: int
    reason: str

    @property
    def message(self) -> str:
        return f"{self.path}:{self.lineno}: {self.reason}"


@dataclass
class ParsedLog:
    """Everything read from one log file.

    Attributes:
        path: the file read (as given).
        events: records in file order.
        malformed: lines with the token that could not be read (file and line in each).
        n_lines: physical lines in the file.
        n_records: lines that carry the token (``len(events) + len(malformed)``).
        sha256: hex SHA-256 of the bytes read (of the UTF-8 text for `parse_text`); verdicts on
            the log are cached under it.
    """

    path: str
    events: list[Event] = field(default_factory=list)
    malformed: list[Malformed] = field(default_factory=list)
    n_lines: int = 0
    sha256: str = ""

    @property
    def n_records(self) -> int:
        return len(self.events) + len(self.malformed)

    def first(self, key: str) -> Event | None:
        """The first event with ``key``, or ``None``."""
        for event in self.events:
            if event.key == key:
                return event
        return None

    def all(self, key: str) -> list[Event]:
        """Every event with ``key``, in file order."""
        return [event for event in self.events if event.key == key]


#: The longest MLLOG record line read (characters). A log line is a short JSON object; a line
#: past this is refused before any parser or regular expression (ours or the official
#: checkers') runs over it, where it could cost minutes.
MAX_RECORD_CHARS = 1 << 16
#: The largest log read (bytes); published logs are at most a few MB.
MAX_LOG_BYTES = 256 << 20
#: The longest text value shown from a log (``submission_*``); longer ones are cut, saying so.
MAX_FIELD_CHARS = 200


def cap_field(value: str) -> str:
    """``value`` cut to `MAX_FIELD_CHARS` characters, saying how long it was."""
    if len(value) <= MAX_FIELD_CHARS:
        return value
    return f"{value[:MAX_FIELD_CHARS]}... (cut from {len(value)} characters)"


def oversize_line(path: Path | str) -> str | None:
    """``"LINE: N characters"`` for the first line of ``path`` longer than `MAX_RECORD_CHARS`,
    or None (also when the file cannot be read: the caller reports that its own way)."""
    from mlhpc.data.inputs import input_chunks

    lineno, length = 1, 0
    try:  # streamed: only the current line's length is kept
        for chunk in input_chunks(path, MAX_LOG_BYTES, None, "result log", LogFormatError):
            for piece in chunk.split(b"\n")[:-1]:
                if length + len(piece) > MAX_RECORD_CHARS:
                    return f"line {lineno}: {length + len(piece)} characters"
                lineno, length = lineno + 1, 0
            length += len(chunk) - chunk.rfind(b"\n") - 1
    except LogFormatError:
        return None
    return f"line {lineno}: {length} characters" if length > MAX_RECORD_CHARS else None


def _split_lines(text: str) -> list[str]:
    # Python's universal-newline splitting, as iterating a text-mode file does (mlp_parser).
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def _read_record(payload: str) -> tuple[dict[str, Any] | None, str]:
    try:
        record = json.loads(payload)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON after {TOKEN.strip()} ({exc.msg} at column {exc.colno})"
    except ValueError as exc:  # an integer of more digits than Python converts
        return None, f"refused value after {TOKEN.strip()}: {str(exc)[:120]}"
    except RecursionError:
        return None, f"JSON after {TOKEN.strip()} is nested too deeply"
    if not isinstance(record, dict):
        return None, f"expected a JSON object after {TOKEN.strip()}, got {type(record).__name__}"
    if "key" not in record or not isinstance(record["key"], str):
        return None, "record has no string 'key'"
    if "time_ms" not in record:
        return None, f"record {record['key']!r} has no 'time_ms'"
    try:
        time_ms = float(record["time_ms"])
    except (TypeError, ValueError, OverflowError):
        return None, f"record {record['key']!r}: time_ms {record['time_ms']!r} is not a number"
    if not math.isfinite(time_ms):
        return None, f"record {record['key']!r}: time_ms {record['time_ms']!r} is not finite"
    problem = log_value_problem(record.get("value")) or log_value_problem(record.get("metadata"))
    if problem:  # the range check every reader of a figure shares (`mlhpc.log.plausible`)
        return None, f"refused value after {TOKEN.strip()}: {problem}"
    metadata = record.get("metadata")
    if metadata is None:
        record["metadata"] = {}
    elif not isinstance(metadata, dict):
        return None, f"record {record['key']!r}: metadata is not a JSON object"
    record["time_ms"] = time_ms
    return record, ""


def parse_text(text: str, path: str = "<text>") -> ParsedLog:
    """Parse the text of one log.

    Args:
        text: the whole log (any mix of MLLOG records and other output).
        path: the name used in messages.

    Returns:
        a `ParsedLog`; never raises for bad content (bad lines go to ``malformed``).
    """
    parsed = ParsedLog(path=path, sha256=hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest())
    lines = _split_lines(text)
    if lines and lines[-1] == "":
        lines.pop()
    _take_lines(parsed, ((line, len(line), TOKEN in line) for line in lines))
    return parsed


def _take_lines(parsed: ParsedLog, lines: Iterable[tuple[str | None, int, bool]]) -> None:
    """Add the records of ``lines`` to ``parsed``: per physical line its text (None for one
    over `MAX_RECORD_CHARS`, not kept), its length in characters and whether it holds the token."""
    record_index = lineno = 0
    for lineno, (line, chars, has_token) in enumerate(lines, start=1):
        if line is None or chars > MAX_RECORD_CHARS:
            if has_token:
                parsed.malformed.append(Malformed(parsed.path, lineno, (
                    f"record line of {chars} characters, over the {MAX_RECORD_CHARS} an MLLOG "
                    "record may hold (not read)")))
                record_index += 1
            continue
        at = line.rfind(TOKEN)
        if at < 0:
            continue
        record, reason = _read_record(line[at + len(TOKEN):].strip())
        if record is None:
            parsed.malformed.append(Malformed(parsed.path, lineno, reason))
        else:
            event_type = record.get("event_type")
            parsed.events.append(Event(
                time_ms=record["time_ms"], key=record["key"], value=record.get("value"),
                metadata=record["metadata"], lineno=lineno, record_index=record_index,
                event_type=event_type if isinstance(event_type, str) else ""))
        record_index += 1
    parsed.n_lines = lineno


#: Bytes of one line kept whole while a log is streamed: past it the line is longer than
#: `MAX_RECORD_CHARS` characters in any encoding read (UTF-8 takes at most 4 bytes a character),
#: so only its length and whether it holds the token are kept.
_KEPT_LINE_BYTES = 4 * MAX_RECORD_CHARS + 4
_BREAK = re.compile(rb"\r\n|\r|\n")


class _LongLine:
    """A line past `_KEPT_LINE_BYTES`, read on without keeping it: its characters counted and
    the token looked for across pieces, through an incremental decoder (which raises
    UnicodeDecodeError on bytes that are not UTF-8, as decoding the whole file would)."""

    def __init__(self, encoding: str) -> None:
        self.decoder = codecs.getincrementaldecoder(encoding)()
        self.chars, self.has_token, self.tail = 0, False, ""

    def feed(self, data: bytes, final: bool = False) -> None:
        text = self.tail + self.decoder.decode(data, final)
        self.chars += len(text) - len(self.tail)
        self.has_token = self.has_token or TOKEN in text
        self.tail = text[-(len(TOKEN) - 1):]


def _stream_lines(chunks: Iterable[bytes], encoding: str) -> Iterator[tuple[str | None, int, bool]]:
    """The physical lines of a log read in pieces (split as Python's text files split them,
    `_split_lines`), as `_take_lines` takes them; no more than `_KEPT_LINE_BYTES` of one line
    and one piece are held at a time, and each piece is scanned once."""
    parts: list[bytes] = []
    size, long_line, after_cr = 0, None, False
    for chunk in chunks:
        if after_cr and chunk[:1] == b"\n":  # the second half of a \r\n split between pieces
            chunk = chunk[1:]
        after_cr, start = chunk.endswith(b"\r"), 0
        for brk in _BREAK.finditer(chunk):
            parts.append(chunk[start:brk.start()])
            yield _line(b"".join(parts), encoding, long_line)
            parts, size, long_line, start = [], 0, None, brk.end()
        if start < len(chunk):
            parts.append(chunk[start:])
            size += len(chunk) - start
        if size > _KEPT_LINE_BYTES:
            long_line = long_line or _LongLine(encoding)
            long_line.feed(b"".join(parts))
            parts, size = [], 0
    if parts or long_line is not None:
        yield _line(b"".join(parts), encoding, long_line)


def _line(data: bytes, encoding: str, long_line: _LongLine | None) -> tuple[str | None, int, bool]:
    if long_line is None:
        text = data.decode(encoding)
        return text, len(text), TOKEN in text
    long_line.feed(data, final=True)
    return None, long_line.chars, long_line.has_token


def file_kind(path: Path | str) -> str:
    """``"file"`` for a regular file (links followed), else what it is, in words: ``"no such
    file or folder"``, ``"a folder"``, ``"a FIFO, not a regular file"``, ``"a character
    device, not a regular file"``, ... Never opens the path."""
    import stat

    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "no such file or folder"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "a folder"
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return f"{name}, not a regular file"
    return "not a regular file"


def read_log(path: Path | str, root: Path | str | None = None, what: str = "result log") -> bytes:
    """The bytes of one log, as the report and the store both read it
    (`mlhpc.data.inputs.read_input`): a regular file of at most `MAX_LOG_BYTES`, never a link out
    of ``root`` (the tree it was found in), a FIFO or a device (never opened blocking).

    Raises:
        LogFormatError: missing, unreadable, not a regular file, a link out of ``root`` or over
            the cap (one line naming it).
    """
    from mlhpc.data.inputs import read_input

    return read_input(path, MAX_LOG_BYTES, root, what, LogFormatError)


def log_sha256(path: Path | str, root: Path | str | None = None) -> str:
    """Hex SHA-256 of a log's bytes, streamed through `mlhpc.data.inputs` (the rules of `read_log`,
    never held whole). Raises LogFormatError as `read_log`."""
    from mlhpc.data.inputs import input_chunks

    digest = hashlib.sha256()
    for chunk in input_chunks(path, MAX_LOG_BYTES, root, "result log", LogFormatError):
        digest.update(chunk)
    return digest.hexdigest()


def log_mentions(path: Path | str, needle: bytes, root: Path | str | None = None) -> bool:
    """Whether a log's bytes hold ``needle``, streamed (the rules of `read_log`, never held
    whole; a needle across two pieces is found). Raises LogFormatError as `read_log`."""
    from mlhpc.data.inputs import input_chunks

    tail = b""
    for chunk in input_chunks(path, MAX_LOG_BYTES, root, "result log", LogFormatError):
        if needle in tail + chunk[:len(needle)] or needle in chunk:
            return True
        tail = chunk[-(len(needle) - 1):] if len(needle) > 1 else b""
    return False


def decode_log(data: bytes, path: Path | str) -> ParsedLog:
    """`parse_text` of a log's bytes (UTF-8, falling back to Latin-1 as ``mlp_parser`` reads
    it), with ``sha256`` of the bytes."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    parsed = parse_text(text, str(path))
    parsed.sha256 = hashlib.sha256(data).hexdigest()
    return parsed


def parse_log(path: Path | str, root: Path | str | None = None) -> ParsedLog:
    """Read and parse one log file, streamed: read in pieces
    (`mlhpc.data.inputs.input_chunks`, the rules of `read_log`), never held whole, a line over
    `MAX_RECORD_CHARS` counted and not kept, so memory stays within a few pieces and the records
    whatever the file's size up to `MAX_LOG_BYTES`. The same records, lines and SHA-256 as
    `decode_log` of the file's bytes (a file that is not UTF-8 is read again as Latin-1).

    Args:
        path: a ``result_N.txt`` or any file of MLLOG lines.
        root: the tree it was found in (a link out of it is refused).

    Returns:
        a `ParsedLog` (malformed lines are listed in it, never raised).

    Raises:
        LogFormatError: as `read_log`.
    """
    from mlhpc.data.inputs import input_chunks

    for encoding in ("utf-8", "latin-1"):  # Latin-1 for the whole file if any byte is not UTF-8
        parsed, digest = ParsedLog(path=str(path)), hashlib.sha256()

        def pieces() -> Iterator[bytes]:
            for chunk in input_chunks(path, MAX_LOG_BYTES, root, "result log", LogFormatError):
                digest.update(chunk)
                yield chunk

        try:
            _take_lines(parsed, _stream_lines(pieces(), encoding))
        except UnicodeDecodeError:
            continue
        parsed.sha256 = digest.hexdigest()
        return parsed
    raise AssertionError("Latin-1 decodes every byte")

