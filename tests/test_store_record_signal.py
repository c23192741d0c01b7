"""A SIGTERM (a launcher ending the job) while `mlhpc run` records its finished run in the
results store: the recording is abandoned with the store's warning, the store holds no half of
it, and the command learns of the signal to exit 128 + 15 after reporting the run."""

from __future__ import annotations

import os
import signal
import threading

from test_store import write_log

from mlhpc.store import open_store
from mlhpc.store.queries import Filters, list_runs


def test_a_sigterm_while_a_run_is_recorded_abandons_the_recording_with_a_warning(tmp_path, monkeypatch):
    import mlhpc.store.ingest as ingest
    from mlhpc.cli import _record_run

    assert threading.current_thread() is threading.main_thread()  # where Python runs handlers
    url = f"sqlite:///{tmp_path}/results.db"
    monkeypatch.setenv("MLHPC_STORE", url)
    log = write_log(tmp_path / "run" / "result_0.txt", 3.0)
    real = ingest.ingest_folder

    def ended_midway(*args, **kwargs):  # the signal lands while the store is being written
        os.kill(os.getpid(), signal.SIGTERM)
        return real(*args, **kwargs)

    monkeypatch.setattr(ingest, "ingest_folder", ended_midway)
    before = signal.getsignal(signal.SIGTERM)
    events: list[dict] = []
    came = _record_run(log, events.append)
    assert came == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is the command's again
    warnings = [e["message"] for e in events if e["kind"] == "warning"]
    assert len(warnings) == 1 and "run not recorded (SIGTERM while recording)" in warnings[0], events
    assert "mlhpc results ingest" in warnings[0] and not [e for e in events if e["kind"] == "note"]
    store = open_store(url)
    try:
        assert list_runs(store, Filters()) == []
    finally:
        store.close()

    monkeypatch.setattr(ingest, "ingest_folder", real)  # unsignalled, the same log is recorded
    events.clear()
    assert _record_run(log, events.append) == []
    assert [e["kind"] for e in events] == ["note"], events
