"""Recording one finished run in the store, from ``mlhpc run`` (the rank that wrote the log).

The run folder stays the source of truth: whatever goes wrong here (no store, a locked or
unreachable database, a bad URL) is one warning through ``warn``, never an exception.
``MLHPC_STORE=none`` switches recording off; ``MLHPC_CAMPAIGN`` names the campaign the run
belongs to (``mlhpc submit --sweep`` sets it in each job). A SIGTERM or SIGINT while a run is
recorded (`signals_abandon_recording`: a launcher ending the job) abandons the recording, whose
transaction the store rolls back, with the same warning.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

CAMPAIGN_ENV = "MLHPC_CAMPAIGN"


class RecordingInterrupted(Exception):
    """A SIGTERM or SIGINT came while a run was recorded (`signals_abandon_recording`)."""


@contextmanager
def signals_abandon_recording() -> Iterator[list[int]]:
    """Within the block, SIGTERM and SIGINT raise `RecordingInterrupted` (which `record_run`
    turns into its warning) instead of ending the process unheard; yields a list that holds each
    signal's number as it comes, for the caller to exit 128 + N once the run is reported.
    Installed only in the main thread (where Python runs signal handlers)."""
    came: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield came
        return

    def abandon(signum: int, frame: object) -> None:
        came.append(signum)
        raise RecordingInterrupted(f"{signal.Signals(signum).name} while recording")

    previous = {sig: signal.signal(sig, abandon) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield came
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def record_run(run_dir: Path | str, result_file: Path | str, warn: Callable[[str], None]) -> int | None:
    """Ingest ``result_file`` (a ``result_N.txt`` in ``run_dir``) into the store of
    ``$MLHPC_STORE`` (default: the SQLite file of `mlhpc.store.engine.default_path`).

    Args:
        run_dir: the run's output folder (named in warnings).
        result_file: its log.
        warn: called with one line for each warning (store on a network file system, a log
            refused, a store that cannot be reached); never raises itself, ideally.

    Returns:
        the new run id, or None (switched off, already stored, or not recorded: see ``warn``).
    """
    try:
        from mlhpc.store.engine import disabled, open_store
        from mlhpc.store.ingest import ingest_folder

        if disabled():
            return None
        store = open_store()
        try:
            for warning in store.warnings:
                warn(warning)
            log = Path(result_file)
            result = ingest_folder(store, log.parent, [log], os.environ.get(CAMPAIGN_ENV) or None)
        finally:
            store.close()
        for line in result.refused:
            warn(f"results store: not recorded: {line}")
        return result.added[0] if result.added else None
    except Exception as exc:  # noqa: BLE001 (a store problem must never lose the run)
        from mlhpc.text import mask_urls

        reason = mask_urls(" ".join(str(exc).split())[:300]) or type(exc).__name__
        try:
            warn(f"results store: run not recorded ({reason}); the run folder {run_dir} keeps it "
                 "(add it later with: mlhpc results ingest FOLDER)")
        except Exception:  # noqa: BLE001, S110 (a failing warn callback must not raise either)
            pass
        return None
