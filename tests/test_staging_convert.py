"""Staging that converts on the way (``data.staging.to``, mlhpc/data/stage/): GZIP TFRecords staged
as npy read to the source's tensors, a second stage converts nothing, outputs of a source that left
the plan are pruned, a node's shard converts only its files, and `mlhpc run` trains from the
converted stage. Sources come from the independent writers in tests/cosmoflow_writers.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import cosmoflow_writers as w
import numpy as np
import pytest
import torch
from mlhpc_workloads.cosmoflow.data import build_datasets

from mlhpc.data import checksums, formats
from mlhpc.data import stage as staging
from mlhpc.config import DataConfig, StagingConfig
from mlhpc.errors import ConfigError, StagingError
from mlhpc.runtime import Runtime
from mlhpc.workload import get

TRAIN, VALID = w.samples(6, seed=5), w.samples(3, seed=6)


@pytest.fixture(scope="module")
def tools():
    return formats.tools_of(get("cosmoflow"))


@pytest.fixture()
def src(tmp_path) -> Path:
    return w.write_dataset(tmp_path / "tf", "tfrecord", TRAIN, VALID)


def _tensors(root: Path) -> tuple[torch.Tensor, ...]:
    train, valid = build_datasets(SimpleNamespace(data=DataConfig()), None, root)
    return train.format, (*train.__getitems__(range(len(train))), *valid.__getitems__(range(len(valid))))


def test_staging_to_npy_reads_the_source_tensors_and_resumes(src, tmp_path, tools):
    dest = tmp_path / "node"
    first = staging.stage(src, dest, Runtime(), staging.StageOptions(workers=2, to="npy", tools=tools))
    assert first.to == "npy" and (first.copied_files, first.skipped_files, first.pruned_files) == (9, 0, 0)
    assert not list(dest.rglob("*.tfrecord"))
    assert len(list((dest / "train").glob("*_data.npy"))) == 6
    fmt, got = _tensors(dest)
    src_fmt, want = _tensors(src)
    assert (fmt, src_fmt) == ("npy", "tfrecord")
    assert all(torch.equal(a, b) for a, b in zip(got, want))  # bit-exact counts and labels
    doc = json.loads((dest / staging.MANIFEST_NAME).read_text())
    assert (doc["to"], doc["from"]) == ("npy", "tfrecord")
    on_disk = {p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()
               and not p.name.startswith(".mlhpc")}
    assert {e["path"] for e in doc["files"]} == on_disk  # lists included, nothing else
    for entry in doc["files"]:
        assert entry["xxh3_128"] == checksums.checksum(dest / entry["path"])
        if entry["path"].endswith("_data.npy"):
            assert entry["from"].endswith(".tfrecord") and (src / entry["from"]).is_file()
    assert first.staged_files == len(doc["files"]) and first.staged_bytes == doc["total_bytes"]

    again = staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools))
    assert (again.copied_files, again.skipped_files, again.pruned_files) == (0, 9, 0)
    assert json.loads((dest / staging.MANIFEST_NAME).read_text())["files"] == doc["files"]


def test_changed_and_removed_sources_are_converted_again_and_pruned(src, tmp_path, tools):
    dest = tmp_path / "node"
    staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools))
    names = sorted(p.name for p in (src / "train").glob("*.tfrecord"))
    gone, changed = src / "train" / names[0], src / "train" / names[1]
    gone_stem, changed_stem = gone.name[:-len(".tfrecord")], changed.name[:-len(".tfrecord")]
    gone.unlink()
    w.write_tfrecord(changed, [VALID[0]])  # new contents under the same name
    third = staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools))
    assert (third.copied_files, third.skipped_files, third.pruned_files) == (1, 7, 2)  # data + label
    assert not (dest / "train" / f"{gone_stem}_data.npy").exists()
    listed = (dest / "train" / "files_data.lst").read_text().split()
    assert len(listed) == 5 and f"{gone_stem}_data.npy" not in listed
    x = np.load(dest / "train" / f"{changed_stem}_data.npy")
    assert np.array_equal(x, VALID[0][0])
    # a damaged output is noticed (verify) and its source converted again
    damaged = dest / "train" / f"{changed_stem}_data.npy"
    raw = bytearray(damaged.read_bytes())
    raw[-1] ^= 1
    damaged.write_bytes(bytes(raw))
    fourth = staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools))
    assert (fourth.copied_files, fourth.skipped_files) == (1, 7)
    assert np.array_equal(np.load(damaged), VALID[0][0])


def test_copy_and_conversion_records_are_not_mistaken_for_each_other(src, tmp_path, tools):
    dest = tmp_path / "node"
    staging.stage(src, dest, Runtime())  # a plain copy first
    converted = staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools))
    assert converted.skipped_files == 0 and converted.copied_files == 9
    assert not list(dest.rglob("*.tfrecord"))  # the copies were pruned
    copied = staging.stage(src, dest, Runtime())
    assert copied.skipped_files == 0 and copied.copied_files == 9
    assert not list(dest.rglob("*.npy")) and _tensors(dest)[0] == "tfrecord"


def test_node_shards_convert_only_their_files(tmp_path, tools):
    src = w.write_dataset(tmp_path / "tf", "tfrecord", w.samples(8, seed=7), w.samples(4, seed=8))
    stems = set()
    for node in (0, 1):
        shard = staging.Shard(node, 2, seed=3)
        dest = tmp_path / f"node{node}"
        result = staging.stage(src, dest, Runtime(), staging.StageOptions(to="npy", tools=tools, shard=shard))
        assert result.shard == shard.to_dict() and result.copied_files == 6
        mine = {p.name for p in (dest / "train").glob("*_data.npy")}
        assert len(mine) == 4 and not stems & mine
        stems |= mine
        assert (dest / "train" / "files_data.lst").read_text().split() == sorted(mine)
        assert len(build_datasets(SimpleNamespace(data=DataConfig()), None, dest)[0]) == 4
    assert len(stems) == 8


def test_converted_copy_used_when_the_source_is_gone(src, tmp_path, tools):
    dest = tmp_path / "node"
    config = SimpleNamespace(workload="cosmoflow", train=SimpleNamespace(seed=0, instances=1),
                             data=SimpleNamespace(path=src, format="auto",
                                                  staging=StagingConfig(dest=dest, to="npy")))
    assert not staging.staged_copy_present(config, Runtime())
    staging.stage_dataset(config, Runtime())
    assert staging.staged_copy_present(config, Runtime())
    moved = shutil.move(src, tmp_path / "elsewhere")
    offline = staging.stage_dataset(config, Runtime())
    assert offline.offline and offline.copied_files == 0 and offline.skipped_files == 9
    shutil.move(moved, src)
    os.unlink(next((dest / "train").glob("*_label.npy")))
    assert not staging.staged_copy_present(config, Runtime())


def test_bad_forms_are_one_line_errors(src, tmp_path, tools):
    with pytest.raises(StagingError, match=r"data.staging.to: 'zarr': expected none or one of"):
        staging.stage(src, tmp_path / "d", Runtime(), staging.StageOptions(to="zarr", tools=tools))
    config = SimpleNamespace(workload="cosmoflow", train=SimpleNamespace(seed=0, instances=1),
                             data=SimpleNamespace(path=src, format="tfrecord",
                                                  staging=StagingConfig(dest=tmp_path / "d", to="npy")))
    with pytest.raises(ConfigError, match=r"data.format: 'tfrecord' with data.staging.to: 'npy'"):
        staging.stage_dataset(config, Runtime())
    with pytest.raises(Exception, match="pattern"):
        StagingConfig(to="N P Y")


def test_run_trains_from_the_converted_stage(src, tmp_path, repo):
    from click.testing import CliRunner
    from conftest import compliance_check

    from mlhpc.cli import main

    def learnable(items):  # as in test_data_commands: the small model reaches the target
        return [((x % 2).astype(np.int16), (y * 0.02).astype(np.float32)) for x, y in items]

    src = w.write_dataset(tmp_path / "tf16", "tfrecord", learnable(w.samples(8, cube=16, seed=1)),
                          learnable(w.samples(4, cube=16, seed=2)))
    out, dest = tmp_path / "out", tmp_path / "local"
    small = ["train.max_epochs=2", "train.global_batch_size=4", "model.input_size=16",
             "model.n_conv_layers=2", "model.conv_channels=4", "model.dropout=0.0",
             "data.num_workers=0", "train.amp=false", f"data.path={src}", f"output.dir={out}",
             f"data.staging.dest={dest}", "data.staging.to=npy",
             "data.staging.keep=true"]  # the copy is looked at after the run
    args = ["run", str(repo / "configs" / "cosmoflow.yaml")]
    for item in small:
        args += ["--set", item]
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 0, run.output
    assert len(list((dest / "train").glob("*_data.npy"))) == 8 and not list(dest.rglob("*.tfrecord"))
    lines = [json.loads(line.split(" ", 1)[1]) for line in (out / "result_0.txt").read_text().splitlines()
             if line.startswith(":::MLLOG")]
    values = {e["key"]: e["value"] for e in lines}
    assert (values["train_samples"], values["eval_samples"]) == (8, 4)
    assert any(e["key"] == "eval_error" for e in lines)
    checked = compliance_check(out / "result_0.txt")
    assert "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
