"""Where the store lives and how it is opened: the URL, the engine, write transactions.

The URL is ``--store URL``, else ``$MLHPC_STORE``, else SQLite at
``$XDG_DATA_HOME/mlhpc/results.db`` (``~/.local/share/mlhpc/results.db`` without it). Any
SQLAlchemy URL works; ``postgresql+psycopg://user@host/db`` is the site-wide store. A bare path
is a SQLite file. ``MLHPC_STORE=none`` turns recording off (`disabled`).

An existing SQLite file is identified before anything writes to it (`identify_sqlite`: read
only, its journal mode untouched): a file that is not SQLite, a SQLite database without mlhpc's
tables, or a store of another schema version is refused with its bytes as they were; an absent
or empty file becomes a new store.

SQLite is opened in WAL mode with a busy timeout, and every write transaction begins
``IMMEDIATE`` (the write lock is taken at the start, so two writers never deadlock upgrading a
read lock) and is retried when the database stays locked: many jobs finishing at once lose
nothing. SQLite on a network file system (NFS, Lustre, GPFS, ...) is said in `Store.warnings`:
its locks are not reliable there; PostgreSQL is the answer.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import sqlite3
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError

from mlhpc.errors import MlhpcError
from mlhpc.store import schema
from mlhpc.text import clip, mask_urls, show_url

ENV = "MLHPC_STORE"
#: File systems whose locking SQLite cannot trust (types as /proc/mounts names them).
NETWORK_FS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "beegfs", "ceph",
                        "glusterfs", "fuse.glusterfs", "fuse.sshfs", "afs", "9p", "panfs", "wekafs"})
BUSY_TIMEOUT_S = 30.0
#: Total seconds a write transaction is retried while the database is locked.
RETRY_FOR_S = 120.0


class StoreError(MlhpcError):
    """The results store cannot be opened, read or written (names the store URL and why)."""


def default_path() -> Path:
    """``$XDG_DATA_HOME/mlhpc/results.db``, else ``~/.local/share/mlhpc/results.db``."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "mlhpc" / "results.db"


def disabled(url: str | None = None) -> bool:
    """Recording is switched off: ``url`` (or ``$MLHPC_STORE``) is ``none``/``off``/``0``."""
    value = url if url is not None else os.environ.get(ENV, "")
    return value.strip().lower() in {"none", "off", "0", "false"}


def resolve_url(url: str | None = None) -> str:
    """The store URL: ``url``, else ``$MLHPC_STORE``, else the default SQLite file.

    Raises:
        StoreError: the store is switched off (``none``) or the URL cannot be parsed.
    """
    value = url or os.environ.get(ENV) or ""
    if disabled(value):
        raise StoreError(f"the results store is switched off ({ENV}={value}); give --store URL")
    if not value:
        return f"sqlite:///{default_path()}"
    if "://" not in value:  # a bare path is a SQLite file
        return f"sqlite:///{os.path.abspath(Path(value).expanduser())}"  # a link is refused, not resolved
    _check_port(value)
    try:
        make_url(value)
    except (ArgumentError, ValueError):  # ValueError: a port SQLAlchemy cannot read
        raise StoreError(f"store URL {clip(show_url(value))}: not a database URL (expected "
                         "dialect+driver://user@host:port/database, or a file path)") from None
    return value


#: ``dialect://[user[:password]@]host[:port]``: the port's text, as SQLAlchemy's URL parser
#: splits it (a bracketed IPv6 host keeps its colons).
_PORT = re.compile(r"[^:/]+://(?:[^@/?#]*@)?(?:\[[^\]]*\]|[^:/?#]*)(?::(?P<port>[^/?#]*))?")


def _check_port(value: str) -> None:
    """Raise StoreError unless the URL's port, when it has one, is 1 .. 65535 in ASCII digits
    (Python's ``int``, which SQLAlchemy uses, would take ``"٣"`` or ``"99999999999"``)."""
    found = _PORT.match(value)
    port = found.group("port") if found else None
    if port is None or port == "":
        return
    if not (len(port) <= 5 and all("0" <= c <= "9" for c in port) and 1 <= int(port) <= 65535):
        raise StoreError(f"store URL {clip(show_url(value))}: port {clip(repr(port), 40)} is not a "
                         "number from 1 to 65535")


def mount_type(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """The file-system type (``/proc/mounts`` field 3) of the mount holding ``path``, or None."""
    try:
        lines = Path(mounts).read_text().splitlines()
    except OSError:
        return None
    best, fstype = "", None
    target = str(path.resolve())
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, fields[2]
    return fstype


def network_fs_warning(path: Path, mounts: str = "/proc/mounts") -> str | None:
    """A warning when the SQLite file ``path`` sits on a network file system, else None."""
    fstype = mount_type(path.parent if path.parent.exists() else Path("/"), mounts)
    if fstype is None or (fstype not in NETWORK_FS and not fstype.startswith("nfs")):
        return None
    return (f"the SQLite results store {path} is on a {fstype} file system, whose locks SQLite "
            f"cannot trust with many writers: use PostgreSQL (--store postgresql+psycopg://...)")


@dataclass
class Store:
    """An open store: its URL as shown (every credential masked: `mlhpc.text.show_url`), engine,
    and warnings to show the user."""

    url: str
    engine: Engine
    warnings: list[str] = field(default_factory=list)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_engine(url: str) -> tuple[Engine, list[str]]:
    database = make_url(url).database or ""
    warnings: list[str] = []
    if database and database != ":memory:":
        path = Path(database)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"{path.parent}: cannot create the store's folder ({exc.strerror})") from None
        check_store_file(path)
        version = identify_sqlite(path)
        if version is not None and version != schema.SCHEMA_VERSION:
            check_version(Store(url=show_url(url), engine=None), version)  # type: ignore[arg-type]
        warning = network_fs_warning(path)
        if warning:
            warnings.append(warning)
        if path.exists() and not os.access(path.parent, os.W_OK):  # a read-only mount or folder
            warnings.append(f"the results store {path} is read-only here: it is listed as it is, "
                            "nothing can be added")
            return _read_only_engine(path), warnings
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # SQLAlchemy emits BEGIN itself (below)
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")

    return engine, warnings


#: The first 16 bytes of every SQLite 3 database file (sqlite.org/fileformat.html, 1.3).
SQLITE_HEADER = b"SQLite format 3\x00"


def identify_sqlite(path: Path) -> int | None:
    """The schema version the existing mlhpc store ``path`` records, read through a read-only
    connection (``mode=ro``: nothing in the file is written, its journal mode included), or None
    for a file to be made: absent, empty (0 bytes), or a SQLite database with no table at all.

    Raises:
        StoreError: one line naming ``path``: not a SQLite database, a SQLite database without
            mlhpc's tables (`mlhpc.store.schema.MARKER_TABLES`: a user's own database is never
            adopted), a ``schema_version`` row that is not a version, or unreadable.
    """
    from mlhpc.data.inputs import open_input

    keep = "left as it is: give a new path or an mlhpc store (--store PATH or MLHPC_STORE=PATH)"
    if not os.path.lexists(path):
        return None
    fd = open_input(path, 1 << 62, what="results store", error=StoreError)  # a regular file, never waited on
    with os.fdopen(fd, "rb") as handle:
        head = handle.read(len(SQLITE_HEADER))
    if not head:
        return None
    if head != SQLITE_HEADER:
        raise StoreError(f"{path}: not a SQLite database, so not an mlhpc results store; {keep}")
    try:
        conn = _connect_read_only(path)
        try:
            tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            objects = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            if not objects:
                return None
            if not schema.MARKER_TABLES <= tables:
                raise StoreError(f"{path}: not an mlhpc results store (a SQLite database without the "
                                 f"{' and '.join(sorted(schema.MARKER_TABLES))} tables); {keep}")
            return schema.checked_versions([v for (v,) in conn.execute("SELECT version FROM schema_version")])
        finally:
            conn.close()
    except schema.BadVersionRow as exc:
        raise StoreError(f"{path}: the store's schema_version {exc}; {keep}") from None
    except sqlite3.Error as exc:
        raise StoreError(f"{path}: cannot be read as an mlhpc results store ({clip(exc, 200)}); {keep}") from None


def _connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to the SQLite file ``path`` (``mode=ro``: its write-ahead log read
    where one is there; ``immutable=1`` where no ``-shm`` can be made beside it, the file alone).

    Raises:
        sqlite3.Error: the file cannot be read as a database.
    """
    try:
        conn = sqlite3.connect(f"file:{quote(str(path))}?mode=ro", uri=True, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn
    except sqlite3.OperationalError:
        return sqlite3.connect(f"file:{quote(str(path))}?mode=ro&immutable=1", uri=True, check_same_thread=False)


def _read_only_engine(path: Path) -> Engine:
    """An engine on the SQLite file ``path`` opened read-only (``mode=ro``, else
    ``immutable=1``): nothing is created beside it, so a store on a read-only mount can be listed."""
    engine = create_engine("sqlite://", creator=lambda: _connect_read_only(path))
    engine.mlhpc_read_only = True  # open_store then reads it as it is (nothing created)
    return engine


def check_store_file(path: Path) -> None:
    """Refuse a SQLite store that another user could rewrite: the file a symbolic link (a planted,
    maybe dangling, link would create or open the database at its target), not a regular file,
    owned by another user, or writable by others; its folder owned by another user (root aside)
    or writable by others (`mlhpc.data.files.check_output_folder`).

    Raises:
        StoreError: naming the file or folder, its owner and mode.
    """
    from mlhpc.data.files import UnsafeFolder, check_output_folder, open_root, reason

    try:
        fd = open_root(path.parent)
        try:
            check_output_folder(fd, path.parent)
        finally:
            os.close(fd)
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except UnsafeFolder as exc:
        raise StoreError(f"{path.parent}: the store's folder is refused ({exc.strerror})") from None
    except OSError as exc:
        raise StoreError(f"{path}: the store cannot be inspected ({reason(exc)})") from None
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{path}: the store is a symbolic link (to {os.readlink(path)}); give the real file")
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{path}: the store is not a regular file")
    if st.st_uid != os.geteuid() or mode & 0o002:
        raise StoreError(f"{path}: the store is owned by uid {st.st_uid} with mode {mode:04o}; it must be "
                         f"yours (uid {os.geteuid()}) and writable by nobody else, or its owner could "
                         "rewrite results")


def shown_url(url: str | None = None) -> str:
    """`resolve_url` as it may be shown to a user: every credential masked (`mlhpc.text.show_url`)."""
    return show_url(resolve_url(url))


def open_store(url: str | None = None) -> Store:
    """Open the store at ``url`` (see `resolve_url`), making its tables when it is new
    (`mlhpc.store.schema.create`); a read-only SQLite file is opened as it is.

    Raises:
        StoreError: switched off, a bad URL, a missing driver, the database cannot be reached,
            or its schema version is not `mlhpc.store.schema.SCHEMA_VERSION` (`check_version`:
            nothing in it is changed).
    """
    resolved, shown = resolve_url(url), shown_url(url)
    try:
        if resolved.startswith("sqlite"):
            engine, warnings = _sqlite_engine(resolved)
        else:
            engine, warnings = create_engine(resolved, pool_pre_ping=True), []
    except (ImportError, ArgumentError) as exc:
        raise StoreError(f"store {clip(shown)}: {clip(mask_urls(exc))}") from None
    store = Store(url=shown, engine=engine, warnings=warnings)
    try:
        if getattr(engine, "mlhpc_read_only", False):
            with read(store) as conn:
                check_version(store, schema.current_version(conn) or schema.SCHEMA_VERSION)
        else:
            check_version(store, retrying(store, schema.create))
    except schema.BadVersionRow as exc:
        store.close()
        raise StoreError(f"the results store at {clip(store.url)}: its schema_version {exc}") from None
    except schema.NotAStore as exc:
        store.close()
        raise StoreError(f"{clip(store.url)}: not an mlhpc results store: the database {exc}; left as it "
                         f"is: give an empty database or an mlhpc store (--store URL or {ENV}=URL)") from None
    except BaseException:
        store.close()
        raise
    return store


def check_version(store: Store, version: int) -> None:
    """Refuse a store that records another schema version than this mlhpc's: an older one (made
    before a release that changed the tables) or a newer one (made by a later mlhpc).

    Raises:
        StoreError: one line naming the store, its version and this mlhpc's, and what to do.
    """
    if version == schema.SCHEMA_VERSION:
        return
    remedy = "upgrade mlhpc, or make" if version > schema.SCHEMA_VERSION else "make"
    raise StoreError(f"the results store at {clip(store.url)} has schema version {version}; this mlhpc "
                     f"reads version {schema.SCHEMA_VERSION}: {remedy} a new store (--store URL or {ENV}=URL)")


def _locked(exc: BaseException) -> bool:
    message = str(getattr(exc, "orig", exc)).lower()
    return "locked" in message or "busy" in message or "deadlock" in message \
        or "could not serialize" in message


@contextlib.contextmanager
def write(store: Store) -> Iterator[Connection]:
    """One write transaction (SQLite: ``BEGIN IMMEDIATE``); committed on leaving, rolled back on
    an error. A lock held too long by another writer is the caller's to retry (`retrying`).

    Raises:
        StoreError: the database cannot be reached or refuses the write.
    """
    try:
        with store.engine.connect() as conn:
            conn = conn.execution_options(write=True)
            with conn.begin():
                yield conn
    except OperationalError as exc:
        if _locked(exc):
            raise
        raise StoreError(f"store {store.url}: {_reason(exc)}") from None
    except DBAPIError as exc:
        raise StoreError(f"store {store.url}: {_reason(exc)}") from None


def _reason(exc: DBAPIError) -> str:
    return mask_urls(" ".join(str(exc.orig).split())[:300])


def retrying(store: Store, work, *args):
    """``work(conn, *args)`` in one write transaction, retried with a random back-off while the
    database stays locked (for up to `RETRY_FOR_S` seconds). Returns what ``work`` returns.

    Raises:
        StoreError: still locked after `RETRY_FOR_S` seconds, or any other database error.
    """
    deadline = time.monotonic() + RETRY_FOR_S
    delay = 0.05
    while True:
        try:
            with write(store) as conn:
                return work(conn, *args)
        except OperationalError as exc:
            if time.monotonic() > deadline:
                raise StoreError(f"store {store.url}: still locked after {RETRY_FOR_S:.0f} s "
                                 f"({_reason(exc)})") from None
            time.sleep(delay * (1 + random.random()))
            delay = min(delay * 2, 2.0)


@contextlib.contextmanager
def read(store: Store) -> Iterator[Connection]:
    """A read-only connection (a plain transaction, rolled back on leaving).

    Raises:
        StoreError: the database cannot be reached.
    """
    try:
        with store.engine.connect() as conn:
            yield conn
    except DBAPIError as exc:
        raise StoreError(f"store {store.url}: {_reason(exc)}") from None
