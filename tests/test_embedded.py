"""Embedded data are complete (marked last, counts checked on use) or refused, never deleted; an
interrupted ``mlhpc data synth`` is never trained or evaluated on (issue 15, item 3)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlhpc import config as cfg
from mlhpc.data import embedded, manifest, ready
from mlhpc.data.files import is_part_file, part_path
from mlhpc.errors import ConfigError, DataError
from mlhpc.workload import get

SYNTH = {"cube_size": 8, "train_samples": 12, "eval_samples": 6, "workers": 1}
ONE_RANK = SimpleNamespace(is_main=True, distributed=False)


def config_for(path: Path, synthesize: bool = True, seed: int = 0, train_seed: int = 0, **synth):
    return cfg.from_dict({"workload": "cosmoflow",
                          "train": {"global_batch_size": 4, "max_epochs": 1, "seed": train_seed},
                          "data": {"path": str(path), "synthesize_if_missing": synthesize,
                                   "synth_seed": seed},
                          "synth": {**SYNTH, **synth}})


def files(path: Path, split: str) -> list[str]:
    return sorted(p.name for p in (path / split).iterdir())


def all_names(root: Path) -> list[str]:
    return [p.name for p in root.rglob("*")]


def test_synthesised_folder_is_marked_and_checked(tmp_path):
    path = tmp_path / "data"
    config = config_for(path)
    cosmo = get("cosmoflow")
    assert ready.ensure_data(config, cosmo, ONE_RANK) > 0
    marker = manifest.load(path)  # the one completion record, as of every folder mlhpc writes
    assert marker["kind"] == "synth" and marker["complete"] is True
    assert embedded.recorded_inventory(marker)["train"]["files"] == 12
    assert embedded.recorded_inventory(marker)["validation"]["files"] == 6
    assert marker["seed"] == 0 and marker["workload"] == "cosmoflow"
    assert sorted(p.name for p in path.iterdir() if p.name.startswith(".")) == [manifest.MANIFEST_NAME]
    assert embedded.describe(path) == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]  # no temporaries, no lock file
    assert ready.ensure_data(config, cosmo, ONE_RANK) == 0.0  # nothing to do

    # the marker's settings must be the config's: other seed -> refused, named
    with pytest.raises(DataError, match=r"data were synthesised with seed=0, the config asks for 3"):
        ready.ensure_data(config_for(path, seed=3), cosmo, ONE_RANK)
    # ... while another training seed uses the same data (runs of one submission differ in
    # train.seed, not in their dataset)
    assert ready.ensure_data(config_for(path, train_seed=601530164), cosmo, ONE_RANK) == 0.0
    with pytest.raises(DataError, match=r"synth.eval_samples=6, the config asks for 8"):
        ready.ensure_data(config_for(path, eval_samples=8), cosmo, ONE_RANK)
    # synth.workers changes speed, not bytes
    assert ready.ensure_data(config_for(path, workers=2), cosmo, ONE_RANK) == 0.0


def test_changed_marked_folder_is_refused_and_never_deleted(tmp_path):
    """Synthesised data that no longer match their manifest (a lost file, a truncated one, a
    file the user left there) are refused with one line naming the first difference, with
    synthesis on or off, and every byte left as it was."""
    path = tmp_path / "data"
    cosmo = get("cosmoflow")
    ready.ensure_data(config_for(path), cosmo, ONE_RANK)
    before = {n: (path / "validation" / n).read_bytes() for n in files(path, "validation")}
    (path / "validation" / sorted(before)[-1]).unlink()  # a lost file
    with open(path / "validation" / sorted(before)[0], "r+b") as f:  # and a truncated one
        f.truncate(100)
    assert embedded.describe(path) == "changed"
    after = {n: (path / "validation" / n).read_bytes() for n in files(path, "validation")}
    for synthesize in (False, True):
        with pytest.raises(DataError, match="files differ from the manifest of the synthesis.*validation "
                                            "holds 5 files.*mlhpc never deletes them"):
            ready.ensure_data(config_for(path, synthesize=synthesize), cosmo, ONE_RANK)
        assert {n: (path / "validation" / n).read_bytes() for n in files(path, "validation")} == after
    fresh = tmp_path / "fresh"
    ready.ensure_data(config_for(fresh), cosmo, ONE_RANK)
    (fresh / "notes.txt").write_text("mine")
    with pytest.raises(DataError, match="notes.txt was not written by the synthesis"):
        embedded.synthesize(fresh, cosmo, config_for(fresh).synth, 0)
    assert (fresh / "notes.txt").read_text() == "mine" and embedded.describe(fresh) == "changed"


def test_unmarked_data_are_used_as_they_are(tmp_path):
    """A real dataset (or a user's own files) has no marker: never rewritten, even when the synth
    section describes something else."""
    path = tmp_path / "mine"
    for split in ("train", "validation"):
        (path / split).mkdir(parents=True)
        (path / split / "univ_000000.h5").write_bytes(b"user data")
    assert embedded.describe(path) == "unmarked"
    assert ready.ensure_data(config_for(path), get("cosmoflow"), ONE_RANK) == 0.0
    assert sorted(all_names(path)) == sorted(["train", "validation", "univ_000000.h5", "univ_000000.h5"])
    assert (path / "train" / "univ_000000.h5").read_bytes() == b"user data"


def test_missing_data_without_synthesis_is_refused(tmp_path):
    with pytest.raises(DataError, match="dataset folder not found"):
        ready.ensure_data(config_for(tmp_path / "none", synthesize=False), get("cosmoflow"), ONE_RANK)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="empty"):
        ready.ensure_data(config_for(tmp_path / "empty", synthesize=False), get("cosmoflow"), ONE_RANK)


def test_a_folder_a_writer_left_in_place_is_refused_not_adopted(tmp_path):
    """A folder without a synthesis manifest that holds data and temporaries of an unfinished
    writer is not mlhpc's to complete (its data could be anyone's): refused with one line,
    synthesis on or off, every file kept."""
    path = tmp_path / "data"
    cosmo = get("cosmoflow")
    cosmo.synthesize(path, config_for(path).synth, 0)  # the workload's writer alone: no marker
    names = files(path, "validation")
    for name in names[3:]:
        (path / "validation" / name).unlink()
    part_path(path / "validation" / names[3]).write_bytes(b"half")
    assert embedded.describe(path) == "interrupted"
    kept = sorted(all_names(path))
    with pytest.raises(DataError, match="interrupted synthesis"):
        ready.ensure_data(config_for(path, synthesize=False), cosmo, ONE_RANK)
    with pytest.raises(DataError, match="holds files that are not a synthesis of mlhpc; it is never rewritten"):
        ready.ensure_data(config_for(path), cosmo, ONE_RANK)
    assert sorted(all_names(path)) == kept


def test_bad_seed_is_refused_before_anything_is_written(tmp_path):
    for seed in (-1, 2**63, True, 1.5):
        with pytest.raises(ConfigError, match="seed"):
            embedded.synthesize(tmp_path / "d", get("cosmoflow"), config_for(tmp_path).synth, seed)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("seed", ["-1", "9223372036854775808", "99999999999999999999999"])
def test_data_synth_cli_bad_seed(tmp_path, mlhpc_cmd, seed):
    proc = subprocess.run([*mlhpc_cmd, "data", "synth", "cosmoflow", "--out", str(tmp_path / "d"),
                           "--seed", seed, "--set", "synth.cube_size=8"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"mlhpc: error: seed {seed}: must be an integer within 0 .. {2**63 - 1}"]
    assert list(tmp_path.iterdir()) == []  # nothing left behind


def test_data_synth_takes_the_configs_seed_as_a_run_would(tmp_path):
    """``mlhpc data synth --config C`` makes the data ``mlhpc run C`` would make: the seed is the
    config's ``data.synth_seed`` unless --seed says otherwise, so the run takes the folder as it
    is (a different seed would be refused as data of other settings)."""
    from click.testing import CliRunner

    from mlhpc.cli import main

    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({"workload": "cosmoflow", "train": {"global_batch_size": 4, "max_epochs": 1},
                                "data": {"synth_seed": 7}, "synth": SYNTH}))
    result = CliRunner().invoke(main, ["data", "synth", "cosmoflow", "--out", str(tmp_path / "d"),
                                       "--config", str(path)])
    assert result.exit_code == 0, result.output
    assert ready.ensure_data(config_for(tmp_path / "d", seed=7), get("cosmoflow"), ONE_RANK) == 0.0
    with pytest.raises(DataError):
        ready.ensure_data(config_for(tmp_path / "d", seed=0), get("cosmoflow"), ONE_RANK)


def _synth_cmd(mlhpc_cmd, out: Path, **synth) -> list[str]:
    sets = [a for k, v in {**SYNTH, **synth}.items() for a in ("--set", f"synth.{k}={v}")]
    return [*mlhpc_cmd, "data", "synth", "cosmoflow", "--out", str(out), *sets]


def test_killed_data_synth_is_never_used(tmp_path, mlhpc_cmd):
    """SIGKILL a real ``mlhpc data synth`` once its first validation file is written: the dataset
    folder does not exist (the work lies in a hidden sibling), a run refuses it when synthesis
    is off, and otherwise completes it -- never evaluating on a partial validation set; no
    partial file survives to be staged."""
    out = tmp_path / "data"
    hidden = embedded.staging_folder(out)
    synth = {"cube_size": 16, "train_samples": 8, "eval_samples": 150}
    proc = subprocess.Popen(_synth_cmd(mlhpc_cmd, out, **synth), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, cwd=tmp_path, start_new_session=True)
    deadline = time.monotonic() + 120
    try:
        while not (hidden / "validation").is_dir() or not any((hidden / "validation").iterdir()):
            assert proc.poll() is None, "synthesis ended before it could be interrupted"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    written = len(list((hidden / "validation").iterdir()))
    assert 0 < written < 150
    assert not out.exists()  # nothing half-written under the name a run reads
    assert embedded.describe(out) == "interrupted"

    cosmo = get("cosmoflow")
    with pytest.raises(DataError, match="interrupted synthesis"):
        ready.ensure_data(config_for(out, synthesize=False, **synth), cosmo, ONE_RANK)
    assert ready.ensure_data(config_for(out, **synth), cosmo, ONE_RANK) > 0
    assert len(files(out, "validation")) == 150
    assert embedded.describe(out) == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data"]
    assert not [n for n in all_names(out) if n.endswith(".part") or ".tmp-" in n]

    # the same data as one uninterrupted synthesis, byte for byte
    again = tmp_path / "again"
    done = subprocess.run(_synth_cmd(mlhpc_cmd, again, **synth), capture_output=True, text=True,
                          timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for split in ("train", "validation"):
        assert files(again, split) == files(out, split)
        for name in files(out, split)[::50]:
            assert (again / split / name).read_bytes() == (out / split / name).read_bytes()


def test_data_synth_onto_a_file_is_one_line(tmp_path, mlhpc_cmd):
    target = tmp_path / "f"
    target.write_text("not a folder")
    proc = subprocess.run(_synth_cmd(mlhpc_cmd, target), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"mlhpc: error: {target}: data.path is a file, not a dataset folder"]
    assert target.read_text() == "not a folder"


def test_a_folder_of_raw_data_is_named_and_never_synthesised_over(tmp_path):
    """A user's folder without train/ and validation/ (here: one raw file) is not mlhpc's to
    rewrite: it is refused with one line that names the folder and `mlhpc data prepare`."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "universe_000.hdf5").write_bytes(b"not ours")
    with pytest.raises(DataError, match=r"raw/train: dataset folder is missing or empty .*"
                                        r"mlhpc data prepare cosmoflow"):
        ready.ensure_data(config_for(raw), get("cosmoflow"), ONE_RANK)
    assert sorted(p.name for p in raw.iterdir()) == ["universe_000.hdf5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["raw"]


def test_a_synthesis_folder_another_user_could_write_is_refused(tmp_path):
    """The hidden folder a synthesis resumes from is used only when it is the user's own and
    writable by nobody else: a folder of that name made beforehand by someone who can write
    into it (here: mode 0777) could hold a planted record of intent or planted samples. A new
    synthesis's folder is private while written and gets the usual mode once complete."""
    out = tmp_path / "data"
    synth = {"cube_size": 8, "train_samples": 2, "eval_samples": 2}
    hidden = embedded.staging_folder(out)
    hidden.mkdir()
    hidden.chmod(0o777)
    with pytest.raises(DataError, match=r"is not mlhpc's \(not a private folder of yours\)"):
        ready.ensure_data(config_for(out, **synth), get("cosmoflow"), ONE_RANK)
    assert not out.exists() and oct(hidden.stat().st_mode & 0o777) == "0o777"
    hidden.rmdir()
    assert ready.ensure_data(config_for(out, **synth), get("cosmoflow"), ONE_RANK) > 0
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask


def test_a_split_folder_a_killed_writer_left_is_removed_and_the_data_completed(tmp_path):
    """A workload's writer killed while it writes leaves a part-named file or folder in
    the hidden folder mlhpc claimed for the synthesis (SIGKILL runs no cleanup). The data count
    as interrupted, the next synthesis removes the leftover (mlhpc's own, inside its claimed
    folder), and it never ends up in the dataset."""
    from mlhpc.data.claims import make_claimed_dir

    path = tmp_path / "data"
    cosmo = get("cosmoflow")
    hidden = make_claimed_dir(embedded.staging_folder(path), embedded.SYNTH_KIND)
    (hidden / embedded.INTENT).write_text(json.dumps(embedded._settings("cosmoflow", config_for(path).synth, 0)))
    left = part_path(hidden / "validation")
    left.mkdir()
    (left / "univ_000000.h5").write_bytes(b"half")
    assert embedded.describe(path) == "interrupted"
    assert ready.ensure_data(config_for(path), cosmo, ONE_RANK) > 0
    assert not [n for n in all_names(path) if is_part_file(n)]
    assert embedded.describe(path) == "complete" and not hidden.exists()
