"""The results folder is checked before a run writes to it: a file, a read-only or a full file
system is one line (OutputError -> exit 2) with nothing half-written (issue 15, item 8)."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from mlhpc.run import result as outdir  # the output folder's check and writer live with the run's files
from mlhpc.errors import MlhpcError, OutputError


@pytest.fixture
def small_fs(tmp_path):
    """A real 2 MiB tmpfs (root can mount one here); skipped where mounting is not allowed."""
    mount = tmp_path / f"fs-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path) -> None:
    with open(mount / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_creates_and_leaves_nothing_but_the_folder(tmp_path):
    out = tmp_path / "a" / "b" / "results"
    assert outdir.check_output_dir(out) == out
    assert out.is_dir() and list(out.iterdir()) == []


def test_a_file_or_a_path_under_a_file(tmp_path):
    blocker = tmp_path / "results"
    blocker.write_text("x")
    with pytest.raises(OutputError, match=r"^output.dir .*results: is a file, not a folder$"):
        outdir.check_output_dir(blocker)
    with pytest.raises(OutputError, match=r"a part of the path is a file, not a folder"):
        outdir.check_output_dir(blocker / "sub")
    assert blocker.read_text() == "x"
    assert issubclass(OutputError, MlhpcError)  # the CLI turns it into one line and exit 2


def test_full_file_system(small_fs):
    fill(small_fs)
    with pytest.raises(OutputError, match=r"cannot write results \(no space left on the file system"):
        outdir.check_output_dir(small_fs / "results" / "run1")
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]  # created folders removed


def test_almost_full_file_system_is_refused_before_the_run(small_fs):
    (small_fs / "filler").write_bytes(b"\0" * (2 * 1024 * 1024 - 512 * 1024))  # 512 kB left
    with pytest.raises(OutputError, match=r"no space left on the file system \(only \d+ bytes free\)"):
        outdir.check_output_dir(small_fs / "results")
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]
    assert outdir.check_output_dir(small_fs / "results", min_free_bytes=4096).is_dir()


def test_read_only_file_system(small_fs):
    (small_fs / "results").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    for target in (small_fs / "results", small_fs / "new"):
        with pytest.raises(OutputError, match=r"cannot write results \(read-only file system\)"):
            outdir.check_output_dir(target)


def test_permission_denied_is_one_line(tmp_path, monkeypatch):
    """Root ignores mode bits, so the refusal is simulated at os.open."""
    real = os.open

    def denied(path, *args, **kwargs):
        if ".mlhpc-probe." in str(path):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)
    with pytest.raises(OutputError, match=r"cannot write results \(permission denied\)$"):
        outdir.check_output_dir(tmp_path / "new")
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a mode-555 folder")
def test_mode_555_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    with pytest.raises(OutputError, match="permission denied"):
        outdir.check_output_dir(ro)


def test_atomic_write_on_a_full_file_system_leaves_no_temporary(small_fs):
    target = small_fs / "summary_0.json"
    fill(small_fs)
    with pytest.raises(OutputError, match=r"summary_0.json: cannot write \(no space left"):
        outdir.write_text_atomic(target, "{}" * 100_000)
    assert sorted(p.name for p in small_fs.iterdir()) == ["filler"]


def test_atomic_write_exclusive_never_overwrites(tmp_path):
    target = tmp_path / "config_0.yaml"
    outdir.write_text_atomic(target, "a: 1\n", exclusive=True)
    with pytest.raises(OutputError, match="already exists; results are never overwritten"):
        outdir.write_text_atomic(target, "a: 2\n", exclusive=True)
    assert target.read_text() == "a: 1\n"
    outdir.write_text_atomic(target, "a: 3\n")
    assert target.read_text() == "a: 3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config_0.yaml"]
