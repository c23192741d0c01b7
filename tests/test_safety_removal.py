"""Nothing the user has is ever deleted: mlhpc removes only what a claim record says it made
(`mlhpc.data.claims`), through the one remover, and refuses with one line, before touching
anything, a folder that merely looks like its own. Tested through the CLI."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import tree_bytes

from mlhpc.cli import main
from mlhpc.data import embedded
from mlhpc.data.claims import CLAIM_NAME, RemovalRefused, make_claimed_dir, remove_claimed
from mlhpc.data.files import write_text_atomic
from mlhpc.data.stage.copies import find_copies, release, remove_copy
from mlhpc.data.statefiles import recording
from mlhpc.errors import StagingError

REPO = Path(__file__).resolve().parents[1]
MINI = REPO / "configs" / "cosmoflow-mini.yaml"
TINY_SYNTH = ["--set", "synth.cube_size=8", "--set", "synth.train_samples=4", "--set",
              "synth.eval_samples=2", "--set", "synth.workers=1"]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    for rel, text in {"train/a.bin": "a" * 100, "validation/b.bin": "b" * 50}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _stage(src: Path, dest: Path):
    return CliRunner().invoke(main, ["stage", str(MINI), "--set", f"data.path={src}",
                                     "--set", f"data.staging.dest={dest}"])


def _one_error_line(result) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    return lines[0]


def test_a_destination_that_is_another_dataset_is_refused_untouched(tmp_path, src):
    """A staging destination that names another dataset mlhpc wrote (its manifest inside, as
    every synthesised or converted folder has) is not a staged copy: refused before anything in
    it is pruned, overwritten or, at the run's end, removed."""
    other = tmp_path / "other-dataset"
    made = CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(other), *TINY_SYNTH])
    assert made.exit_code == 0, made.output
    before = tree_bytes(other)
    line = _one_error_line(_stage(src, other))
    assert f"the staging destination {other} holds files mlhpc did not stage and is no staged copy of yours" in line
    assert tree_bytes(other) == before
    with pytest.raises(StagingError, match="not a staged copy of yours"):
        remove_copy(other)
    assert tree_bytes(other) == before


def test_results_inside_a_staged_copy_are_never_lost(tmp_path, src):
    """An output folder inside a staging destination: the run's results are not staging's, so
    the next staging is refused, --clean leaves the copy, and a run's end leaves it in place."""
    dest = tmp_path / "node" / "copy"
    assert _stage(src, dest).exit_code == 0
    (dest / "results").mkdir()
    (dest / "results" / "result_0.txt").write_text(":::MLLOG {}\n")
    before = tree_bytes(dest)
    line = _one_error_line(_stage(src, dest))
    assert line.startswith(f"mlhpc: error: {dest / 'results' / 'result_0.txt'}: in the staging destination")
    cleaned = CliRunner().invoke(main, ["stage", "--clean", "--in", str(dest.parent)])
    assert cleaned.exit_code == 0 and "0 staged copies, 0.0 MB removed" in cleaned.stdout
    assert f"{dest / 'results' / 'result_0.txt'}: not made by mlhpc in this staged copy; nothing removed" \
        in cleaned.stderr
    from test_staged_copies import _staged

    said = release(_staged(dest, 1), keep=False, local_rank=0)
    assert said.startswith("staged copy left in place: ") and "result_0.txt" in said
    assert tree_bytes(dest) == before


def test_a_file_left_inside_a_copy_keeps_the_whole_copy(tmp_path, src):
    dest = tmp_path / "copy"
    assert _stage(src, dest).exit_code == 0
    (dest / "train" / "notes.txt").write_text("mine")
    with pytest.raises(StagingError, match=r"train/notes.txt: not made by mlhpc in this staged copy"):
        remove_copy(dest)
    assert (dest / "train" / "notes.txt").read_text() == "mine" and (dest / "train" / "a.bin").exists()
    (dest / "train" / "notes.txt").unlink()
    assert remove_copy(dest).files == 2 and not dest.exists()


def test_a_claim_copied_into_another_folder_licenses_nothing(tmp_path, src):
    """A claim record names the folder it was written in (device and inode): copied (or moved,
    or planted) into a user's folder, that folder is neither listed nor removed."""
    dest = tmp_path / "scratch" / "copy"
    assert _stage(src, dest).exit_code == 0
    mine = tmp_path / "scratch" / "mine"
    (mine / "train").mkdir(parents=True, mode=0o700)
    mine.chmod(0o700)
    (mine / "train" / "a.bin").write_text("my own bytes")
    shutil.copy(dest / CLAIM_NAME, mine / CLAIM_NAME)
    assert [c.path for c in find_copies([tmp_path / "scratch"])] == [dest]
    cleaned = CliRunner().invoke(main, ["stage", "--clean", "--in", str(tmp_path / "scratch")])
    assert cleaned.exit_code == 0 and not dest.exists()
    assert (mine / "train" / "a.bin").read_text() == "my own bytes"
    with pytest.raises(RemovalRefused, match="its claim record was written for another folder"):
        remove_claimed(mine, "staged-copy", "staged copy")
    claim = json.loads((mine / CLAIM_NAME).read_text())
    claim["folder"] = {"dev": os.stat(mine).st_dev, "ino": os.stat(mine).st_ino}
    (mine / CLAIM_NAME).write_text(json.dumps(claim))  # a claim made to fit: still only its files
    (mine / "train" / "more.txt").write_text("not listed")
    with pytest.raises(RemovalRefused, match="train/more.txt: not made by mlhpc"):
        remove_claimed(mine, "staged-copy", "staged copy")
    assert (mine / "train" / "a.bin").read_text() == "my own bytes"
    assert (mine / "train" / "more.txt").read_text() == "not listed"


def test_a_link_swapped_in_is_never_followed(tmp_path, src):
    """A listed file replaced by a link to a user's file: the link is not what staging wrote,
    so the copy is refused; the user's file is untouched either way."""
    dest = tmp_path / "copy"
    assert _stage(src, dest).exit_code == 0
    precious = tmp_path / "precious.txt"
    precious.write_text("keep")
    (dest / "train").rename(tmp_path / "moved")
    (dest / "train").symlink_to(tmp_path / "moved")
    with pytest.raises(StagingError, match="not made by mlhpc"):
        remove_copy(dest)
    assert (tmp_path / "moved" / "a.bin").exists() and precious.read_text() == "keep"


def test_a_reader_that_died_never_blocks_removal(tmp_path, src):
    """"In use" is a lock the reader holds: killed with SIGKILL, the kernel drops it, so the
    copy can be removed at once (a process id read from a file could name a live stranger)."""
    dest = tmp_path / "scratch" / "copy"
    assert _stage(src, dest).exit_code == 0
    reader = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from mlhpc.data.stage.copies import hold; hold(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)"), str(dest)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "held"
        with pytest.raises(StagingError, match="in use by another run"):
            remove_copy(dest)
    finally:
        reader.send_signal(signal.SIGKILL)
        reader.wait()
    assert remove_copy(dest).files == 2 and not dest.exists()


def test_a_changed_synthesis_is_refused_never_deleted(tmp_path):
    """A synthesised folder where the user left a file: `data synth` and a run refuse it with
    one line that names the file; nothing of it is deleted or rewritten."""
    out = tmp_path / "data"
    assert CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(out), *TINY_SYNTH]).exit_code == 0
    (out / "my-notes.txt").write_text("mine")
    before = tree_bytes(out)
    line = _one_error_line(CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(out), *TINY_SYNTH]))
    assert "my-notes.txt was not written by the synthesis" in line and "never deletes" in line
    run = CliRunner().invoke(main, ["run", str(MINI), "--set", f"data.path={out}", *TINY_SYNTH,
                                    "--set", f"output.dir={tmp_path / 'out'}"])
    assert "my-notes.txt was not written by the synthesis" in _one_error_line(run)
    assert tree_bytes(out) == before


def test_a_hidden_synthesis_folder_mlhpc_did_not_claim_is_left_alone(tmp_path):
    """A folder with the name synthesis writes into, made by the user (no claim): never used,
    never removed."""
    out = tmp_path / "data"
    hidden = embedded.staging_folder(out)
    (hidden / "train").mkdir(parents=True)
    (hidden / "train" / "keep.h5").write_text("mine")
    hidden.chmod(0o700)
    line = _one_error_line(CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(out), *TINY_SYNTH]))
    assert f"{hidden}: the hidden folder synthesis writes into is not mlhpc's (no claim record" in line
    assert (hidden / "train" / "keep.h5").read_text() == "mine" and not out.exists()


def test_a_synthesis_with_other_settings_is_replaced_only_when_mlhpc_made_it(tmp_path):
    """An interrupted synthesis with other settings is removed and started afresh only inside a
    hidden folder mlhpc claimed, and only what its writers recorded making there."""
    out = tmp_path / "data"
    hidden = make_claimed_dir(embedded.staging_folder(out), embedded.SYNTH_KIND)
    (hidden / embedded.INTENT).write_text(json.dumps({"workload": "cosmoflow", "seed": 99, "synth": {}}))
    (hidden / "train").mkdir()
    with recording(hidden):  # put in place by mlhpc's writer: recorded as mlhpc's
        write_text_atomic(hidden / "train" / "old.h5", "stale")
    made = CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(out), *TINY_SYNTH])
    assert made.exit_code == 0, made.output
    assert not hidden.exists() and not (out / "train" / "old.h5").exists()
    assert embedded.describe(out) == "complete" and not (out / CLAIM_NAME).exists()
