"""The data-layer safety rules (issue 22) through the commands a user types, for what
tests/test_data_safety.py leaves out: modes of converted outputs, the one destination check of
stage, convert, prepare and report --package, overlap for every command, links planted in
destinations, read-only and full destinations, truncated files, and a killed prepare.

Read-only and full destinations are real where this process may mount a tmpfs (root), and
simulated (an OSError from the write) everywhere.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import cosmoflow_writers as w
import h5py
import numpy as np
import pytest
from click.testing import CliRunner
from test_data_safety import cli, one_line

from mlhpc.cli import main
from mlhpc.data import convert as data_convert
from mlhpc.data.manifest import JOURNAL_PREFIX, MANIFEST_NAME
from mlhpc.workload import get

TRAIN, VALID = w.samples(4, seed=5), w.samples(2, seed=6)
MINI_RUNS = Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs"


def modes(root: Path) -> set[int]:
    """The permission bits of every regular file under ``root``."""
    return {stat.S_IMODE(p.lstat().st_mode) for p in root.rglob("*") if p.is_file() and not p.is_symlink()}


def set_modes(root: Path, mode: int) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            path.chmod(mode)


@pytest.fixture()
def tfdata(tmp_path: Path) -> Path:
    return w.write_dataset(tmp_path / "tf", "tfrecord-plain", TRAIN, VALID, per_file=2)


@pytest.fixture()
def raw(tmp_path: Path) -> Path:
    """Two raw 16^3 universes, as CosmoFlow's prepare.py reads them."""
    folder = tmp_path / "raw"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        with h5py.File(folder / f"univ_ics_2019-03_a{i:08d}.hdf5", "w") as f:
            f["full"] = rng.integers(0, 100, (16, 16, 16, 4)).astype(np.int16)
            f["unitPar"] = rng.uniform(-1, 1, 4).astype(np.float32)
    return folder


def stage_args(repo: Path, source: Path, dest: Path, *more: str) -> list[str]:
    return ["stage", str(repo / "configs" / "cosmoflow-mini.yaml"), "--set", f"data.path={source}",
            "--set", f"data.staging.dest={dest}", *more]


def convert_args(source: Path, dest: Path) -> list[str]:
    return ["data", "convert", "cosmoflow", str(source), str(dest), "--to", "npy"]


def prepare_args(raw: Path, dest: Path) -> list[str]:
    return ["data", "prepare", "cosmoflow", str(raw), str(dest), "--to", "npy", "--option", "sample_size=8"]


def package_args(dest: Path, run: Path = MINI_RUNS) -> list[str]:
    return ["report", str(run), "--package", str(dest), "--no-check"]


def run_folder(tmp_path: Path) -> Path:
    """A copy of the mini runs (a run folder the test may put things in)."""
    run = tmp_path / "run"
    run.mkdir()
    for path in MINI_RUNS.iterdir():
        (run / path.name).write_bytes(path.read_bytes())
    return run


@contextmanager
def tmpfs(where: Path, size_bytes: int, read_only: bool = False) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` (mode 0700), read-only after mounting
    when asked; skips the test where this process may not mount."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0700", "tmpfs",
                              str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()[:80]})")
    try:
        if read_only:
            subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


# ---- 1. modes: converted outputs never wider than their source --------------------------------


@pytest.mark.parametrize("source_mode", [0o600, 0o640])
def test_convert_outputs_keep_the_source_mode(tfdata: Path, tmp_path: Path, source_mode: int) -> None:
    set_modes(tfdata, source_mode)
    out = tmp_path / "npy"
    code, err = cli(*convert_args(tfdata, out))
    assert code == 0, err
    assert list(out.rglob("*_data.npy")) and (out / "train" / "files_data.lst").is_file()
    # every output (samples, file lists, manifest) has the source's bits or fewer, never more
    assert modes(out) == {source_mode & ~current_umask()}
    assert stat.S_IMODE(out.stat().st_mode) == 0o700  # a new destination


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_prepare_outputs_never_wider_than_the_raw_files(raw: Path, tmp_path: Path) -> None:
    set_modes(raw, 0o600)
    out = tmp_path / "prepared"
    code, err = cli(*prepare_args(raw, out))
    assert code == 0, err
    assert modes(out) == {0o600} and stat.S_IMODE(out.stat().st_mode) == 0o700


def test_stage_that_converts_keeps_the_source_mode(tfdata: Path, tmp_path: Path, repo: Path) -> None:
    set_modes(tfdata, 0o600)
    dest = tmp_path / "node"
    code, err = cli(*stage_args(repo, tfdata, dest, "--set", "data.staging.to=npy"))
    assert code == 0, err
    assert list(dest.rglob("*_data.npy"))
    assert modes(dest) == {0o600}


def test_package_files_never_wider_than_the_logs(tmp_path: Path) -> None:
    run = run_folder(tmp_path)
    set_modes(run, 0o600)
    code, err = cli(*package_args(tmp_path / "pkg", run))
    assert code == 0, err
    results = list((tmp_path / "pkg").rglob("result_*.txt"))
    assert len(results) == 3 and {stat.S_IMODE(p.stat().st_mode) for p in results} == {0o600}
    (system,) = (tmp_path / "pkg").rglob("systems/*.json")
    assert stat.S_IMODE(system.stat().st_mode) == 0o600  # made here: private
    import mlhpc

    source = Path(mlhpc.__file__).parent / "cli.py"
    (copied,) = (tmp_path / "pkg").rglob("implementations/mlhpc/mlhpc/cli.py")
    assert stat.S_IMODE(copied.stat().st_mode) == stat.S_IMODE(source.stat().st_mode) & 0o666
    folders = [p for p in (tmp_path / "pkg").rglob("*") if p.is_dir()] + [tmp_path / "pkg"]
    assert {stat.S_IMODE(p.stat().st_mode) for p in folders} == {0o700}


# ---- 2. the one destination check ------------------------------------------------------------


def destination_case(command: str, tfdata: Path, raw: Path, repo: Path, dest: Path) -> list[str]:
    """The command line of ``command`` writing to ``dest``."""
    return {"stage": lambda: stage_args(repo, tfdata, dest),
            "convert": lambda: convert_args(tfdata, dest),
            "prepare": lambda: prepare_args(raw, dest),
            "package": lambda: package_args(dest)}[command]()


COMMANDS = ["stage", "convert", "prepare", "package"]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("mode", [0o775, 0o777, 0o720])
def test_a_destination_others_can_write_is_refused(tmp_path: Path, tfdata: Path, raw: Path, repo: Path,
                                                   command: str, mode: int) -> None:
    dest = tmp_path / "shared"
    dest.mkdir()
    dest.chmod(mode)
    code, err = cli(*destination_case(command, tfdata, raw, repo, dest))
    me = f"(uid {os.geteuid()})"
    one_line(code, err, str(dest), "owned by ", me, f"with mode {mode:04o}", "writable by nobody else")
    assert os.listdir(dest) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_linked_destination_is_refused(tmp_path: Path, tfdata: Path, raw: Path, repo: Path,
                                         command: str) -> None:
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    dest = tmp_path / "link"
    dest.symlink_to(target)
    code, err = cli(*destination_case(command, tfdata, raw, repo, dest))
    one_line(code, err, str(dest), "symbolic link")
    assert os.listdir(target) == []


@pytest.mark.parametrize("command", COMMANDS)
def test_a_new_destination_is_created_0700(tmp_path: Path, tfdata: Path, raw: Path, repo: Path,
                                           command: str) -> None:
    dest = tmp_path / "fresh" / "dest"
    code, err = cli(*destination_case(command, tfdata, raw, repo, dest))
    assert code == 0, err
    assert stat.S_IMODE(dest.stat().st_mode) == 0o700


def test_another_users_destination_is_refused_for_package(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a folder owned by another user needs root")
    dest = tmp_path / "theirs"
    dest.mkdir(mode=0o700)
    os.chown(dest, 65534, 65534)
    code, err = cli(*package_args(dest))
    one_line(code, err, "theirs: --package destination folder is owned by", "65534", "mode 0700")


# ---- 3. overlap ------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside", "around", "same"])
@pytest.mark.parametrize("command", COMMANDS)
def test_source_and_destination_may_not_contain_each_other(tmp_path: Path, tfdata: Path, raw: Path,
                                                           repo: Path, command: str, where: str) -> None:
    source = {"stage": tfdata, "convert": tfdata, "prepare": raw, "package": run_folder(tmp_path)}[command]
    dest = {"inside": source / "out", "around": source.parent, "same": source}[where]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    args = {"stage": lambda: stage_args(repo, source, dest),
            "convert": lambda: convert_args(source, dest),
            "prepare": lambda: prepare_args(source, dest),
            "package": lambda: package_args(dest, source)}[command]()
    code, err = cli(*args)
    words = {"inside": "lies inside its source", "around": "contains its source",
             "same": "is its source folder"}[where]
    one_line(code, err, f"destination {words}")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


# ---- 4. links planted in a destination --------------------------------------------------------


@pytest.mark.parametrize("command", ["convert", "prepare"])
def test_a_link_planted_in_the_destination_is_never_written_through(tmp_path: Path, tfdata: Path,
                                                                     raw: Path, command: str) -> None:
    out = tmp_path / "out"
    args = convert_args(tfdata, out) if command == "convert" else prepare_args(raw, out)
    code, err = cli(*args)
    assert code == 0, err
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep me")
    for path in sorted((out / "train").iterdir()):
        path.unlink()
    (out / "train").rmdir()
    (out / "train").symlink_to(outside)  # the split folder, replaced by a link
    (out / MANIFEST_NAME).unlink()  # and the folder made to look unfinished, so it is written again
    code, err = cli(*args)
    one_line(code, err, str(out / "train"), "symbolic link")
    assert sorted(os.listdir(outside)) == ["keep.txt"]


def test_a_linked_output_file_is_replaced_not_written_through(tmp_path: Path, tfdata: Path) -> None:
    out = tmp_path / "out"
    code, err = cli(*convert_args(tfdata, out))
    assert code == 0, err
    victim = sorted((out / "train").glob("*_data.npy"))[0]
    secret = tmp_path / "secret"
    secret.write_text("private")
    victim.unlink()
    victim.symlink_to(secret)  # a planted link where an output goes
    code, err = cli(*convert_args(tfdata, out))
    assert code == 0, err
    assert secret.read_text() == "private"
    assert not victim.is_symlink() and victim.stat().st_size > 128
    code, err = cli("data", "check", "cosmoflow", str(out))
    assert code == 0, err


# ---- 5. file-system faults ---------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_read_only_destination_is_one_line(tmp_path: Path, tfdata: Path, raw: Path, repo: Path,
                                             command: str) -> None:
    with tmpfs(tmp_path / "ro", 1 << 20, read_only=True) as dest:
        code, err = cli(*destination_case(command, tfdata, raw, repo, dest))
    one_line(code, err, str(dest), "read-only file system")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_destination_is_one_line(tmp_path: Path, tfdata: Path, raw: Path, repo: Path,
                                        command: str) -> None:
    with tmpfs(tmp_path / "full", 8192) as dest:
        code, err = cli(*destination_case(command, tfdata, raw, repo, dest))
    one_line(code, err, str(dest), "no space left on device")


@pytest.mark.parametrize("cause", [errno.ENOSPC, errno.EROFS])
def test_stage_write_faults_are_one_line(tmp_path: Path, tfdata: Path, repo: Path, cause: int,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(fd: int, data: object) -> int:
        raise OSError(cause, os.strerror(cause))

    monkeypatch.setattr(os, "write", fails)  # only staging's copy writes with os.write
    code, err = cli(*stage_args(repo, tfdata, tmp_path / "node"))
    monkeypatch.undo()
    words = "staging destination full" if cause == errno.ENOSPC else "read-only file system"
    one_line(code, err, str(tmp_path / "node"), words)
    assert not (tmp_path / "node" / MANIFEST_NAME).exists()


@pytest.mark.parametrize("cause", [errno.ENOSPC, errno.EROFS])
def test_package_write_faults_are_one_line(tmp_path: Path, cause: int,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def fails(fd: int) -> None:
        raise OSError(cause, os.strerror(cause))

    monkeypatch.setattr(os, "fsync", fails)  # where a full NFS or Lustre target reports it
    code, err = cli(*package_args(tmp_path / "pkg"))
    monkeypatch.undo()
    words = "no space left on device" if cause == errno.ENOSPC else "read-only file system"
    one_line(code, err, str(tmp_path / "pkg"), "--package cannot write the package", words)
    assert not [p for p in (tmp_path / "pkg").rglob("*") if p.is_file()]  # no partial file left


def test_convert_on_a_read_only_output_is_one_line_and_resumable(tfdata: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    tools = get("cosmoflow").data_tools
    real = type(tools).convert_file

    def read_only(self, path, fmt, out_dir, to):
        raise OSError(errno.EROFS, "Read-only file system", str(out_dir / "x_data.npy"))

    monkeypatch.setattr(type(tools), "convert_file", read_only)
    out = tmp_path / "npy"
    code, err = cli(*convert_args(tfdata, out))
    one_line(code, err, "x_data.npy: cannot write output (read-only file system", "to resume")
    monkeypatch.setattr(type(tools), "convert_file", real)
    code, err = cli(*convert_args(tfdata, out))
    assert code == 0 and (out / MANIFEST_NAME).is_file(), err


@pytest.mark.parametrize("form", ["hdf5", "npy", "tfrecord-plain"])
def test_check_full_on_a_truncated_file_is_one_line(tmp_path: Path, form: str) -> None:
    data = w.write_dataset(tmp_path / "d", form, TRAIN, VALID)
    victim = sorted(p for p in (data / "train").iterdir() if not p.name.endswith((".lst", "_label.npy")))[0]
    victim.write_bytes(victim.read_bytes()[:-100])
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(data), "--full"])
    err = result.stderr
    assert result.exit_code == 2 and "Traceback" not in err, err
    bad = [line for line in result.stdout.splitlines() + err.splitlines() if victim.name in line]
    assert len(bad) == 1, (result.output, err)  # the file named once, with its cause
    assert "truncated" in bad[0] or "unreadable" in bad[0] or "ends" in bad[0], bad[0]
    errors = [line for line in err.splitlines() if line.startswith("mlhpc: error:")]
    assert len(errors) == 1


# ---- 6. cheap checks: sizes against headers ----------------------------------------------------


def test_quick_check_catches_a_truncated_cosmoflow_npy(tmp_path: Path) -> None:
    data = w.write_dataset(tmp_path / "npy", "npy", TRAIN, VALID)
    victim = sorted((data / "train").glob("*_data.npy"))[0]
    whole = victim.stat().st_size
    victim.write_bytes(victim.read_bytes()[:-100])
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(data)])
    assert result.exit_code == 2, result.output
    text = result.output + result.stderr
    assert f"{victim}: truncated" in text and f"ends at byte {whole}" in text
    assert f"has {whole - 100} bytes" in text
    with victim.open("ab") as handle:  # a file longer than its header says is refused too
        handle.write(b"\0" * 200)
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(data)])
    assert result.exit_code == 2 and "longer than its header says" in result.output + result.stderr


def test_quick_check_catches_a_truncated_deepcam_npy(tmp_path: Path) -> None:
    from mlhpc_workloads.deepcam.synth import SynthConfig, synthesize

    src = tmp_path / "h5"
    synthesize(src, SynthConfig(height=32, width=32, train_samples=2, validation_samples=1,
                                  cyclones_per_sample=0.0, rivers_per_sample=0.0), seed=0)
    out = tmp_path / "npy"
    code, err = cli("data", "convert", "deepcam", str(src), str(out), "--to", "npy")
    assert code == 0, err
    victim = sorted((out / "train").glob("data-*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:-64])
    result = CliRunner().invoke(main, ["data", "check", "deepcam", str(out)])
    assert result.exit_code == 2 and victim.name in result.output + result.stderr


def test_quick_check_catches_a_contiguous_hdf5_cut_inside_its_counts(tmp_path: Path) -> None:
    data = w.write_dataset(tmp_path / "h5", "hdf5", TRAIN, VALID)
    victim = sorted((data / "train").glob("*.h5"))[0]
    with h5py.File(victim, "r") as f:
        end = f["full"].id.get_offset() + f["full"].nbytes
    body = victim.read_bytes()
    if end >= len(body):
        pytest.skip("the counts are the file's last bytes; a cut would break the superblock check")
    victim.write_bytes(body[: end - 8])
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(data)])
    assert result.exit_code == 2 and victim.name in result.output + result.stderr


def test_check_help_stays_true() -> None:
    """Quick does what costs no more than headers and framing; the size a header implies is
    such a thing, so the help's promise covers it."""
    text = " ".join(CliRunner().invoke(main, ["data", "check", "--help"]).output.split())
    assert "headers and record framing" in text


# ---- 7. the link opt-in named in the message exists --------------------------------------------


def test_the_link_error_names_the_real_switch(tmp_path: Path, tfdata: Path, repo: Path) -> None:
    first = sorted((tfdata / "train").iterdir())[0]
    (tfdata / "train" / "alias.tfrecord").symlink_to(first)
    code, err = cli(*stage_args(repo, tfdata, tmp_path / "node"))
    one_line(code, err, "alias.tfrecord: symbolic link in the source", "--set data.staging.follow_links=true")
    assert "--follow-links" not in err
    code, err = cli(*stage_args(repo, tfdata, tmp_path / "node", "--set", "data.staging.follow_links=true"))
    assert code == 0, err
    assert (tmp_path / "node" / "train" / "alias.tfrecord").read_bytes() == first.read_bytes()


# ---- 8. a killed prepare --------------------------------------------------------------------------


def test_a_killed_prepare_is_refused_by_check_stage_and_run(raw: Path, tmp_path: Path, repo: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    tools = get("cosmoflow").data_tools
    real = type(tools).prepare_file

    def dies(self, path, out_dir, to, size):
        if path.name.endswith("1.hdf5"):
            raise KeyboardInterrupt  # the process is gone: nothing after this runs
        return real(self, path, out_dir, to, size)

    monkeypatch.setattr(type(tools), "prepare_file", dies)
    out = tmp_path / "prepared"
    with pytest.raises(KeyboardInterrupt):
        data_convert.prepare(get("cosmoflow"), raw, out, "npy",
                             data_convert.ConvertOptions(prepare_options={"sample_size": 8}))
    monkeypatch.undo()
    assert not (out / MANIFEST_NAME).exists() and list(out.glob(JOURNAL_PREFIX + "*"))
    code, err = cli("data", "check", "cosmoflow", str(out))
    one_line(code, err, "unfinished dataset")
    code, err = cli(*stage_args(repo, out, tmp_path / "node"))
    one_line(code, err, "unfinished dataset")
    code, err = cli("run", str(repo / "configs" / "cosmoflow-mini.yaml"), "--set", f"data.path={out}",
                    "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={tmp_path / 'r'}",
                    "--set", "data.staging.enabled=false")
    one_line(code, err, "unfinished dataset")
    code, err = cli(*prepare_args(raw, out))  # running it again finishes it
    assert code == 0 and (out / MANIFEST_NAME).is_file(), err
    code, err = cli("data", "check", "cosmoflow", str(out))
    assert code == 0, err


def test_oc20_prepare_narrows_what_lmdb_creates(tmp_path: Path) -> None:
    """LMDB creates its file itself (mode 0755 before the umask): the driver narrows it to the
    trajectory's bits."""
    import ase.io
    from ase.build import fcc111
    from ase.calculators.singlepoint import SinglePointCalculator

    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(2):
        atoms = fcc111("Cu", size=(2, 2, 2), vacuum=6.0, periodic=True)
        atoms.info.pop("adsorbate_info", None)  # not a scalar: extxyz would warn and skip it
        atoms.rattle(0.02, seed=i)
        atoms.calc = SinglePointCalculator(atoms, energy=float(i), forces=np.zeros((len(atoms), 3)))
        ase.io.write(raw / f"traj{i}.extxyz", [atoms], format="extxyz")
        (raw / f"traj{i}.extxyz").chmod(0o600)
    out = tmp_path / "lmdb"
    code, err = cli("data", "prepare", "oc20", str(raw), str(out))
    assert code == 0, err
    assert list(out.rglob("*.lmdb")) and modes(out) == {0o600}


def test_package_never_carries_a_linked_log_out_of_its_run_folder(tmp_path: Path) -> None:
    run = run_folder(tmp_path)
    secret = tmp_path / "secret.yaml"
    secret.write_text("password: hunter2\n")
    (run / "config_1.yaml").unlink()
    (run / "config_1.yaml").symlink_to(secret)
    code, err = cli(*package_args(tmp_path / "pkg", run))
    one_line(code, err, "config_1.yaml: run's config file is a symbolic link out of")
    assert not [p for p in (tmp_path / "pkg").rglob("*") if p.is_file() and b"hunter2" in p.read_bytes()]


def test_read_only_output_mode_leaves_the_writer_able_to_write(tmp_path):
    """A 0444 source's outputs are written through a temporary the owner can still open for
    writing by path (h5py reopens it; as a user other than root a 0444 file would refuse it),
    and end with the source's bits, no more."""
    from mlhpc.data.files import atomic_output, output_mode

    old = os.umask(0o022)
    try:
        with output_mode(0o444), atomic_output(tmp_path / "x.h5") as tmp:
            assert stat.S_IMODE(os.stat(tmp).st_mode) & 0o600 == 0o600
            with h5py.File(tmp, "w") as f:
                f.create_dataset("x", data=np.arange(3))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "x.h5").st_mode) == 0o444
    assert [p.name for p in tmp_path.iterdir()] == ["x.h5"]
