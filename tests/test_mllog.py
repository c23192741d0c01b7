import json
import threading

import pytest

from mlhpc.runtime import Runtime
from mlhpc.log.writer import ComplianceLog, open_next_result


def test_result_files_are_never_reused(tmp_path):
    (tmp_path / "result_0.txt").write_text("precious\n")
    path, handle = open_next_result(tmp_path)
    handle.close()
    assert path.name == "result_1.txt"
    assert (tmp_path / "result_0.txt").read_text() == "precious\n"


def test_concurrent_runs_get_distinct_files(tmp_path):
    paths = []

    def grab():
        path, handle = open_next_result(tmp_path)
        handle.close()
        paths.append(path.name)

    threads = [threading.Thread(target=grab) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(paths) == sorted(f"result_{i}.txt" for i in range(8))


def test_lines_are_mllog_json_and_flushed(tmp_path):
    log = ComplianceLog.create(tmp_path, Runtime(instance=3))
    log.start("run_start")
    log.event("eval_error", 0.5, metadata={"epoch_num": 1})
    # flushed as written: readable before close
    lines = log.path.read_text().splitlines()
    assert len(lines) == 2
    record = json.loads(lines[1].split(":::MLLOG ", 1)[1])
    assert record["key"] == "eval_error" and record["value"] == 0.5
    assert record["metadata"]["epoch_num"] == 1 and record["metadata"]["instance"] == 3
    assert record["metadata"]["file"].endswith("test_mllog.py")  # caller, not the wrapper
    log.close()


def test_non_main_rank_writes_nothing(tmp_path):
    log = ComplianceLog.create(tmp_path, Runtime(rank=1, world_size=2))
    log.event("seed", 1)
    assert log.path is None and list(tmp_path.iterdir()) == []
    assert log.first("seed").value == 1


def test_a_record_that_cannot_be_written_is_raised_not_printed_by_logging(capsys):
    """The run's signal handler can interrupt a write (SIGTERM during init raises there), and a
    disk can fill: either way the exception reaches the caller, and logging prints no
    "--- Logging error ---" traceback of its own with the record lost."""
    import io
    import logging

    from mlhpc.log.writer import _FlushingHandler

    class Interrupted(Exception):
        pass

    class Stream(io.StringIO):
        def write(self, text):
            raise Interrupted("SIGTERM before run_start")

    logger = logging.getLogger("mlhpc-test-unwritable")
    logger.propagate = False
    handler = _FlushingHandler(Stream())
    logger.addHandler(handler)
    try:
        with pytest.raises(Interrupted):
            logger.warning("a record")
    finally:
        logger.removeHandler(handler)
    assert "Logging error" not in capsys.readouterr().err
