"""The checkpoint and resume path keeps the project's promises, tested through the CLI:

- a checkpoint's sizes are what it takes in memory, not what its file holds: a 1 MiB ``.pt``
  whose member inflates to 1 GiB is refused in one line before anything inflates (the resumed
  run's checkpoint and OpenFold's starting checkpoint alike);
- a run folder is a tree: a checkpoint, log or claim in it that is a link out of it is refused
  in one line, never followed;
- a stopped OpenFold run (whose starting evaluation, at epoch_num 0, is in its checkpoint's
  history) resumes, and the resumed log passes MLCommons' checker.
"""

from __future__ import annotations

import collections
import io
import json
import os
import pickle
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import pytest
import torch
from conftest import compliance_check
from test_openfold_cli import MINI, TINY_RUN, tiny  # noqa: F401 (fixture)
from test_resume import wait_for

GIB = 1 << 30


#: ``python -m mlhpc`` that writes its own peak resident KiB (VmHWM) to the file named first at
#: exit. wait4's ru_maxrss would not do: Linux carries the forking worker's peak into the child.
_PEAK_THEN_MLHPC = """
import atexit, sys
peak_file = sys.argv.pop(1)
def write_peak():
    with open("/proc/self/status") as status, open(peak_file, "w") as out:
        out.write(next(line.split()[1] for line in status if line.startswith("VmHWM:")))
atexit.register(write_peak)
sys.argv[0] = "mlhpc"
from mlhpc.cli import main
main()
"""


def cli(args: list[str], cwd: Path, timeout_s: float = 300) -> tuple[int, str, str, float, int]:
    """``python -m mlhpc ARGS`` in ``cwd``: (exit status, stdout, stderr, seconds, peak resident
    KiB of that process alone, as its /proc/self/status says at exit)."""
    peak = cwd / ".cli.peak"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _PEAK_THEN_MLHPC, str(peak), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    seconds = time.monotonic() - t0
    peak_kib = int(peak.read_text())
    peak.unlink()
    return proc.returncode, proc.stdout, proc.stderr, seconds, peak_kib


def one_line(status: int, stderr: str, *names: str) -> str:
    """Exit 2 and one ``mlhpc: error:`` line on stderr naming each of ``names``."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and lines[0].startswith("mlhpc: error: "), (status, stderr)
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


# ---- a checkpoint file written by hand: torch's ZIP layout, one member DEFLATE-compressed ------


class _Storage:
    def __init__(self, numel: int) -> None:
        self.numel = numel


class _Tensor:
    def __init__(self, numel: int) -> None:
        self.numel = numel


class _TorchPickler(pickle.Pickler):
    """Pickles a `_Tensor` as torch.save pickles a float32 tensor whose storage is record 0,
    without the tensor ever existing."""

    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", torch.FloatStorage, "0", "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, _Tensor):
            return torch._utils._rebuild_tensor_v2, (_Storage(obj.numel), 0, (obj.numel,), (1,), False,
                                                     collections.OrderedDict())
        return NotImplemented


def _zeros_deflated(size: int, piece: int = 1 << 20) -> tuple[bytes, int]:
    """A raw DEFLATE stream of ``size`` zero bytes (one fully flushed block repeated) and its CRC-32,
    made in well under a second without holding ``size`` bytes."""
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = packer.compress(bytes(piece)) + packer.flush(zlib.Z_FULL_FLUSH)
    crc, zero = 0, bytes(piece)
    for _ in range(size // piece):
        crc = zlib.crc32(zero, crc)
    return block * (size // piece) + b"\x03\x00", crc  # b"\x03\x00": an empty final block


def _write_zip(path: Path, members: list[tuple[str, bytes, int, int, int]]) -> None:
    """A ZIP file (APPNOTE.TXT 4.3) of ``(name, data as stored, method, inflated size, CRC-32)``."""
    out, central = io.BytesIO(), []
    for name, data, method, size, crc in members:
        offset, raw = out.tell(), name.encode()
        out.write(struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0, crc, len(data), size,
                              len(raw), 0) + raw + data)
        central.append(struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0, crc,
                                   len(data), size, len(raw), 0, 0, 0, 0, 0, offset) + raw)
    start = out.tell()
    for entry in central:
        out.write(entry)
    out.write(struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(central), len(central),
                          out.tell() - start, start, 0))
    path.write_bytes(out.getvalue())


def inflating_checkpoint(path: Path, state: dict, inflated: int = GIB) -> Path:
    """A torch checkpoint of ``state`` whose ``"model"`` holds one float32 tensor ``w`` of
    ``inflated`` bytes, stored DEFLATE-compressed: a file of about 1 MiB per GiB, which
    ``torch.load`` reads into a tensor of ``inflated`` bytes."""
    pickled = io.BytesIO()
    _TorchPickler(pickled, protocol=2).dump({**state, "model": {"w": _Tensor(inflated // 4)}})
    data, crc = _zeros_deflated(inflated)

    def stored(name: str, body: bytes) -> tuple[str, bytes, int, int, int]:
        return name, body, 0, len(body), zlib.crc32(body)

    _write_zip(path, [stored("archive/data.pkl", pickled.getvalue()), stored("archive/byteorder", b"little"),
                      ("archive/data/0", data, 8, inflated, crc), stored("archive/version", b"3\n")])
    assert path.stat().st_size < 2 << 20
    return path


BARE_STATE = {"config": {}, "epoch": 1, "step": 0, "optimizer": {}, "scheduler": {}}


def test_a_resumed_checkpoint_that_inflates_is_refused_before_it_inflates(tmp_path):
    """A 1 MiB checkpoint_0.pt whose model tensor inflates to 1 GiB: one line naming it, exit 2,
    in seconds and without the process ever holding the gigabyte."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    checkpoint = inflating_checkpoint(run_dir / "checkpoint_0.pt", BARE_STATE)
    status, _, stderr, seconds, peak_kib = cli(["run", "--resume", str(run_dir)], tmp_path)
    one_line(status, stderr, str(checkpoint), "compressed")
    assert peak_kib < 900 << 10, peak_kib  # torch's import takes a few hundred MiB; the tensor 1 GiB
    assert seconds < 60, seconds
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_0.pt"]


def test_an_openfold_starting_checkpoint_that_inflates_is_refused(tiny, tmp_path):
    """model.init_checkpoint is read with the same count: one line naming it, exit 2, nothing trained."""
    bomb = inflating_checkpoint(tmp_path / "init.pt", {})
    status, _, stderr, _, peak_kib = cli(
        ["run", str(MINI), *TINY_RUN, "--set", f"data.path={tiny}", "--set", f"model.init_checkpoint={bomb}",
         "--set", "model.init_checkpoint_sha256=null", "--set", "model.init_checkpoint_data_identity=null",
         "--set", f"output.dir={tmp_path / 'out'}"], tmp_path)
    one_line(status, stderr, str(bomb), "compressed")
    assert peak_kib < 900 << 10, peak_kib
    logs = list((tmp_path / "out").rglob("result_*"))
    assert all('"key": "epoch_start"' not in p.read_text() for p in logs)


# ---- a stopped tiny OpenFold run, shared by the tests below ------------------------------------


@pytest.fixture(scope="module")
def stopped_openfold(tiny, tmp_path_factory) -> Path:
    """A tiny OpenFold run stopped by SIGTERM in its first epoch (after its starting evaluation at
    epoch_num 0): its folder, with result_0.txt and checkpoint_0.pt."""
    root = tmp_path_factory.mktemp("openfold-resume")
    out = root / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlhpc", "run", str(MINI), *TINY_RUN, "--set", f"data.path={tiny}",
         "--set", "train.target=0.0", "--set", "train.eval_every_steps=6",
         "--set", "train.check_every_steps=1", "--set", f"output.dir={out}"],
        cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    wait_for(out / "result_0.txt", '"key": "epoch_start"', proc, timeout_s=180)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    assert "--resume" in stderr and (out / "checkpoint_0.pt").is_file(), stderr[-3000:]
    return out


def _copy_run(stopped: Path, dest: Path) -> Path:
    shutil.copytree(stopped, dest)
    return dest


def test_a_stopped_openfold_run_resumes_and_its_log_passes_the_checker(stopped_openfold, tmp_path):
    """The checkpoint keeps the starting evaluation (epoch 0) in its history; `--resume` takes
    it, finishes the run (target 0.0: the first evaluation reaches it) and the resumed log passes
    the MLCommons checker but for the quality target the tiny network does not reach."""
    run_dir = _copy_run(stopped_openfold, tmp_path / "run")
    state = torch.load(run_dir / "checkpoint_0.pt", weights_only=True)
    assert [epoch for epoch, _ in state["history"]] == [0] and state["epoch"] == 1
    status, _, stderr, _, _ = cli(["run", "--resume", str(run_dir)], tmp_path)
    assert status in (0, 1), stderr[-3000:]
    log = run_dir / "result_1.txt"
    records = [json.loads(line.split(" ", 1)[1]) for line in log.read_text().splitlines()
               if line.startswith(":::MLLOG")]
    assert [r["value"]["checkpoint"] for r in records if r["key"] == "resume"] == ["checkpoint_0.pt"]
    assert any(r["key"] == "eval_accuracy" for r in records)
    assert json.loads((run_dir / "summary_1.json").read_text())["status"] == "success"
    checked = compliance_check(log)
    text = checked.stdout + checked.stderr
    # the checker's one complaint: the tiny network's lDDT-Ca is below the closed target 0.8
    # (a resumed mini run, which reaches it, passes whole)
    failed = set(re.findall(r"CHECK for '(\w+)' failed", text)) | set(re.findall(r"Failed checks for (\w+)", text))
    assert failed == {"eval_accuracy"} and "v['value'] >= 0.8" in text, text[-3000:]
    assert "occurrence" not in text.lower() and "not found" not in text.lower(), text[-3000:]


@pytest.mark.parametrize("name", ["checkpoint_0.pt", "result_0.txt", "resumed_0.json"])
def test_a_run_folder_file_linked_out_of_the_folder_is_refused(stopped_openfold, tmp_path, name):
    """checkpoint_0.pt, result_0.txt or resumed_0.json as a symbolic link to a file outside the
    run folder (here: the same run's own file, or a claim, kept elsewhere): one line naming it,
    exit 2, and nothing written in the folder."""
    run_dir = _copy_run(stopped_openfold, tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if name == "resumed_0.json":
        (elsewhere / name).write_text(json.dumps({"resumed_by": "result_7.txt"}) + "\n")
    else:
        shutil.move(run_dir / name, elsewhere / name)
    (run_dir / name).symlink_to(elsewhere / name)
    before = sorted(p.name for p in run_dir.iterdir())
    status, _, stderr, _, _ = cli(["run", "--resume", str(run_dir)], tmp_path)
    one_line(status, stderr, str(run_dir / name), "symbolic link")
    assert sorted(p.name for p in run_dir.iterdir()) == before


def test_zip_input_counts_what_compressed_members_inflate_to(tmp_path):
    """The reader itself, for a ZIP whose members may be compressed (NumPy's .npz): an honest
    archive is read; one whose members declare more than the cap, or whose member inflates past
    the size it declares, is refused before any reader allocates, naming the file."""
    import numpy as np

    from mlhpc.data.inputs import InputRefused, ZipReading, zip_input

    honest = tmp_path / "honest.npz"
    np.savez_compressed(honest, a=np.zeros(1 << 16, np.float32))
    with zip_input(honest, ZipReading(1 << 20, 1 << 20, what="archive")) as handle:
        assert np.load(handle)["a"].shape == (1 << 16,)
    with pytest.raises(InputRefused, match="declare .* over the 65536 bytes"):
        zip_input(honest, ZipReading(1 << 20, 1 << 16, what="archive"))
    with pytest.raises(InputRefused, match="compressed .DEFLATE., not stored"):
        zip_input(honest, ZipReading(1 << 20, 1 << 20, what="archive", compressed=False))
    data, crc = _zeros_deflated(8 << 20)
    liar = tmp_path / "liar.npz"
    _write_zip(liar, [("a.npy", data, 8, 1024, crc)])  # declares 1 KiB, inflates to 8 MiB
    with pytest.raises(InputRefused, match="inflates past the 1024 bytes it declares") as refused:
        zip_input(liar, ZipReading(1 << 20, 1 << 30, what="archive"))
    assert str(liar) in str(refused.value)
    short = tmp_path / "short.npz"
    _write_zip(short, [("a.npy", b"\x00" * 10, 0, 1 << 20, 0)])  # stored, declares 1 MiB, holds 10 bytes
    with pytest.raises(InputRefused, match="does not hold"):
        zip_input(short, ZipReading(1 << 20, 1 << 30, what="archive"))
