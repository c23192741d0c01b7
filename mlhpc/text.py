"""How text from outside (logs, configs, file names, URLs, data) reaches a sink with its own
syntax (a terminal, a rich table, a matplotlib label, a file name): always through here.

- **Terminal** (`terminal`, `echo`, `console`, `cell`): control characters (ESC, so no ANSI or
  OSC sequence; BEL; CR, which would overwrite a line; the C1 range, whose 0x9b is an 8-bit
  CSI; bidirectional overrides) are shown as visible ``\\xNN`` / ``\\u202e`` escapes, never sent;
  rich's console markup is off, so ``mlhpc[gpu]``, ``n[1-4]`` and ``data[1].h5`` show verbatim.
  Styling is asked for with `styled` (a style, never markup in text).
- **Plot labels** (`plot_text`): matplotlib's mathtext would read ``$...$``: figures are made
  with it switched off, so every name is drawn as written.
- **File names** (`file_name`): one path component of letters, digits, ``.``, ``-`` and ``_``,
  never ``.``/``..``, never absolute.
- **URLs** (`show_url`): every credential SQLAlchemy and libpq accept is masked (`SECRET`); every
  line printed passes through it (`mask_urls`).
- **Length** (`clip`, `clip_line`): a value shown in a message is cut to `MAX_SHOWN_CHARS`, and
  a whole message to `MAX_LINE_CHARS` (its start and end kept), saying so: no message grows
  with its input.

The architecture test (tests/test_safety_doors.py) fails when code in mlhpc/ or workloads/
prints, builds a rich console or cell, or shows a URL any other way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import unquote, urlsplit

#: The most characters of any one value a message shows.
MAX_SHOWN_CHARS = 300
#: The most characters of one message line (an error): a few values, each at most
#: `MAX_SHOWN_CHARS`, and the words around them.
MAX_LINE_CHARS = 2000
#: What replaces a secret in a shown URL.
SECRET = "***"
_BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
_CONTROL = re.compile(f"[\x00-\x08\x0b-\x1f\x7f-\x9f{_BIDI}]")
_CONTROL_ALL = re.compile(f"[\x00-\x1f\x7f-\x9f{_BIDI}]")
#: Query or conninfo keys that carry a secret (libpq: password, passfile, sslpassword,
#: sslkey; drivers: token, secret, credentials, auth ...), matched case-insensitively.
_SECRET_KEY = re.compile(r"pass|secret|token|cred|auth|sslkey|api_?key", re.IGNORECASE)
#: ``key=value`` inside a value (a libpq conninfo string given as ``dbname`` or ``options``).
_CONNINFO_SECRET = re.compile(r"(\b[\w-]*(?:pass|secret|token|cred|auth|sslkey)[\w-]*\s*=\s*)"
                              r"('(?:\\.|[^'])*'|[^\s&;]*)", re.IGNORECASE)


def _visible(match: re.Match[str]) -> str:
    code = ord(match.group(0))
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def terminal(text: Any, newlines: bool = True) -> str:
    """``str(text)`` safe to write to a terminal: every control character but newline and tab
    (and, without ``newlines``, those too) replaced by its visible escape (ESC -> ``\\x1b``).
    Console markup is not touched here (a rich console from `console` reads none)."""
    pattern = _CONTROL if newlines else _CONTROL_ALL
    return pattern.sub(_visible, str(text))


def one_line(text: Any) -> str:
    """`terminal` text on one line: line breaks become spaces."""
    return terminal(" ".join(str(text).splitlines()), newlines=False)


def clip(value: Any, limit: int = MAX_SHOWN_CHARS) -> str:
    """``str(value)`` cut to ``limit`` characters, saying how long it was (for messages)."""
    text = value if isinstance(value, str) else _bounded_repr(value, limit)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text)} characters)"


def clip_line(text: Any, limit: int = MAX_LINE_CHARS) -> str:
    """``text`` as `one_line` shows it, at most about ``limit`` characters: a longer one keeps
    its first three quarters and its last quarter (the file it names and what to do), saying
    how many characters were cut between them. Only the kept ends are escaped, so a huge text
    costs no more than its length to clip."""
    raw = text if isinstance(text, str) else str(text)
    head, tail = (3 * limit) // 4, limit // 4
    if len(raw) <= limit:
        line = one_line(raw)
        if len(line) <= limit:
            return line
        raw = line  # escapes made it longer: cut the escaped text
    cut = len(raw) - head - tail
    return f"{one_line(raw[:head])[:head]} ... ({cut} characters cut) ... {one_line(raw[-tail:])[-tail:]}"


def _bounded_repr(value: Any, limit: int) -> str:
    """``str(value)`` of a scalar; a small container's items, a large or deeply nested one's type
    and length (formatting a deep or huge object from a hostile file, a YAML of nested aliases,
    would take minutes and gigabytes)."""
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        if len(value) > 16 or limit < 16:
            return f"<{type(value).__name__} of {len(value)} items>"
        items = value.items() if isinstance(value, dict) else value
        return f"{type(value).__name__}({', '.join(clip(v, limit // 4) for v in items)})"
    return str(value)


def echo(message: Any = "", err: bool = False, nl: bool = True, file: Any = None) -> None:
    """Write ``message`` to stdout, or stderr with ``err``, credentials masked (`mask_urls`) and
    `terminal`-safe: the CLI prints text only through it (``file``: another stream, flushed)."""
    import click

    click.echo(terminal(mask_urls(message)), file=file, err=err, nl=nl)
    if file is not None:
        file.flush()


@contextmanager
def plot_text() -> Iterator[None]:
    """Within the block, matplotlib parses no mathtext in any text it is given (``$...$`` in a
    system or folder name is drawn as written, never a traceback): every figure is made and
    saved inside it."""
    import matplotlib

    with matplotlib.rc_context({"text.parse_math": False}):
        yield


def file_name(text: Any) -> str:
    """One safe path component from ``text``: characters other than letters, digits, ``.``,
    ``-`` and ``_`` become ``_``; never empty, ``.``, ``..`` or hidden (an absolute or dotted
    value such as ``/etc/x`` or ``..`` becomes ``_etc_x`` or ``_..``)."""
    name = "".join(c if (c.isascii() and c.isalnum()) or c in "._-" else "_" for c in str(text))
    if not name or name.startswith("."):
        name = "_" + name
    return name


def show_url(url: Any) -> str:
    """``url`` with every credential masked as `SECRET`: the password of the user info
    (``user:pw@``), any query parameter whose name speaks of one (``password``, ``passfile``,
    ``sslpassword``, ``sslkey``, ``token``, ...; names percent-decoded as libpq and SQLAlchemy
    decode them) and ``key=value`` secrets inside a value (a libpq conninfo given as
    ``dbname``). A string that does not parse as a URL is masked by pattern."""
    raw = str(url)
    try:
        parts = urlsplit(raw)
        netloc = _mask_netloc(parts.netloc)
        query = "&".join(_mask_param(p) for p in raw.split("?", 1)[1].split("#", 1)[0].split("&")) \
            if "?" in raw else ""
    except ValueError:
        return _CONNINFO_SECRET.sub(lambda m: m.group(1) + SECRET, re.sub(r"//[^/@]*@", f"//{SECRET}@", raw))
    if not parts.scheme:  # a libpq keyword/value string, or a bare path
        return _CONNINFO_SECRET.sub(lambda m: m.group(1) + SECRET, raw)
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    shown += f"?{query}" if query else ""
    if parts.fragment:
        shown += "#" + _CONNINFO_SECRET.sub(lambda m: m.group(1) + SECRET, parts.fragment)
    return shown


_URL_IN_TEXT = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def mask_urls(text: Any) -> str:
    """``text`` with every URL in it shown by `show_url` and every ``password=...``-like
    conninfo pair masked: applied to every line the CLI prints (`echo`, `console`), so a
    credential that reaches a message (a driver's error quoting its URL) is never shown."""
    text = _URL_IN_TEXT.sub(lambda m: show_url(m.group(0)), str(text))
    return _CONNINFO_SECRET.sub(lambda m: m.group(1) + SECRET, text)


def _mask_netloc(netloc: str) -> str:
    if "@" not in netloc:
        return netloc
    userinfo, host = netloc.rsplit("@", 1)
    user = userinfo.split(":", 1)[0]
    return f"{user}:{SECRET}@{host}" if ":" in userinfo else f"{user}@{host}"


def _mask_param(param: str) -> str:
    key, sep, value = param.partition("=")
    if _SECRET_KEY.search(unquote(key.replace("+", " "))):
        return f"{key}={SECRET}"
    decoded = unquote(value.replace("+", " "))
    if _CONNINFO_SECRET.search(decoded):
        return f"{key}={_CONNINFO_SECRET.sub(lambda m: m.group(1) + SECRET, decoded)}"
    return param if sep else key


# ---- rich -----------------------------------------------------------------------------------------

_console_class: Any = None


def console(**kwargs: Any) -> Any:
    """A rich ``Console`` (``kwargs`` as rich takes them) that reads no markup and shows every
    string it renders (a table cell, a title, a printed line) through `terminal`."""
    global _console_class
    if _console_class is None:
        from rich.console import Console

        class SafeConsole(Console):
            def render_str(self, text: str, **options: Any) -> Any:
                options["markup"] = False
                options.pop("emoji", None)
                return super().render_str(terminal(mask_urls(text)), emoji=False, **options)

        _console_class = SafeConsole
    kwargs.setdefault("markup", False)
    kwargs.setdefault("emoji", False)
    kwargs.setdefault("highlight", False)
    return _console_class(**kwargs)


def cell(value: Any) -> Any:
    """A rich ``Text`` of ``value`` as shown by `terminal` (no markup read)."""
    from rich.text import Text

    return Text(terminal(value))


def styled(value: Any, style: str) -> Any:
    """A rich ``Text`` of ``value`` (`terminal`-safe) in ``style`` (``"yellow"``, ``"bold"``):
    the only way mlhpc colours text, so that no value is ever read as markup."""
    from rich.text import Text

    return Text(terminal(value), style=style)


def joined(*parts: Any) -> Any:
    """One rich ``Text`` from `styled`/`cell` parts and plain strings (made `terminal`-safe)."""
    from rich.text import Text

    return Text.assemble(*(p if isinstance(p, Text) else terminal(p) for p in parts))
