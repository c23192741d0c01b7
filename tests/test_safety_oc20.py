"""OC20 data that lie about their sizes or hold what the model cannot take, and OC20 laid out as
its reference lays it out, each tried through the command line: a tensor declaring a huge shape,
a zero or negative stride or more elements than its storage holds, a storage declaring more bytes
than its record carries, a float8 tensor, a zero or needle-thin cell are one line naming the file
and key (exit 2) in ``data check`` (quick and full) and in the run's loader, before anything the
size of the declaration is allocated; a thin cell in ``data prepare`` is refused by a stated bound
on its periodic images; ``mlhpc run`` takes ``train/`` + ``val_id/``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner

from mlhpc.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from test_oc20_data import _record  # noqa: E402
from test_oc20_run import TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "opencatalyst-mini.yaml"


def cli(*args: str):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def one_line_error(result, *names: str) -> str:
    """The command ended with exit 2 and one ``mlhpc: error:`` line naming each of ``names``."""
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("mlhpc: error: ")]
    assert len(errors) == 1, result.output
    for name in names:
        assert name in errors[0], (name, errors[0])
    return errors[0]


def _dataset(root: Path, splits=("train", "val_id"), records: int = 16) -> Path:
    from mlhpc_workloads.opencatalyst import lmdb_io

    for k, split in enumerate(splits):
        (root / split).mkdir(parents=True)
        lmdb_io.write_lmdb(root / split / "data.0000.lmdb",
                           [_record(6, 100 * k + s) for s in range(records)])
    return root


# ---- 9a. the reference's layout -------------------------------------------------------------------


def test_run_takes_the_reference_layout_train_and_val_id(tmp_path):
    """README and docs/data.md put OC20 under ``data.path`` as ``train/`` and ``val_id/`` (the
    OCP download's names); the run finds the validation split through the workload's data tools
    and trains, where it used to ask for a ``validation/`` folder."""
    data = _dataset(tmp_path / "data")
    out = tmp_path / "out"
    result = cli("run", str(MINI), *TINY, "--set", f"data.path={data}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={out}")
    assert result.exit_code == 0, result.output
    log = (out / "result_0.txt").read_text()
    assert '"key": "run_stop"' in log and '"status": "success"' in log
    assert not (data / "validation").exists()


def test_run_without_a_validation_folder_names_what_is_missing(tmp_path):
    data = _dataset(tmp_path / "data", splits=("train",))
    result = cli("run", str(MINI), *TINY, "--set", f"data.path={data}",
                 "--set", "data.synthesize_if_missing=false", "--set", f"output.dir={tmp_path / 'out'}")
    line = one_line_error(result, str(data))
    assert "no folder whose name holds 'val'" in line
