"""What mlhpc leaves on disk keeps its promises, tried through the command line:

- a FIFO where a lock file or a checkpoint belongs is refused with one line, never waited on
  (staging, ``stage --clean``, ``run --resume``);
- a claimed folder mlhpc removes whole (an interrupted synthesis's hidden folder) is refused,
  with nothing deleted, when it holds a file mlhpc did not record making;
- a synthesis whose last step (the rename into place) fails keeps its claim, so a later
  ``mlhpc data synth`` finishes it instead of refusing the data as not mlhpc's;
- a GZIP TFRecord read whole is refused once it inflates past its cap, never held whole.

Commands that could wait forever run in a subprocess with a timeout: a regression fails, it
does not hang the suite."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree_bytes

from mlhpc.cli import main
from mlhpc.data import embedded
from mlhpc.data.claims import CLAIM_NAME

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "configs" / "cosmoflow-mini.yaml"
TINY_SYNTH = ["--set", "synth.cube_size=8", "--set", "synth.train_samples=4", "--set",
              "synth.eval_samples=2", "--set", "synth.workers=1"]
WAIT_S = 60


def _mlhpc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """``python -m mlhpc ARGS``, killed (and the test failed) after `WAIT_S` seconds."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(cwd)}
    return subprocess.run([sys.executable, "-m", "mlhpc", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=WAIT_S, check=False)


def _one_line(proc: subprocess.CompletedProcess, *names: str) -> str:
    """The command ended with exit 2 and one ``mlhpc: error:`` line naming each of ``names``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert lines[0].startswith("mlhpc: error: "), lines[0]
    for name in names:
        assert name in lines[0], (name, lines[0])
    return lines[0]


@pytest.fixture
def staged(tmp_path: Path) -> tuple[Path, Path]:
    """``(source, destination)``: a two-file source staged once to a copy of mlhpc's."""
    src = tmp_path / "src"
    for rel, text in {"train/a.bin": "a" * 100, "validation/b.bin": "b" * 50}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    dest = tmp_path / "node" / "copy"
    dest.parent.mkdir()
    proc = _stage(src, dest)
    assert proc.returncode == 0, proc.stderr
    return src, dest


def _stage(src: Path, dest: Path) -> subprocess.CompletedProcess:
    return _mlhpc("stage", str(MINI), "--set", f"data.path={src}", "--set",
                  f"data.staging.dest={dest}", cwd=dest.parent)


# ---- a FIFO is refused, never waited on ---------------------------------------------------------


@pytest.mark.parametrize("name", [".mlhpc-readers", ".mlhpc-lock"])
def test_a_fifo_lock_file_in_a_staged_copy_is_refused_by_staging(staged, name):
    """Staging again into a copy whose readers' lock or node lock is a FIFO: one line naming
    it, at once (the readers' lock was opened blocking and waited for a writer forever)."""
    src, dest = staged
    os.unlink(dest / name)
    os.mkfifo(dest / name)
    before = tree_bytes(dest)
    _one_line(_stage(src, dest), str(dest / name), "FIFO")
    after = tree_bytes(dest)
    after.pop(CLAIM_NAME), before.pop(CLAIM_NAME)  # the claim is rewritten once a copy is done
    assert after == before


def test_a_fifo_readers_lock_is_refused_by_stage_clean_and_the_copy_kept(staged):
    """``stage --clean`` takes each copy's readers' lock before removing it: a FIFO there is
    said in one line naming it and that copy is left whole (as a copy in use is)."""
    _, dest = staged
    os.unlink(dest / ".mlhpc-readers")
    os.mkfifo(dest / ".mlhpc-readers")
    before = tree_bytes(dest)
    proc = _mlhpc("stage", "--clean", "--in", str(dest.parent), cwd=dest.parent)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(dest / ".mlhpc-readers") in lines[0] and "FIFO" in lines[0], lines
    assert "0 staged copies, 0.0 MB removed" in proc.stdout
    assert tree_bytes(dest) == before


def test_a_fifo_checkpoint_is_refused_by_run_resume(tmp_path):
    """``run --resume`` on a folder whose checkpoint is a FIFO: one line naming it, at once
    (torch.load opened it blocking); nothing written in the folder."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    os.mkfifo(run_dir / "checkpoint_0.pt")
    _one_line(_mlhpc("run", "--resume", str(run_dir), cwd=tmp_path), str(run_dir / "checkpoint_0.pt"),
              "FIFO")
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoint_0.pt"]


# ---- a claimed folder removed whole keeps what the user put in it ------------------------------


def _synth(out: Path, *extra: str):
    return CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(out), *TINY_SYNTH, *extra])


def _cli_line(result) -> str:
    """The command ended with exit 2 and one ``mlhpc: error:`` line (after its progress lines)."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("mlhpc: error: ")]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert "Traceback" not in result.output and result.stderr.strip().endswith(lines[0]), result.output
    return lines[0]


def _interrupted(monkeypatch, out: Path) -> Path:
    """The hidden folder of a synthesis of ``out`` (seed 0) that wrote its files and then
    failed (a full disk), left claimed as an interrupted synthesis is."""
    real_run = embedded.SynthWatch.run

    def run_then_fail(self, synthesize, synth, seed):
        real_run(self, synthesize, synth, seed)
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(embedded.SynthWatch, "run", run_then_fail)
        assert "No space left on device" in _cli_line(_synth(out))
    hidden = embedded.staging_folder(out)
    assert (hidden / CLAIM_NAME).is_file() and list((hidden / "train").glob("*.h5"))
    return hidden


def test_a_users_file_in_an_interrupted_synthesis_folder_is_refused_not_deleted(tmp_path, monkeypatch):
    """A synthesis with other settings removes the interrupted one's hidden folder: a file the
    user put there (mlhpc recorded making everything else) is named in one line and nothing is
    deleted; once the user has taken it away, the folder is removed and the data written."""
    out = tmp_path / "data"
    hidden = _interrupted(monkeypatch, out)
    (hidden / "train" / "mine.h5").write_text("my own file")
    before = tree_bytes(hidden)
    line = _cli_line(_synth(out, "--seed", "1"))
    assert str(hidden / "train" / "mine.h5") in line and "nothing removed" in line, line
    assert tree_bytes(hidden) == before and not out.exists()
    os.unlink(hidden / "train" / "mine.h5")
    made = _synth(out, "--seed", "1")
    assert made.exit_code == 0, made.output
    assert not hidden.exists() and embedded.describe(out) == "complete"
    assert embedded.synth_manifest(out)["seed"] == 1


# ---- a failed last step keeps the claim ---------------------------------------------------------


def test_a_synthesis_whose_rename_fails_stays_claimed_and_a_later_synth_finishes_it(tmp_path, monkeypatch):
    """The data are written, then the rename into place fails (a folder of the user's appeared
    at the final name meanwhile): the complete hidden folder stays mlhpc's, so once the user
    moves their folder away the next ``mlhpc data synth`` puts it in place."""
    out = tmp_path / "data"
    real_run = embedded.SynthWatch.run

    def run_then_user_folder(self, synthesize, synth, seed):
        real_run(self, synthesize, synth, seed)
        out.mkdir()
        (out / "notes.txt").write_text("the user's")

    with monkeypatch.context() as patch:
        patch.setattr(embedded.SynthWatch, "run", run_then_user_folder)
        line = _cli_line(_synth(out))
    assert str(out) in line, line
    hidden = embedded.staging_folder(out)
    assert (hidden / CLAIM_NAME).is_file() and (out / "notes.txt").read_text() == "the user's"
    shutil.move(out, tmp_path / "moved")
    made = _synth(out)
    assert made.exit_code == 0, made.output
    assert embedded.describe(out) == "complete" and not hidden.exists()
    assert not (out / CLAIM_NAME).exists() and not (out / embedded.INTENT).exists()
    assert (tmp_path / "moved" / "notes.txt").read_text() == "the user's"


# ---- a GZIP TFRecord read whole counts what it inflates to ---------------------------------------


def _gzip_frame_of_zeros(path: Path, data_bytes: int) -> None:
    """One TFRecord frame of ``data_bytes`` zero bytes, its length and CRCs right, GZIP-compressed
    a MiB at a time (the test never holds the inflated bytes)."""
    import struct
    import zlib

    from crc32c import crc32c

    from mlhpc_workloads.cosmoflow.tfrecord_io import masked_crc

    zeros, crc, deflate = bytes(1 << 20), 0, zlib.compressobj(9, zlib.DEFLATED, 31)
    length = struct.pack("<Q", data_bytes)
    with path.open("wb") as out:
        out.write(deflate.compress(length + struct.pack("<I", masked_crc(length))))
        for _ in range(data_bytes >> 20):
            crc = crc32c(zeros, crc)
            out.write(deflate.compress(zeros))
        masked = (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF
        out.write(deflate.compress(struct.pack("<I", masked)) + deflate.flush())


def test_a_gzip_tfrecord_that_inflates_past_its_cap_is_one_line(tmp_path):
    """A 300 KB GZIP TFRecord whose one record inflates to 320 MiB, in a dataset otherwise whole:
    `data check --full` names it in one line, having inflated no more than the cap (256 MiB)."""
    import cosmoflow_writers as writers

    root = writers.write_dataset(tmp_path / "data", "tfrecord", writers.samples(4), writers.samples(2, seed=1),
                                 per_file=2)
    bomb = min((root / "train").glob("*.tfrecord"))
    _gzip_frame_of_zeros(bomb, 320 << 20)
    assert bomb.stat().st_size < 1 << 20
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(root), "--full"])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    naming = [line for line in result.output.splitlines() if str(bomb) in line]
    assert len(naming) == 1 and "inflates to more than the 268435456 bytes" in naming[0], result.output
