"""Messages and values from outside, each tried through the command line: no message grows with
its input (a YAML of nested aliases, an LMDB whose 244-byte ``length`` key unpickles to a list
shared millions of times, a 100 kB selection), a structure nested thousands deep is a line, not
a RecursionError; every number read from a selection, a store URL or a checkpoint is range-checked
where it is read (``nodes=`` past int64, a superscript digit, ``--until 9999-12-31``, a port that
is not a number, an epoch of 10^30); a log is read streaming within its cap; a GZIP TFRecord whose
record data CRC is wrong inside an intact GZIP stream fails the quick check; Ctrl-C held, not
lost, while a worker pool starts. Each ends in one line and exit status 2 (issue 43, classes 4-6).
"""

from __future__ import annotations

import gzip
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.errors import DataError, error_line
from mlhpc.text import MAX_LINE_CHARS

sys.path.insert(0, str(Path(__file__).parent))
from cosmoflow_writers import write_tfrecord  # noqa: E402
from test_run_e2e import TINY  # noqa: E402
from test_safety_oc20 import _dataset, _hostile_blob  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
#: A line the user reads: the issue's messages reached 25 MB; a few hundred characters per value.
SHORT = MAX_LINE_CHARS + 100


def cli(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(main, list(args), catch_exceptions=False, env=env)


def one_line(result, *fragments: str) -> str:
    """Exit status 2, no traceback, exactly one ``mlhpc: error:`` line, short, holding each
    fragment."""
    assert result.exit_code == 2, result.output[-3000:]
    assert "Traceback" not in result.output and "RecursionError" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1, result.output[-3000:]
    assert len(result.output) < 2 * SHORT, len(result.output)
    for fragment in fragments:
        assert fragment in errors[0], (fragment, errors[0])
    return errors[0]


def _deep(depth: int, leaf=0.0):
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def _shared(levels: int) -> list:
    value = ["x" * 100]
    for _ in range(levels):
        value = [value] * 8
    return value  # 8**levels references to one 100-character string: a tiny pickle


def _pickled_deep(depth: int) -> bytes:
    """A pickle of a list nested ``depth`` deep, written by opcodes (pickling it would recurse)."""
    return b"\x80\x04" + b"]" * depth + b"a" * (depth - 1) + b"."


# ---- the one place where errors become lines ------------------------------------------------------


def test_no_error_message_grows_with_its_input():
    huge = DataError("/data/x: " + "y" * 10_000_000 + " (move it away)")
    line = error_line(huge)
    assert len(line) < SHORT and line.startswith("mlhpc: error: /data/x: yyy")
    assert line.endswith("(move it away)") and "characters cut" in line
    assert len(str(huge)) < SHORT
    oserror = error_line(OSError(2, "No such file or directory", "/" + "d" * 100_000))
    assert len(oserror) < SHORT and oserror.endswith("No such file or directory")
    assert error_line(DataError("a\x1b[31m\nb")) == "mlhpc: error: a\\x1b[31m b"


def _alias_bomb() -> str:
    """A YAML flow sequence of nine anchored lists, each nine aliases of the one before: 9^9
    strings from about 400 bytes."""
    lists = ['&a ["xxxxxxxxxx", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for prev, name in zip("abcdefgh", "bcdefghi"):
        lists.append(f"&{name} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "[" + ", ".join(lists) + "]"


@pytest.mark.parametrize("spec, says", [
    ("[{bomb}, null, 0.1, s]", "expected a number"),
    ("[1.0, null, 0.1, {bomb}]", "unit"),
])
def test_a_yaml_alias_bomb_in_a_references_file_is_a_short_line(tmp_path, spec, says):
    """The value ``_number`` refused was shown with ``!r``: 25 MB of line from a 500-byte file;
    now its bounded view."""
    refs = tmp_path / "refs.yaml"
    refs.write_text("sys:\n  cosmoflow:\n    time_to_train_s: " + spec.format(bomb=_alias_bomb()) + "\n")
    assert refs.stat().st_size < 600
    result = cli("results", "check", "--references", str(refs), "--store", str(tmp_path / "s.db"))
    one_line(result, str(refs), says)


# ---- OC20 LMDB: shared and deep structures --------------------------------------------------------


def _put(root: Path, key: bytes, blob: bytes) -> Path:
    from mlhpc_workloads.opencatalyst import lmdb_io

    victim = root / "train" / "data.0000.lmdb"
    env = lmdb.open(str(victim), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(key, blob)
    env.close()
    lmdb_io.close_all()
    return victim


@pytest.mark.parametrize("name, blob", [
    ("a list shared 2 million times", pickle.dumps(_shared(7), protocol=4)),  # 244 bytes: 222 MB repr
    ("a list nested 50,000 deep", _pickled_deep(50_000)),  # its repr: RecursionError
])
def test_a_hostile_length_key_is_one_short_line(tmp_path, name, blob):
    """``data check`` names the file and key in one bad line of a few hundred characters; the
    file's ``length`` shown as what it is, never its repr."""
    data = _dataset(tmp_path / "data", records=4)
    victim = _put(data, b"length", blob)
    result = cli("data", "check", "oc20", str(data))
    assert result.exit_code == 2 and "Traceback" not in result.output
    bad = [line for line in result.output.splitlines() if str(victim) in line]
    assert len(bad) == 1 and "key 'length' is a pickled list" in bad[0], result.output[-2000:]
    assert len(result.output) < 2 * SHORT and "Recursion" not in result.output


def test_a_deep_length_key_in_the_run_is_one_line_not_a_recursion_error(tmp_path):
    """The run's loader counted records through the same check: a RecursionError traceback,
    exit 1; now one line naming the file, exit 2, the attempt's log set aside."""
    data = _dataset(tmp_path / "data", records=4)
    _put(data, b"length", _pickled_deep(50_000))
    out = tmp_path / "out"
    result = cli("run", str(ROOT / "configs" / "opencatalyst-mini.yaml"), "--set", f"data.path={data}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={out}",
                 "--set", "train.threads=1")
    one_line(result, "data.0000.lmdb", "key 'length' is a pickled list")
    assert not list(out.glob("result_*.txt")) and list((out / "failed").glob("result_*"))


def _deep_record_blob(depth: int) -> bytes:
    """A record whose ``pos`` is a list nested ``depth`` deep, pickled in a thread with the stack
    and recursion limit that takes (pickle recurses)."""
    found: list[bytes] = []
    limit = sys.getrecursionlimit()
    threading.stack_size(256 << 20)
    try:
        def work() -> None:
            sys.setrecursionlimit(4 * depth)
            try:
                found.append(_hostile_blob(pos=_deep(depth)))
            finally:
                sys.setrecursionlimit(limit)

        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    finally:
        threading.stack_size(0)
    return found[0]


def test_deep_and_shared_values_inside_a_record_are_one_line(tmp_path):
    """A record whose ``pos`` nests 20,000 lists: one bad line, no RecursionError; a value the
    unpickler names is shown by a bounded view, never its repr built whole."""
    from mlhpc_workloads.opencatalyst import unpickle

    for value in (_deep(3000), _shared(7)):
        text = unpickle._shown(value)
        assert len(text) <= 120 and "Recursion" not in text
    data = _dataset(tmp_path / "data", records=4)
    _put(data, b"0", _deep_record_blob(20_000))
    result = cli("data", "check", "oc20", str(data))
    assert result.exit_code == 2 and "Traceback" not in result.output and "Recursion" not in result.output
    assert "key '0': pos is a ragged or non-numeric sequence" in result.output
    assert len(result.output) < 2 * SHORT


# ---- numbers in selections, run ids, store URLs ---------------------------------------------------


@pytest.mark.parametrize("args, says", [
    (["list", "--nodes", "9223372036854775808"], None),  # click's own range line
    (["list", "--until", "9999-12-31"], "outside 0001-01-02 .. 9999-12-30"),
    (["list", "--since", "0001-01-01T00:00+01:00"], "outside"),
    (["list", "--since", "２０２４-01-01"], "expected YYYY-MM-DD"),
    (["compare", "nodes=99999999999999999999", "nodes=1"], "is not a whole number from 1 to 9223372036854775807"),
    (["compare", "nodes=²", "nodes=1"], "'²' is not a whole number"),
    (["compare", "nodes=٣", "nodes=1"], "'٣' is not a whole number"),
    (["compare", "nodes=+4", "nodes=1"], "is not a whole number"),
    (["compare", "until=9999-12-31", "nodes=1"], "outside"),
    (["show", "²"], "'²' is not a whole number"),
    (["show", "99999999999999999999"], "is not a whole number from 0"),
    (["check", "--references", "r.yaml", "--window", "99999999999999999999"], None),
    (["list", "--store", "postgresql://u@h:abc/db"], "port 'abc' is not a number from 1 to 65535"),
    (["list", "--store", "postgresql://u:secret@h:٣/db"], "port '٣'"),
    (["list", "--store", "postgresql://u@[::1]:99999/db"], "port '99999'"),
    (["list", "--store", "sqlite://:x/db"], "port 'x'"),
])
def test_numbers_in_selections_and_urls_are_range_checked_where_read(tmp_path, args, says):
    result = cli("results", *args, env={"MLHPC_STORE": str(tmp_path / "s.db")})
    if says is None:  # click refuses the option in one usage line
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert "is not in the range" in result.output
        return
    line = one_line(result, says)
    assert "secret" not in line


def test_a_100_kB_selection_is_shown_in_a_few_hundred_characters(tmp_path):
    expression = "benchmark=x," + "y" * 100_000 + "=1"
    result = cli("results", "compare", expression, "nodes=1", env={"MLHPC_STORE": str(tmp_path / "s.db")})
    line = one_line(result, "unknown key")
    assert len(line) < 1000


def test_a_sweep_count_is_ascii_digits_within_int64(tmp_path):
    from mlhpc.slurm_job import SubmitOptions
    from mlhpc.store.campaign import _split_point

    for bad in ("²", "٣", "99999999999999999999", "-1"):
        with pytest.raises(Exception) as caught:
            _split_point([f"nodes={bad}"], SubmitOptions())
        assert "expected a whole number from 1 to" in str(caught.value)
    assert _split_point(["nodes=4"], SubmitOptions())[0].allocation.nodes == 4


# ---- checkpoints to resume ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_state(tmp_path_factory):
    """A checkpoint as a run writes it, made without a run: the tiny CosmoFlow config's model,
    optimizer and scheduler state."""
    from mlhpc import config as cfg
    from mlhpc.run.checkpoint import TorchRandom, TrainState, entries
    from mlhpc.workload import get

    root = tmp_path_factory.mktemp("ckpt")
    config = cfg.load(ROOT / "configs" / "cosmoflow-mini.yaml", [
        *(s for s in TINY if s != "--set"), f"data.path={root / 'absent'}",
        "data.synthesize_if_missing=false", f"output.dir={root / 'out'}"])
    workload = get(config.workload)
    model = workload.build_model(config.model)
    optimizer, scheduler = workload.build_optimizer(model, config, 1)
    counters = TrainState(config, epoch=2, step=0, history=[(1, 0.5)], result_file="result_0.txt",
                          elapsed_s=3.0)
    return entries({"model": model, "optimizer": optimizer, "scheduler": scheduler,
                    "train_state": counters, "rng": TorchRandom()})


def _edit(state: dict, key: str, value) -> dict:
    edited = dict(state)
    if key == "model":
        name = next(iter(state["model"]))
        edited["model"] = {**state["model"], name: value}
    else:
        edited[key] = value
    return edited


@pytest.mark.parametrize("key, value, says", [
    ("epoch", 10**30, "out of range"),
    ("step", 2**62, "out of range"),
    ("elapsed_s", float("inf"), "'elapsed_s' inf"),
    ("elapsed_s", -5.0, "'elapsed_s' -5.0"),
    ("history", [[10**30, 1.0]], "'history' entry"),
    ("history", [[1, float("nan")]], "'history' entry"),
    ("result_file", ["x"] * 3, "'result_file' is a list"),
    ("torch_rng", torch.zeros(3, dtype=torch.uint8), "not torch's RNG state"),
    ("model", "abc", "not a tensor (not a state dict)"),
    ("model", 5, "not a tensor (not a state dict)"),
    ("empty", b"", "cannot read checkpoint (an empty file)"),
])
def test_a_checkpoint_out_of_range_is_one_line_before_anything_is_written(tmp_path, good_state, key, value, says):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = run_dir / "checkpoint_0.pt"
    if key == "empty":
        path.write_bytes(value)
    else:
        torch.save(_edit(good_state, key, value), path)
    one_line(cli("run", "--resume", str(run_dir)), str(path), says)
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_0.pt"]


def test_the_good_checkpoint_passes_its_checks(good_state):
    from mlhpc.run.checkpoint import checked

    state = checked(good_state, "t")
    assert state["epoch"] == 2 and state["history"] == [(1, 0.5)] and state["elapsed_s"] == 3.0


def test_an_eof_error_escaping_a_command_is_a_bug_with_its_traceback_not_aborted():
    """click turns an EOFError into "Aborted!" and exit 1, the answer to a user's Ctrl-D: an
    empty file a reader did not expect looked like that. The command decorator keeps it a bug."""
    from mlhpc.errors import one_line_errors

    @one_line_errors()
    def reads_an_empty_file() -> None:
        raise EOFError("Ran out of input")

    with pytest.raises(RuntimeError, match="unexpected end of input"):
        reads_an_empty_file()


# ---- a log read streaming ---------------------------------------------------------------------------


def test_a_log_near_its_cap_is_read_streaming(tmp_path):
    """A 24 MiB log of program output around its records: parsed within a few MiB beyond the
    interpreter (the whole file was held three times over, as bytes, text and lines: a 256 MiB
    log peaked at 929 MB in ``mlhpc report``), with the same records and SHA-256 as the
    whole-file parse, and a 300,000-character record line counted, not kept."""
    log = tmp_path / "result_0.txt"
    record = ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "k", "value": 1}\n'
    with open(log, "w") as handle:
        handle.write(record + ("x" * 199 + "\n") * (24 << 20 >> 8) + ":::MLLOG " + "z" * 300_000 + "\n" + record)
    probe = ("import resource, sys; from mlhpc.log.parse import parse_log; "
             "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss; p = parse_log(sys.argv[1]); "
             "grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base; "
             "print(grew, len(p.events), p.n_lines, p.sha256, *(m.reason for m in p.malformed))")
    out = subprocess.run([sys.executable, "-c", probe, str(log)], capture_output=True, text=True,
                         check=True).stdout.split(" ", 4)
    assert int(out[0]) < 12 << 10, f"parse_log grew by {out[0]} KiB"
    from mlhpc.log.parse import decode_log

    whole = decode_log(log.read_bytes(), str(log))
    assert (int(out[1]), int(out[2]), out[3]) == (2, whole.n_lines, whole.sha256)
    assert out[4].startswith("record line of 300009 characters")


@pytest.mark.parametrize("data", [
    b"", b"\n", b"\r", b"a\r\nb\rc\n", b"a\r", b":::MLLOG {\"key\": \"k\", \"time_ms\": 1}\r",
    "é:::MLLOG {\"key\": \"é\", \"time_ms\": 1}\n".encode(),
    b"\xe9:::MLLOG {\"key\": \"k\", \"time_ms\": 1}\n" + "é".encode(),  # not UTF-8: Latin-1, whole file
    b":::MLLOG " + "é".encode() * 70_000 + b"\r\n:::MLLOG {\"key\": \"k\", \"time_ms\": 1}",
])
@pytest.mark.parametrize("piece_bytes", [3, 1 << 20])
def test_the_streamed_parse_equals_the_whole_file_parse(tmp_path, monkeypatch, data, piece_bytes):
    from mlhpc.data import inputs
    from mlhpc.log import parse

    chunks = inputs.input_chunks
    monkeypatch.setattr(inputs, "input_chunks", lambda *a, **k: chunks(*a, **{**k, "chunk_bytes": piece_bytes}))
    log = tmp_path / "log.txt"
    log.write_bytes(data)
    streamed, whole = parse.parse_log(log), parse.decode_log(data, str(log))
    assert streamed.sha256 == whole.sha256 and streamed.n_lines == whole.n_lines
    assert [(e.key, e.lineno, e.record_index) for e in streamed.events] == \
        [(e.key, e.lineno, e.record_index) for e in whole.events]
    assert [m.message for m in streamed.malformed] == [m.message for m in whole.malformed]
    assert parse.log_mentions(log, b'"k"') == (b'"k"' in data)


# ---- a GZIP TFRecord's record data CRC --------------------------------------------------------------


def test_quick_check_of_a_gzip_tfrecord_checks_each_records_data_crc(tmp_path):
    """One data byte of record 1 changed before compressing, its CRC left: the GZIP stream is
    intact (its own CRC-32 matches), so only the record's data CRC can tell. The quick check
    inflated every byte and passed it; now it names the file and record."""
    from mlhpc_workloads.cosmoflow import tfrecord_io

    root = tmp_path / "data"
    rng = np.random.default_rng(0)
    samples = [(rng.integers(0, 50, (16, 16, 16, 4)).astype(np.int16), rng.random(4).astype(np.float32))
               for _ in range(3)]
    for split in ("train", "validation"):
        (root / split).mkdir(parents=True)
        write_tfrecord(root / split / "a.tfrecord", samples)
    victim = root / "train" / "a.tfrecord"
    body = bytearray(gzip.decompress(victim.read_bytes()))
    (first,) = struct.unpack_from("<Q", body, 0)
    second = first + tfrecord_io.FRAME_OVERHEAD_BYTES
    body[second + 12 + 40] ^= 0x01  # a data byte of record 1; both CRCs of its frame untouched
    victim.write_bytes(gzip.compress(bytes(body)))
    result = cli("data", "check", "cosmoflow", str(root))
    assert result.exit_code == 2 and "Traceback" not in result.output
    bad = [line for line in result.output.splitlines() if str(victim) in line]
    assert len(bad) == 1 and "record 1: data CRC mismatch" in bad[0], result.output[-2000:]
    write_tfrecord(victim, samples)  # the same file written whole passes
    assert cli("data", "check", "cosmoflow", str(root)).exit_code == 0


# ---- signals held, not ignored, while a pool starts ---------------------------------------------------


def test_a_sigint_while_workers_start_is_held_then_handled(tmp_path):
    """A SIGINT that arrives while a pool's workers are forked waits, blocked, until the block
    ends and is then raised here: never lost; the workers, begun with it blocked, set it aside
    before unblocking it (the pool still works)."""
    from mlhpc.data import pool

    assert threading.current_thread() is threading.main_thread()
    # A suite started in the background by a script inherits SIGINT ignored: handle it as Python does.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _held_sigint_is_raised(pool)
    finally:
        signal.signal(signal.SIGINT, previous)
    results = list(pool.map_in_order(_square, list(range(8)), 2))
    assert results == [n * n for n in range(8)]


def _held_sigint_is_raised(pool) -> None:
    with pytest.raises(KeyboardInterrupt):
        with pool._signals_held():  # this thread's (pytest-xdist runs threads of its own)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            assert signal.SIGINT in signal.sigpending()
        pytest.fail("the held SIGINT was not raised on leaving the block")
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def _square(n: int) -> int:
    return n * n
