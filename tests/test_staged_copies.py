"""Staged copies do not pile up: a run removes the copy it made unless data.staging.keep is true,
says where it was and how big, and `mlhpc stage --list / --clean` lists and removes a node's
copies: only real folders owned by the user and marked by mlhpc's staging, never through a link."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_run_e2e import tiny_args, tiny_data  # noqa: F401 (fixture)

from mlhpc.cli import main
from mlhpc.data.stage.collective import StagingResult
from mlhpc.data.stage.copies import find_copies, release, remove_copy
from mlhpc.data.claims import write_claim
from mlhpc.data.stage.dest import COPY_KIND
from mlhpc.errors import StagingError


def _copy(path: Path, sizes: list[int]) -> Path:
    """A staged copy as staging leaves it: claimed, its files listed in the claim."""
    path.mkdir(parents=True, mode=0o700)
    for i, size in enumerate(sizes):
        (path / "train" / f"f{i}.bin").parent.mkdir(exist_ok=True)
        (path / "train" / f"f{i}.bin").write_bytes(b"x" * size)
    write_claim(path, COPY_KIND, [f"train/f{i}.bin" for i in range(len(sizes))])
    return path


@pytest.fixture
def node(tmp_path) -> dict[str, Path]:
    """A node's scratch: two marked copies (one holding a link out), an unmarked folder, a link
    to a marked copy, and a file outside that the link points at."""
    root = tmp_path / "scratch"
    outside = tmp_path / "precious.txt"
    outside.write_text("keep me")
    a = _copy(root / "mlhpc-user-aaa", [1000, 500])
    (a / "train" / "out-link").symlink_to(outside)
    b = _copy(root / "mlhpc-user-bbb", [2000])
    (root / "someone-elses-data").mkdir()
    (root / "someone-elses-data" / "x.h5").write_bytes(b"y" * 10)
    (root / "mlhpc-link").symlink_to(b)
    return {"root": root, "a": a, "b": b, "outside": outside}


def test_find_lists_only_marked_real_folders_with_sizes(node):
    copies = find_copies([node["root"]])
    assert [c.path for c in copies] == [node["a"], node["b"]]
    assert [c.size_bytes for c in copies] == [1500, 2000]  # the link is neither followed nor counted


def test_clean_removes_them_and_nothing_through_a_link(node):
    """A link staging did not make is something its claim does not list: that copy is left
    whole, said in one line, and the other removed."""
    result = CliRunner().invoke(main, ["stage", "--clean", "--in", str(node["root"])])
    assert result.exit_code == 0, result.output
    assert f"removed: {node['b']}  0.0 MB, 1 files" in result.output
    assert result.output.strip().endswith("1 staged copy, 0.0 MB removed")
    assert f"{node['a'] / 'train' / 'out-link'}: not made by mlhpc in this staged copy; nothing removed" \
        in result.stderr
    assert (node["a"] / "train" / "f0.bin").exists() and not node["b"].exists()
    assert node["outside"].read_text() == "keep me"
    assert (node["root"] / "someone-elses-data" / "x.h5").exists() and (node["root"] / "mlhpc-link").is_symlink()
    with pytest.raises(StagingError, match="not a staged copy of yours"):
        remove_copy(node["root"] / "mlhpc-link")


def test_list_names_path_size_and_refuses_a_config(node):
    out = CliRunner().invoke(main, ["stage", "--list", "--in", str(node["root"])])
    assert out.exit_code == 0 and f"staged copy: {node['b']}  0.0 MB, 1 files" in out.output
    assert node["a"].exists()  # listing removes nothing
    bad = CliRunner().invoke(main, ["stage", "configs/cosmoflow-mini.yaml", "--list"])
    assert bad.exit_code == 2 and "give no CONFIG" in bad.output


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's folder needs root")
def test_another_users_copy_is_never_listed_or_removed(node):
    os.chown(node["b"], 65534, 65534)
    assert [c.path for c in find_copies([node["root"]])] == [node["a"]]
    with pytest.raises(StagingError):
        remove_copy(node["b"])
    assert node["b"].exists()


def _staged(dest: Path, copied: int) -> StagingResult:
    return StagingResult(source=Path("/src"), dest=dest, staged_files=1, staged_bytes=1000, copied_files=copied,
                         copied_bytes=copied, skipped_files=1 - copied, pruned_files=0, elapsed_s=0.1, gb_per_s=0.0,
                         per_node=[{"node_rank": 0, "dest": str(dest), "copied_files": copied}])


def test_release_removes_what_the_run_made_unless_kept(tmp_path):
    made = _copy(tmp_path / "made", [1_000_000])
    assert release(_staged(made, 1), keep=True, local_rank=0).startswith(f"staged copy kept: {made} (1.0 MB")
    assert made.exists()
    assert release(_staged(made, 1), keep=False, local_rank=1) is None and made.exists()  # not the node's rank 0
    said = release(_staged(made, 1), keep=False, local_rank=0)
    assert said == f"staged copy removed: {made} (1.0 MB; data.staging.keep: true keeps it)" and not made.exists()
    before = _copy(tmp_path / "before", [10])
    assert "it was in place before this run" in release(_staged(before, 0), keep=False, local_rank=0)
    assert before.exists()


def test_a_run_removes_its_copy_and_keep_keeps_it(tmp_path, repo, tiny_data):  # noqa: F811
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(scratch)}
    for keep in ("false", "true"):
        proc = subprocess.run([sys.executable, "-m", "mlhpc", *tiny_args(
            repo, tiny_data, tmp_path / f"out-{keep}", "--set", "train.max_epochs=1",
            "--set", "data.staging.enabled=true", "--set", f"data.staging.keep={keep}")],
            capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
        assert proc.returncode in (0, 1), proc.stderr[-2000:]
        copies = find_copies([scratch])
        if keep == "false":
            assert copies == [] and "staged copy removed: " + str(scratch) in proc.stdout
        else:
            assert len(copies) == 1 and f"staged copy kept: {copies[0].path}" in proc.stdout
            assert copies[0].size_bytes > 0 and copies[0].source == str(tiny_data.resolve())


def test_a_copy_another_run_reads_is_never_removed(tmp_path):
    """Two runs of one data set on one node share the default folder: the one that made the copy
    ends first and leaves it to the other, and --clean leaves it too, until the reader is done."""
    made = _copy(tmp_path / "scratch" / "mlhpc-user-shared", [1000])
    reader = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from mlhpc.data.stage.copies import hold; hold(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)"), str(made)], stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "held"
        from mlhpc.data.stage import copies

        copies.RELEASE_WAIT_S = 0.5
        said = release(_staged(made, 1), keep=False, local_rank=0)
        assert said.startswith("staged copy left in place: ") and "in use by another run" in said
        out = CliRunner().invoke(main, ["stage", "--clean", "--in", str(tmp_path / "scratch")])
        assert out.exit_code == 0 and "in use by another run on this node" in out.stderr
        assert made.exists()
    finally:
        reader.kill()
        reader.wait()
    assert release(_staged(made, 1), keep=False, local_rank=0).startswith("staged copy removed: ")
    assert not made.exists()
