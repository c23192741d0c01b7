"""``mlhpc run CONFIG --emulate-accelerator NAME --sweep-accelerators`` (`mlhpc.run.sweep`): K =
1, 2, 4, ... emulated accelerators on this node until AU falls below the workload's minimum;
the stopping rule and the headline on stub AU values, bad input one line and exit 2, and a tiny
CosmoFlow sweep of 1 and 2 ranks started by torchrun (cluster)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.run import sweep

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "configs" / "cosmoflow-mini.yaml"
TINY = ["--set", "synth.cube_size=16", "--set", "synth.train_samples=32", "--set", "synth.eval_samples=8",
        "--set", "synth.samples_per_file=8", "--set", "train.global_batch_size=8",
        "--set", "train.max_epochs=1", "--set", "train.threads=1", "--set", "data.num_workers=0"]
SETTING = {"accelerator": "h100", "time_per_sample_s": 0.005, "source": "hpc_results_v3.0/NVIDIA/...",
           "min_accelerator_utilization": 0.7, "min_source": "test", "local_batch_size": 8}


def stub(au: dict[int, float], asked: list[int]):
    """A `measure` that runs nothing: K's AU from ``au``, samples/s 100 x K."""
    def measure(k: int) -> sweep.Row:
        asked.append(k)
        return sweep.Row(k, au[k], 100.0 * k, au[k] >= 0.7)
    return measure


def test_counts_double_up_to_the_maximum() -> None:
    assert sweep.accelerator_counts(1) == [1]
    assert sweep.accelerator_counts(2) == [1, 2]
    assert sweep.accelerator_counts(8) == [1, 2, 4, 8]
    assert sweep.accelerator_counts(6) == [1, 2, 4, 6]


def test_the_sweep_stops_after_the_first_k_below_the_minimum_and_the_headline_is_the_last_that_met_it() -> None:
    asked: list[int] = []
    seen: list[int] = []
    rows = sweep.sweep_rows([1, 2, 4, 8, 16], stub({1: 0.97, 2: 0.9, 4: 0.55, 8: 0.99, 16: 0.99}, asked),
                            lambda row: seen.append(row.accelerators))
    assert asked == [1, 2, 4] and seen == [1, 2, 4]  # 8 is never run, though its stub would meet it
    result = sweep.Sweep("cosmoflow", SETTING, 16, rows)
    assert result.best is not None and result.best.accelerators == 2 and result.exit_status == 0
    data = result.to_dict()
    assert data["headline"] == {"accelerators": 2, "samples_per_s": 200.0}
    assert [r["accelerators"] for r in data["rows"]] == [1, 2, 4] and data["rows"][2]["meets_minimum"] is False
    assert "below the minimum at 4" in data["stopped"] and data["min_accelerator_utilization"] == 0.7
    lines = sweep.table_lines(result)
    assert lines[0].split() == ["accelerators", "AU", "samples/s", "meets", "70.0%"]
    assert lines[3].split() == ["4", "55.0%", "400.0", "no"]
    assert lines[-1].startswith("most emulated h100 accelerators per node at AU >= 70.0%: 2 (200.0 samples/s")


def test_every_k_meeting_the_minimum_runs_to_the_maximum_and_one_below_it_exits_1() -> None:
    asked: list[int] = []
    rows = sweep.sweep_rows([1, 2, 4], stub({1: 0.9, 2: 0.9, 4: 0.8}, asked))
    full = sweep.Sweep("cosmoflow", SETTING, 4, rows)
    assert asked == [1, 2, 4] and full.best.accelerators == 4 and "the maximum, 4" in full.stopped()
    asked.clear()
    none = sweep.Sweep("cosmoflow", SETTING, 4, sweep.sweep_rows([1, 2, 4], stub({1: 0.3, 2: 1.0, 4: 1.0}, asked)))
    assert asked == [1] and none.best is None and none.exit_status == 1
    assert none.to_dict()["headline"] == {"accelerators": 0, "samples_per_s": None}
    assert sweep.table_lines(none)[-1].startswith("not even one emulated h100 accelerator kept AU >= 70.0%")
    failed = sweep.Sweep("cosmoflow", SETTING, 4, [sweep.Row(1, None, None, False, 2, "out/accelerators_1")])
    assert failed.exit_status == 1 and "failed (exit status 2)" in failed.stopped()
    assert "run failed (exit status 2; see out/accelerators_1/output.txt)" in sweep.table_lines(failed)[1]


def test_each_k_is_a_torchrun_of_k_ranks_each_keeping_the_config_s_local_batch(tmp_path: Path) -> None:
    plan = sweep.Plan(MINI, ("train.max_epochs=1", 'train.emulate_accelerator="h100"'), 8, tmp_path)
    command = plan.command(4)
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4"]
    assert command[5:9] == ["-m", "mlhpc", "run", str(MINI)]
    sets = [command[i + 1] for i, a in enumerate(command) if a == "--set"]
    assert sets == ["train.max_epochs=1", 'train.emulate_accelerator="h100"', "train.global_batch_size=32",
                    f"output.dir={json.dumps(str(tmp_path / 'accelerators_4'))}"]


def _one_line_exit_2(args: list[str], words: str, env: dict[str, str] | None = None) -> None:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error:") and words in lines[0], lines


@pytest.mark.parametrize("extra,words,env", [
    (["--sweep-accelerators"], "--sweep-accelerators: give --emulate-accelerator", None),
    (["--emulate-accelerator", "h100", "--max-accelerators", "2"], "--max-accelerators: give it with "
     "--sweep-accelerators", None),
    (["--emulate-accelerator", "h100", "--sweep-accelerators", "--max-accelerators", "0"],
     "--max-accelerators: 0 is not at least 1", None),
    (["--emulate-accelerator", "h100", "--sweep-accelerators"], "not under a launcher (world size 2)",
     {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}),
    (["--emulate-accelerator", "x100", "--sweep-accelerators"], "unknown accelerator 'x100'", None),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, extra: list[str], words: str,
                                          env: dict[str, str] | None) -> None:
    out, data = tmp_path / "out", tmp_path / "data"
    _one_line_exit_2(["run", str(MINI), "--set", f"output.dir={out}", "--set", f"data.path={data}", *extra],
                     words, env)
    assert not out.exists() and not data.exists()  # refused before anything was made


def test_a_folder_holding_a_sweep_and_resume_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "sweep.json").write_text("{}\n")
    _one_line_exit_2(["run", str(MINI), "--set", f"output.dir={out}", "--set", f"data.path={tmp_path / 'data'}",
                      "--emulate-accelerator", "h100", "--sweep-accelerators"], "already holds a sweep")
    assert (out / "sweep.json").read_text() == "{}\n" and not (out / "accelerators_1").exists()
    _one_line_exit_2(["run", "--resume", str(out), "--emulate-accelerator", "h100", "--sweep-accelerators"],
                     "give a CONFIG file (not --resume)")


@pytest.mark.cluster  # starts torchrun with 1, then 2 ranks
def test_a_tiny_cosmoflow_sweep_of_two_accelerators(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "run", str(MINI), *TINY,
                           "--set", f"data.path={tmp_path / 'data'}", "--set", f"output.dir={out}",
                           "--emulate-accelerator", "40ms", "--sweep-accelerators", "--max-accelerators", "2"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "sweep.json").read_text())
    assert [r["accelerators"] for r in data["rows"]] == [1, 2]
    for row in data["rows"]:
        assert 0 < row["accelerator_utilization"] <= 1 and row["samples_per_s"] > 0 and row["exit_status"] == 0
        assert (Path(row["folder"]) / "result_0.txt").is_file()
    assert data["rows"][0]["meets_minimum"] is True and data["headline"]["accelerators"] >= 1
    assert data["local_batch_size"] == 8 and data["max_accelerators"] == 2
    log = (out / "accelerators_2" / "result_0.txt").read_text()
    assert '"key": "global_batch_size", "value": 16' in log  # each of the 2 ranks kept its batch of 8
    assert "most emulated accelerators (40ms per sample) per node at AU >= 70.0%: " in proc.stdout
