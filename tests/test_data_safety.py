"""The data commands on a shared node, tried as an attacker and as a careless user would: every
class of the data-layer issue, each through the command a user types where one exists.

1. links: none followed out of a source, none written through in a destination, modes never widened;
2. shared scratch: a destination another user made, or others can write, is refused; new ones 0700;
3. overlap: a source and a destination may not contain each other (stage, convert, prepare, package);
4. unfinished outputs: check, stage and run refuse a folder without its complete manifest;
5. file-system faults: one line, exit 2, resumable;
6. cheap checks: quick check reads record framing; a file listed twice is refused;
7. inputs that never end: devices and FIFOs as configs, giant log lines in reports;
8. signals: SIGINT closes the log (run_stop aborted) and exits 130.
"""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
from pathlib import Path

import cosmoflow_writers as w
import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.data import convert as data_convert
from mlhpc.data.manifest import JOURNAL_PREFIX, MANIFEST_NAME
from mlhpc.data.stage import StageOptions, stage
from mlhpc.errors import DataError, StagingError
from mlhpc.runtime import Runtime
from mlhpc.workload import get
from test_run_e2e import tiny_data  # noqa: F401 (fixture)

TRAIN, VALID = w.samples(4, seed=5), w.samples(2, seed=6)


def cli(*args: str) -> tuple[int, str]:
    """``mlhpc ARGS`` in process: (exit code, stderr)."""
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stderr


def one_line(code: int, err: str, *fragments: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.strip().splitlines()  # progress lines (stderr) aside
             if not re.match(r"^\d+/\d+ files|^\w+: \d+ of \d+ files already done", line)]
    assert len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])


@pytest.fixture()
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    for rel, text in {"train/a.bin": "a" * 1000, "validation/b.bin": "b" * 500, "README": "r"}.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_text(text)
    return src


@pytest.fixture()
def tfdata(tmp_path: Path) -> Path:
    return w.write_dataset(tmp_path / "tf", "tfrecord-plain", TRAIN, VALID, per_file=2)


# ---- 1. links -----------------------------------------------------------------------------------


def test_a_link_out_of_the_source_is_refused_naming_it(source: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("private")
    secret.chmod(0o600)
    (source / "train" / "leak.bin").symlink_to(secret)
    with pytest.raises(StagingError, match=r"train/leak\.bin: symbolic link in the source"):
        stage(source, tmp_path / "dst", Runtime())
    assert not (tmp_path / "dst" / "train" / "leak.bin").exists()
    # the opt-in reads links to files inside the source only
    with pytest.raises(StagingError, match=r"leak\.bin: symbolic link points outside the source"):
        stage(source, tmp_path / "dst", Runtime(), StageOptions(follow_links=True))


@pytest.mark.parametrize("command", ["convert", "check"])
def test_convert_and_check_refuse_a_linked_data_file(tfdata: Path, tmp_path: Path, command: str) -> None:
    victim = sorted((tfdata / "train").glob("*.tfrecord"))[0]
    private = tmp_path / "private.tfrecord"
    victim.rename(private)
    victim.symlink_to(private)
    args = (["data", "convert", "cosmoflow", str(tfdata), str(tmp_path / "out"), "--to", "npy"]
            if command == "convert" else ["data", "check", "cosmoflow", str(tfdata)])
    code, err = cli(*args)
    one_line(code, err, victim.name, "symbolic link in the dataset")
    assert not list((tmp_path / "out").rglob("*.npy")) if (tmp_path / "out").exists() else True


def test_follow_links_reads_a_link_inside_the_source(source: Path, tmp_path: Path) -> None:
    (source / "train" / "alias.bin").symlink_to(source / "train" / "a.bin")
    result = stage(source, tmp_path / "dst", Runtime(), StageOptions(follow_links=True))
    assert (tmp_path / "dst" / "train" / "alias.bin").read_text() == "a" * 1000
    assert not (tmp_path / "dst" / "train" / "alias.bin").is_symlink()
    assert result.staged_files == 4


def test_a_linked_folder_in_the_destination_is_never_written_through(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "dst"
    stage(source, dest, Runtime())
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "a.bin").write_text("keep me")
    for name in os.listdir(dest / "train"):
        os.unlink(dest / "train" / name)
    (dest / "train").rmdir()
    (dest / "train").symlink_to(outside)  # a planted link where a staged folder was
    with pytest.raises(StagingError, match=r"train.*(link|not a folder)"):
        stage(source, dest, Runtime())
    assert (outside / "a.bin").read_text() == "keep me"
    assert sorted(os.listdir(outside)) == ["a.bin"]


def test_copies_never_widen_permission_bits(source: Path, tmp_path: Path) -> None:
    (source / "train" / "a.bin").chmod(0o600)
    (source / "README").chmod(0o640)
    stage(source, tmp_path / "dst", Runtime())
    assert stat.S_IMODE(os.stat(tmp_path / "dst" / "train" / "a.bin").st_mode) & 0o077 == 0
    assert stat.S_IMODE(os.stat(tmp_path / "dst" / "README").st_mode) & 0o037 == 0


# ---- 2. shared scratch ------------------------------------------------------------------------


def test_a_destination_others_can_write_is_refused_naming_owner_and_mode(source: Path, tmp_path: Path) -> None:
    dest = tmp_path / "scratch"
    dest.mkdir()
    dest.chmod(0o777)  # as another user would pre-create a predictable name
    with pytest.raises(StagingError, match=r"scratch: staging destination folder is owned by \S+ \(uid \d+\) with mode 0777"):
        stage(source, dest, Runtime())
    assert os.listdir(dest) == []


def test_a_destination_another_user_owns_is_refused(source: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a folder owned by another user needs root")
    dest = tmp_path / "theirs"
    dest.mkdir(mode=0o700)
    os.chown(dest, 65534, 65534)
    with pytest.raises(StagingError, match=r"theirs: staging destination folder is owned by (nobody|uid 65534)"):
        stage(source, dest, Runtime())


def test_a_new_destination_is_created_0700(source: Path, tmp_path: Path) -> None:
    stage(source, tmp_path / "fresh", Runtime())
    assert stat.S_IMODE(os.stat(tmp_path / "fresh").st_mode) == 0o700


# ---- 3. overlap ---------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["inside", "around", "same"])
def test_stage_source_and_destination_may_not_contain_each_other(source: Path, where: str) -> None:
    dest = {"inside": source / "staged", "around": source.parent, "same": source}[where]
    with pytest.raises(StagingError, match=r"staging destination (lies inside|contains|is) its source"):
        stage(source, dest, Runtime())


@pytest.mark.parametrize("command", ["convert", "prepare"])
def test_convert_and_prepare_refuse_an_output_inside_their_input(tfdata: Path, command: str) -> None:
    args = (["data", "convert", "cosmoflow", str(tfdata), str(tfdata / "train" / "out"), "--to", "npy"]
            if command == "convert" else
            ["data", "prepare", "cosmoflow", str(tfdata), str(tfdata / "prepared"), "--to", "npy"])
    code, err = cli(*args)
    one_line(code, err, "destination lies inside its source")
    assert not (tfdata / "train" / "out").exists() and not (tfdata / "prepared").exists()


def test_package_refuses_the_run_folder_itself(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "result_0.txt").write_text(":::MLLOG {}\n")
    code, err = cli("report", str(run), "--package", str(run / "pkg"))
    one_line(code, err, "--package destination lies inside its source")


# ---- 4. unfinished outputs ---------------------------------------------------------------------


def _killed_convert(tfdata: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A convert that dies on its third file, as a kill would leave it."""
    tools = get("cosmoflow").data_tools
    real = type(tools).convert_file
    calls = []

    def dies(self, path, fmt, out_dir, to):
        calls.append(path)
        if len(calls) == 3:
            raise KeyboardInterrupt  # the process is gone: nothing after this runs
        return real(self, path, fmt, out_dir, to)

    monkeypatch.setattr(type(tools), "convert_file", dies)
    with pytest.raises(KeyboardInterrupt):
        data_convert.convert(get("cosmoflow"), tfdata, out, "npy")
    monkeypatch.setattr(type(tools), "convert_file", real)


def test_an_interrupted_convert_is_refused_by_check_stage_and_run(tfdata: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    out = tmp_path / "npy"
    _killed_convert(tfdata, out, monkeypatch)
    assert not (out / MANIFEST_NAME).exists() and list(out.glob(JOURNAL_PREFIX + "*"))
    code, err = cli("data", "check", "cosmoflow", str(out))
    one_line(code, err, "unfinished dataset", "run the command that made it again")
    with pytest.raises(StagingError, match="unfinished dataset"):
        stage(out, tmp_path / "staged", Runtime())
    code, err = cli("run", str(repo / "configs" / "cosmoflow-mini.yaml"), "--set", f"data.path={out}",
                    "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={tmp_path / 'r'}",
                    "--set", "data.staging.enabled=false")
    one_line(code, err, "unfinished dataset", "mlhpc data convert or prepare")
    # resuming finishes it: the second convert skips what the first finished and closes the folder
    result = data_convert.convert(get("cosmoflow"), tfdata, out, "npy")
    assert result.skipped_files == 2 and (out / MANIFEST_NAME).is_file()
    assert not list(out.glob(JOURNAL_PREFIX + "*"))
    code, err = cli("data", "check", "cosmoflow", str(out))
    assert code == 0, err


# ---- 5. file-system faults -------------------------------------------------------------------


def test_convert_into_a_file_is_one_line(tfdata: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    code, err = cli("data", "convert", "cosmoflow", str(tfdata), str(blocker), "--to", "npy")
    one_line(code, err, str(blocker), "cannot create the data convert output folder")
    code, err = cli("data", "convert", "cosmoflow", str(tfdata), str(blocker / "sub"), "--to", "npy")
    one_line(code, err, "cannot create")


def test_a_full_disk_during_convert_is_one_line_and_resumable(tfdata: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    tools = get("cosmoflow").data_tools
    real = type(tools).convert_file
    calls = []

    def full(self, path, fmt, out_dir, to):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(out_dir / "x.npy"))
        return real(self, path, fmt, out_dir, to)

    monkeypatch.setattr(type(tools), "convert_file", full)
    out = tmp_path / "npy"
    code, err = cli("data", "convert", "cosmoflow", str(tfdata), str(out), "--to", "npy")
    one_line(code, err, "x.npy: cannot write output (no space left on device", "run the command again to resume")
    assert not (out / MANIFEST_NAME).exists()  # never presented as complete
    monkeypatch.setattr(type(tools), "convert_file", real)
    code, err = cli("data", "convert", "cosmoflow", str(tfdata), str(out), "--to", "npy")
    assert code == 0, err
    assert json.loads((out / MANIFEST_NAME).read_text())["samples"] == 6


def test_check_full_on_a_truncated_file_names_it(tmp_path: Path) -> None:
    data = w.write_dataset(tmp_path / "h5", "hdf5", TRAIN, VALID)
    victim = sorted((data / "train").glob("*.h5"))[0]
    victim.write_bytes(victim.read_bytes()[:300])
    code, err = cli("data", "check", "cosmoflow", str(data), "--full")
    assert code == 2 and "Traceback" not in err, err
    assert victim.name in err


# ---- 6. cheap checks ---------------------------------------------------------------------------


def test_quick_check_reads_every_frame_of_an_uncompressed_tfrecord(tfdata: Path) -> None:
    victim = sorted((tfdata / "train").glob("*.tfrecord"))[0]
    body = bytearray(victim.read_bytes())
    length = int.from_bytes(body[:8], "little")
    second = length + 16  # the second record's header: damage its length word
    if second + 12 < len(body):
        body[second] ^= 0x01
    else:  # one record per file: cut the file inside its record instead
        body = body[: len(body) - 10]
    victim.write_bytes(bytes(body))
    code, err = cli("data", "check", "cosmoflow", str(tfdata))
    assert code == 2, err
    assert victim.name in err and ("CRC" in err or "truncated" in err)


def test_a_file_listed_twice_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "npy"
    src = w.write_dataset(tmp_path / "h5", "hdf5", TRAIN, VALID)
    data_convert.convert(get("cosmoflow"), src, out, "npy")
    listing = out / "train" / "files_data.lst"
    names = listing.read_text().split()
    listing.write_text("\n".join(names + names[:1]) + "\n")
    code, err = cli("data", "check", "cosmoflow", str(out))
    assert code == 2 and "listed twice" in err, err
    with pytest.raises(DataError, match="listed twice"):
        from types import SimpleNamespace

        from mlhpc_workloads.cosmoflow.data import build_datasets

        from mlhpc.config import DataConfig

        build_datasets(SimpleNamespace(data=DataConfig()), None, out)


def test_check_help_says_what_quick_and_full_verify() -> None:
    result = CliRunner().invoke(main, ["data", "check", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "quick" in text and "framing" in text and "--full" in text and "every sample" in text


# ---- 7. inputs that never end ------------------------------------------------------------------


@pytest.mark.parametrize("device", ["/dev/zero", "/dev/urandom"])
def test_a_device_as_config_is_refused_at_once(device: str) -> None:
    if not os.path.exists(device):
        pytest.skip(f"no {device}")
    code, err = cli("run", device)
    one_line(code, err, device, "not a regular file")


def test_a_fifo_as_config_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    code, err = cli("run", str(fifo))
    one_line(code, err, "not a regular file")


def test_a_huge_config_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("workload: cosmoflow\n# " + "x" * (2 << 20) + "\n")
    code, err = cli("run", str(big))
    one_line(code, err, "a config file is at most")


def test_report_caps_a_giant_log_line(tmp_path: Path) -> None:
    from mlhpc.log.parse import MAX_RECORD_CHARS, parse_text

    line = ':::MLLOG {"key": "submission_platform", "value": "' + "x[" * MAX_RECORD_CHARS + '", "time_ms": 1}'
    parsed = parse_text(line + "\n", "giant.txt")
    assert not parsed.events and "over the" in parsed.malformed[0].message


# ---- 8. signals ----------------------------------------------------------------------------------


def test_sigint_closes_the_log_and_exits_130(tmp_path: Path, repo: Path, tiny_data: Path) -> None:
    from test_resume import mini_args, start_run, wait_for
    from test_run_e2e import events

    proc = start_run(mini_args(repo, str(tiny_data), str(tmp_path / "out"), "--set", "train.max_epochs=4",
                               "--set", "train.target=0.0", "--set", "train.check_every_steps=1"),
                     cwd=tmp_path)
    wait_for(tmp_path / "out" / "result_0.txt", '"epoch_num": 1', proc)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert "Aborted!" not in stderr and "Traceback" not in stderr
    stop = [e for e in events(tmp_path / "out" / "result_0.txt") if e["key"] == "run_stop"]
    assert len(stop) == 1 and stop[0]["metadata"]["status"] == "aborted"
    assert stop[0]["metadata"]["signal"] == "SIGINT"


def test_cli_exit_codes_reach_the_shell(tmp_path: Path) -> None:
    proc = subprocess.run(["mlhpc", "run", "/dev/zero"], capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"})
    assert proc.returncode == 2 and "not a regular file" in proc.stderr


def test_stage_prints_a_table_and_json_for_scripts(source: Path, tmp_path: Path, repo: Path) -> None:
    args = ["stage", str(repo / "configs" / "cosmoflow-mini.yaml"), "--set", f"data.path={source}",
            "--set", f"data.staging.dest={tmp_path / 'node'}"]
    table = CliRunner().invoke(main, args)
    assert table.exit_code == 0, table.output
    assert "files held" in table.output and "GB/s" in table.output
    as_json = CliRunner().invoke(main, [*args, "--format", "json"])
    assert as_json.exit_code == 0 and json.loads(as_json.output)["staged_files"] == 3


def test_sigterm_during_synthesis_ends_the_run_at_once(tmp_path: Path, repo: Path) -> None:
    """SIGTERM (a Slurm time limit) while `mlhpc run` synthesises its embedded data: the run
    ends within seconds, exit 143 and one line, its synthesis workers gone, the half-made data
    left in the hidden folder (never under data.path), not after the chunks in flight."""
    import time

    from mlhpc.data import embedded

    data = tmp_path / "data"
    proc = subprocess.Popen(
        [os.sys.executable, "-m", "mlhpc", "run", str(repo / "configs" / "cosmoflow-mini.yaml"),
         "--set", f"data.path={data}", "--set", f"output.dir={tmp_path / 'out'}",
         "--set", "synth.cube_size=16", "--set", "synth.train_samples=64",
         "--set", "synth.eval_samples=600"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        start_new_session=True)
    try:
        line, deadline = "", time.monotonic() + 120
        while "writing" not in line and time.monotonic() < deadline:
            line = proc.stdout.readline()  # the run's progress lines
        assert "writing" in line, line
        time.sleep(2.0)
        proc.send_signal(signal.SIGTERM)  # the run's own pid, as Slurm signals the step
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "SIGTERM before run_start" in stderr.strip().splitlines()[-1] and "Traceback" not in stderr
    assert not data.exists() and embedded.staging_folder(data).is_dir()
    deadline = time.monotonic() + 10  # multiprocessing's resource tracker ends on its own
    while time.monotonic() < deadline:
        left = subprocess.run(["pgrep", "-a", "-g", str(proc.pid)], capture_output=True, text=True)
        if not left.stdout.strip():
            break
        time.sleep(0.2)
    assert left.stdout.strip() == "", f"processes left in the run's group: {left.stdout}"
