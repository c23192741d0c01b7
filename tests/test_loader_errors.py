"""A data error raised in a loader worker reaches the run whole: its subject (file, sample) kept as
fields, so that a staged copy's file is named by its source (`mlhpc.run.assemble.name_source`)."""

from __future__ import annotations

import pytest
import torch

from mlhpc.data.loader import device_loader
from mlhpc.errors import DataError
from mlhpc.run.assemble import sources_named
from mlhpc.workload import WorkloadDataset


class _Broken(WorkloadDataset):
    """Eight samples; sample 5 is a bad record of a file in a staged copy."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int):
        if index == 5:
            raise DataError("record 5 is truncated", path=self.path, sample=5)
        return torch.zeros(2), torch.zeros(1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_workers_data_error_keeps_its_subject(workers, tmp_path):
    path = str(tmp_path / "copy" / "part-0.h5")
    with pytest.raises(DataError) as caught:
        for _ in device_loader(_Broken(path), 2, device="cpu", num_workers=workers):
            pass
    assert (caught.value.path, caught.value.sample) == (path, 5)
    assert str(caught.value) == f"{path} sample 5: record 5 is truncated"


def test_a_resumed_loader_reads_the_workloads_dataset(tmp_path):
    loader = device_loader(_Broken(str(tmp_path / "f")), 2, device="cpu", num_workers=2)
    resumed = loader.resumed(1)
    assert type(resumed.host.dataset.carried_from) is _Broken  # wrapped once, not twice
    with pytest.raises(DataError, match="sample 5"):
        list(resumed)


def test_a_workers_error_in_a_staged_copy_names_the_source(tmp_path):
    class Staged:
        dest, source = tmp_path / "copy", tmp_path / "source"

    (tmp_path / "source").mkdir()
    (tmp_path / "source" / "part-0.h5").write_bytes(b"")  # the source file the copy was made from

    with pytest.raises(DataError) as caught, sources_named(Staged()):
        list(device_loader(_Broken(str(tmp_path / "copy" / "part-0.h5")), 2, device="cpu", num_workers=2))
    assert str(caught.value).startswith(f"{tmp_path / 'source' / 'part-0.h5'} sample 5: record 5 is truncated")
    assert "staged copy" in str(caught.value)
