"""OC20 data that lie about their sizes or hold what the model cannot take, and OC20 laid out as
its reference lays it out, each tried through the command line: a tensor declaring a huge shape,
a zero or negative stride or more elements than its storage holds, a storage declaring more bytes
than its record carries, a float8 tensor, a zero or needle-thin cell are one line naming the file
and key (exit 2) in ``data check`` (quick and full) and in the run's loader, before anything the
size of the declaration is allocated; a thin cell in ``data prepare`` is refused by a stated bound
on its periodic images; ``mlhpc run`` takes ``train/`` + ``val_id/``."""

from __future__ import annotations

import io
import os
import pickle
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import lmdb
import numpy as np
import pytest
import torch
from click.testing import CliRunner
from mlhpc_workloads.opencatalyst import encode, images, lmdb_io, unpickle

from mlhpc.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_oc20_data import _record
from test_oc20_run import TINY

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "opencatalyst-mini.yaml"


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result, *names: str) -> str:
    """The command ended with exit 2 and one ``mlhpc: error:`` line naming each of ``names``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1, result.output
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


def _dataset(root: Path, splits=("train", "val_id"), records: int = 16) -> Path:
    from mlhpc_workloads.opencatalyst import lmdb_io

    for k, split in enumerate(splits):
        (root / split).mkdir(parents=True)
        lmdb_io.write_lmdb(root / split / "data.0000.lmdb",
                           [_record(6, 100 * k + s) for s in range(records)])
    return root


# ---- 9a. the reference's layout -------------------------------------------------------------------


def test_run_takes_the_reference_layout_train_and_val_id(tmp_path):
    """README and docs/data.md put OC20 under ``data.path`` as ``train/`` and ``val_id/`` (the
    OCP download's names); the run finds the validation split through the workload's data tools
    and trains, where it used to ask for a ``validation/`` folder."""
    data = _dataset(tmp_path / "data")
    out = tmp_path / "out"
    result = cli("run", str(MINI), *TINY, "--set", f"data.path={data}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={out}")
    assert result.exit_code == 0, result.output
    log = (out / "result_0.txt").read_text()
    assert '"key": "run_stop"' in log and '"status": "success"' in log
    assert not (data / "validation").exists()


def test_run_without_a_validation_folder_names_what_is_missing(tmp_path):
    data = _dataset(tmp_path / "data", splits=("train",))
    result = cli("run", str(MINI), *TINY, "--set", f"data.path={data}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={tmp_path / 'out'}")
    line = one_line_error(result, str(data))
    assert "no folder whose name holds 'val'" in line


# ---- 4, 8. sizes, dtypes and cells a record declares -----------------------------------------------


class _Tensor:
    """A tensor as a pickle declares it: ``size``, ``stride``, ``offset`` (and ``dtype``, through
    ``_rebuild_tensor_v3``) over the storage of ``array``, whose stream declares ``declared``
    elements (default: the array's)."""

    def __init__(self, array, size, stride, offset=0, dtype=None, declared=None):
        self.array = np.ascontiguousarray(array, dtype=np.float32)
        self.size, self.stride, self.offset, self.dtype = size, stride, offset, dtype
        self.declared = self.array.size if declared is None else declared


class _Storage:
    def __init__(self, tensor: _Tensor):
        self.tensor = tensor


def _storage_stream(t: _Tensor) -> bytes:
    """A legacy ``torch.save`` stream of a float storage declaring ``t.declared`` elements."""
    out = io.BytesIO()
    for header in (encode._LEGACY_MAGIC, 1001, encode._LEGACY_SYS_INFO):
        pickle.dump(header, out, protocol=2)
    pid = ("storage", torch.FloatStorage, "0", "cpu", int(t.declared), None)
    encode._LegacyStoragePickler(out, pid).dump(encode._LegacyStoragePickler)
    pickle.dump(["0"], out, protocol=2)
    out.write(int(t.declared).to_bytes(8, "little"))
    out.write(t.array.tobytes())
    return out.getvalue()


class _HostilePickler(encode._RecordPickler):
    def reducer_override(self, obj):
        if isinstance(obj, _Tensor):
            head = (_Storage(obj), obj.offset, obj.size, obj.stride, False, OrderedDict())
            if obj.dtype is None:
                return torch._utils._rebuild_tensor_v2, head
            return torch._utils._rebuild_tensor_v3, (*head, obj.dtype)
        if isinstance(obj, _Storage):
            return torch.storage._load_from_bytes, (_storage_stream(obj.tensor),)
        return super().reducer_override(obj)


def _hostile_blob(**edits) -> bytes:
    """A plain-dict record (``load_record`` takes one) of `_record` with ``edits`` applied."""
    values = encode._record_values(_record(6, 0))
    values.update(edits)
    out = io.BytesIO()
    _HostilePickler(out, protocol=4).dump(values)
    return out.getvalue()


_POS = np.zeros(18)
_NESTED = [[0.0] * 1000] * 2000  # one list, referenced 2000 times: a small pickle
HOSTILE = {  # name: (edits, what the line says)
    "huge shape": ({"pos": _Tensor(_POS, (2**31, 3), (3, 1))}, "6442450944 elements, over the bound"),
    "zero stride": ({"pos": _Tensor(_POS, (400_000, 3), (0, 0))}, "strides (0, 0) (zero or negative)"),
    "negative stride": ({"pos": _Tensor(_POS, (6, 3), (-3, 1), offset=15)}, "(zero or negative)"),
    "past its storage": ({"pos": _Tensor(_POS, (6000, 3), (3, 1))}, "its storage holds 18"),
    "storage larger than its bytes": ({"pos": _Tensor(_POS, (6, 3), (3, 1), declared=1 << 40)},
                                      "declaring 1099511627776 elements"),
    "float8": ({"pos": _Tensor(_POS, (6, 3), (3, 1), dtype=torch.float8_e4m3fn)}, "float8_e4m3fn tensor"),
    "complex": ({"force": _Tensor(np.zeros(36), (6, 3), (3, 1), dtype=torch.complex64)}, "complex64 tensor"),
    "uint32": ({"tags": _Tensor(np.zeros(6), (6,), (1,), dtype=torch.uint32)}, "uint32 tensor"),
    "nested list": ({"pos": _NESTED}, f"pos holds more than {unpickle.MAX_TENSOR_ELEMENTS} numbers"),
    "zero cell": ({"cell": encode._TensorOut(np.zeros((1, 3, 3)))}, "cell volume 0 A^3"),
    "needle cell": ({"cell": encode._TensorOut(np.diag([10.0, 10.0, 0.02]).reshape(1, 3, 3))},
                    f"over the bound of {images.MAX_PERIODIC_IMAGES}"),
    "edges into one centre": ({"edge_index": encode._TensorOut(np.stack([np.arange(60) % 5 + 1, np.zeros(60)])),
                               "cell_offsets": encode._TensorOut(np.zeros((60, 3)))},
                              "atom 0 is the centre of 60 stored edges"),
}


def _hostile_dataset(root: Path, name: str, key: int, blob: bytes | None = None) -> Path:
    """``train/`` + ``val_id/``; record ``key`` of ``train/data.0000.lmdb`` is `HOSTILE`'s
    ``name`` (or ``blob``)."""
    _dataset(root, records=4)
    victim = root / "train" / "data.0000.lmdb"
    env = lmdb.open(str(victim), subdir=False, lock=False)
    with env.begin(write=True) as txn:
        txn.put(f"{key}".encode(), blob if blob is not None else _hostile_blob(**HOSTILE[name][0]))
    env.close()
    lmdb_io.close_all()
    return victim


def bad_file_line(result, victim: Path, *names: str) -> str:
    """``data check`` ended with exit 2 and exactly one line naming ``victim``, which holds each
    of ``names`` (the command's summary line after it names the folder)."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    naming = [line for line in result.output.splitlines() if str(victim) in line]
    assert len(naming) == 1, result.output
    for name in names:
        assert name in naming[0], (name, naming[0])
    assert len(naming[0]) < 600
    return naming[0]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_data_check_refuses_what_a_record_declares_in_one_line(tmp_path, name):
    """Record 0 bad: quick and full ``data check`` refuse it naming the file and key; record 2
    bad: full refuses it, quick (record 0 of each file, as it says) passes."""
    victim = _hostile_dataset(tmp_path / "first", name, 0)
    says = HOSTILE[name][1]
    for mode in ([], ["--full"]):
        bad_file_line(cli("data", "check", "oc20", str(tmp_path / "first"), *mode), victim, "key '0'", says)
    later = _hostile_dataset(tmp_path / "later", name, 2)
    bad_file_line(cli("data", "check", "oc20", str(tmp_path / "later"), "--full"), later, "key '2'", says)
    assert cli("data", "check", "oc20", str(tmp_path / "later")).exit_code == 0


@pytest.mark.parametrize("blob, says", [
    # protocol 5's BYTEARRAY8 declaring 1 TiB: the C unpickler allocated it, then freed it with
    # its buffer exported (CPython printed a SystemError line past the command's one line)
    (b"\x80\x05\x96" + (1 << 40).to_bytes(8, "little") + b".", "protocol 5 out-of-band buffer or bytearray"),
    # BINBYTES8 declaring 1 TiB: read as the bytes present, never allocated at the declared size
    (b"\x80\x04\x8e" + (1 << 40).to_bytes(8, "little") + b".", "not a graph record"),
])
def test_a_pickle_declaring_a_terabyte_of_bytes_is_one_line(tmp_path, blob, says):
    victim = _hostile_dataset(tmp_path / "data", "", 0, blob)
    code, stderr, peak_kib = _peak_rss_kib([sys.executable, "-m", "mlhpc", "data", "check", "oc20",
                                            str(tmp_path / "data")])
    assert code == 2 and "Traceback" not in stderr and "SystemError" not in stderr, stderr
    assert f"{victim}: key '0'" in stderr and says in stderr
    assert peak_kib < 1 << 20, peak_kib


def test_the_loader_refuses_a_zero_stride_record_in_the_run(tmp_path):
    victim = _hostile_dataset(tmp_path / "data", "zero stride", 3)
    result = cli("run", str(MINI), *TINY, "--set", f"data.path={tmp_path / 'data'}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={tmp_path / 'out'}")
    line = one_line_error(result, f"{victim}: key '3'", "(zero or negative)")
    assert line.startswith(f"mlhpc: error: {victim}")


def _peak_rss_kib(argv: list[str]) -> tuple[int, str, int]:
    """Run ``argv``; its exit status, stderr and peak resident memory (KiB, its own)."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, stderr, usage.ru_maxrss


@pytest.mark.parametrize("name", ["huge shape", "storage larger than its bytes"])
def test_a_record_declaring_gigabytes_is_refused_before_any_is_allocated(tmp_path, name):
    """Declared: 24 GiB of float32 (2^31 x 3) or a 4 TiB storage in a record of a few kB. The
    check's peak resident memory stays under 1 GiB (the interpreter and torch take a few hundred
    MiB), so nothing of the declared size was allocated."""
    victim = _hostile_dataset(tmp_path / "data", name, 0)
    code, stderr, peak_kib = _peak_rss_kib([sys.executable, "-m", "mlhpc", "data", "check", "oc20",
                                            str(tmp_path / "data")])
    assert code == 2 and "Traceback" not in stderr, stderr
    assert f"{victim}: key '0'" in stderr and HOSTILE[name][1] in stderr
    assert peak_kib < 1 << 20, peak_kib


def test_load_record_refuses_a_zip_storage_stream():
    """``torch.save``'s zip archive (whose members may be compressed) is no storage stream the
    reference writes: refused, never inflated."""
    buffer = io.BytesIO()
    torch.save(torch.zeros(3).untyped_storage(), buffer)

    class Zip(encode._RecordPickler):
        def reducer_override(self, obj):
            if obj is Zip:
                return torch.storage._load_from_bytes, (buffer.getvalue(),)
            return super().reducer_override(obj)

    out = io.BytesIO()
    Zip(out, protocol=4).dump({"pos": Zip})
    with pytest.raises(Exception, match="not a legacy torch.save stream"):
        lmdb_io.load_record(out.getvalue(), "file.lmdb: key '0'")


def test_the_models_own_radius_graph_counts_images_before_building_them():
    """Without stored edges the model searches neighbours itself: a needle cell (which the
    record check refuses at the reference's 6 A) is refused there too, at the model's cutoff,
    before any image is built."""
    from mlhpc_workloads.opencatalyst import dimenet

    from mlhpc.errors import DataError

    pos = torch.rand(4, 3)
    cell = torch.diag(torch.tensor([8.0, 8.0, 1e-6])).unsqueeze(0)
    with pytest.raises(DataError, match="structure 0 of the batch: the cell's periodic images"):
        dimenet.radius_graph_pbc(pos, cell, torch.tensor([4]), 6.0, 50)
    edges, offsets = dimenet.radius_graph_pbc(pos, torch.eye(3).unsqueeze(0) * 8.0, torch.tensor([4]), 6.0, 50)
    assert edges.shape[0] == 2 and offsets.shape == (edges.shape[1], 3)
