"""The run's stages in order (`mlhpc.run.command.run`): what can be refused from the config alone is
refused before the embedded data are made; the log owns the barrier around its records."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlhpc import config as cfg
from mlhpc.errors import ConfigError
from mlhpc.log.writer import ComplianceLog
from mlhpc.run.command import run
from mlhpc.runtime import Runtime


def test_a_batch_that_does_not_divide_is_refused_before_any_data_are_made(tmp_path: Path) -> None:
    config = cfg.from_dict({
        "workload": "cosmoflow",
        "train": {"global_batch_size": 3, "gradient_accumulation_steps": 2, "max_epochs": 1},
        "data": {"path": str(tmp_path / "data"), "synthesize_if_missing": True},
        "output": {"dir": str(tmp_path / "out")},
        "synth": {"cube_size": 8, "train_samples": 4, "eval_samples": 2, "workers": 1}})
    with pytest.raises(ConfigError, match="global_batch_size: 3 is not divisible"):
        run(config)
    assert not (tmp_path / "data").exists()


def test_the_log_synchronises_over_its_runtime(tmp_path: Path, monkeypatch) -> None:
    """`ComplianceLog.barrier` waits on the ranks of the runtime the log was made for (through
    `mlhpc.runtime.barrier`, the one place of the collectives)."""
    from mlhpc import runtime

    seen: list[Runtime] = []
    monkeypatch.setattr(runtime, "barrier", seen.append)
    rt = Runtime(instance=2)
    log = ComplianceLog.create(tmp_path, rt)
    log.barrier()
    log.close()
    assert seen == [rt] and log.path is not None and log.path.name == "result_0.txt"
    ComplianceLog(None, None).barrier()  # a log made without a runtime waits for nobody
