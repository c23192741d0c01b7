"""One conversion journal: `mlhpc data convert | prepare` and staging that converts journal a
source with its outputs in one form, read it back through one function and reuse it by one
rule (the same source file, its outputs intact) -- `mlhpc.data.manifest`."""

from __future__ import annotations

import json
import os
from pathlib import Path

import cosmoflow_writers as w
import pytest
from mlhpc_workloads.cosmoflow.convert import CosmoFlowDataTools

from mlhpc.data import convert as data_convert
from mlhpc.data import manifest
from mlhpc.data.stage import StageOptions, stage
from mlhpc.errors import DataError
from mlhpc.runtime import Runtime
from mlhpc.workload import get

TRAIN, VALID = w.samples(4, seed=5), w.samples(2, seed=6)
KEYS = {"path", "bytes", "source_mtime_ns", "source_ctime_ns", "source_ino", "source", "kind", "to",
        "convert", "outputs"}


def _journal(folder: Path) -> list[dict]:
    return list(manifest.journal_entries(folder))


def _interrupted_convert(src: Path, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A convert that dies on its third source, leaving two journalled."""
    real = CosmoFlowDataTools.convert_file
    calls: list[str] = []

    def flaky(self, path, fmt, out_dir, to):
        calls.append(path.name)
        if len(calls) == 3:
            raise DataError(f"{path}: simulated failure")
        return real(self, path, fmt, out_dir, to)

    monkeypatch.setattr(CosmoFlowDataTools, "convert_file", flaky)
    with pytest.raises(DataError, match="simulated failure"):
        data_convert.convert(get("cosmoflow"), src, out, "npy")
    monkeypatch.setattr(CosmoFlowDataTools, "convert_file", real)


def test_data_convert_and_staging_write_one_journal_form(tmp_path, monkeypatch):
    src = w.write_dataset(tmp_path / "tf", "tfrecord", TRAIN, VALID)
    _interrupted_convert(src, tmp_path / "out", monkeypatch)
    converted = _journal(tmp_path / "out")
    assert len(converted) == 2 and all(set(e) == KEYS and e["kind"] == "convert" for e in converted)

    real = CosmoFlowDataTools.convert_file

    def dies(self, path, fmt, out_dir, to):
        if "validation" in str(path):
            raise DataError(f"{path}: simulated failure")
        return real(self, path, fmt, out_dir, to)

    monkeypatch.setattr(CosmoFlowDataTools, "convert_file", dies)
    with pytest.raises(DataError, match="simulated failure"):
        stage(src, tmp_path / "staged", Runtime(), StageOptions(to="npy", tools=get("cosmoflow").data_tools))
    staged = _journal(tmp_path / "staged")
    assert staged and all(set(e) == KEYS and e["kind"] == "stage" for e in staged)
    # one reader: each journal is read back by the same function, for its own kind only
    assert set(manifest.read_convert_state(tmp_path / "out", src, "npy", "convert")) == \
        {e["path"] for e in converted}
    assert manifest.read_convert_state(tmp_path / "out", src, "npy", "stage") == {}


def test_a_source_rewritten_since_is_converted_again(tmp_path, monkeypatch):
    """The one resume rule: a journalled source whose file changed since (same size, new
    inode) is converted again by `mlhpc data convert`, as staging always did."""
    src = w.write_dataset(tmp_path / "tf", "tfrecord", TRAIN, VALID)
    _interrupted_convert(src, tmp_path / "out", monkeypatch)
    done = sorted(e["path"] for e in _journal(tmp_path / "out"))
    rewritten = src / done[0]
    data = rewritten.read_bytes()
    rewritten.unlink()
    rewritten.write_bytes(data)  # a new file with the same bytes: another inode and ctime
    os.utime(rewritten, ns=(0, 0))
    result = data_convert.convert(get("cosmoflow"), src, tmp_path / "out", "npy")
    assert result.skipped_files == 1 and result.source_files == 6
    doc = json.loads((tmp_path / "out" / manifest.MANIFEST_NAME).read_text())
    assert {s["path"] for s in doc["sources"]} == {f"{p.parent.name}/{p.name}" for p in src.rglob("*.tfrecord")}
    again = data_convert.convert(get("cosmoflow"), src, tmp_path / "out", "npy")
    assert again.skipped_files == 6  # the manifest's sources: nothing to convert
