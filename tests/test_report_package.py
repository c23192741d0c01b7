"""mlhpc report --package: run folders -> an MLPerf HPC submission that MLCommons'
package_checker accepts (checked on a scratch copy)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from mlhpc.errors import ConfigError
from mlhpc.report.cli import report_command
from mlhpc.report.package import SYSTEM_FIELDS, check_package, package_runs

MINI_RUNS = Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs"
PUBLISHED = "hpc_results_v3.0/HPE+LBNL/results/perlmutter_128x4/strong/cosmoflow"


def _run_folders(tmp_path: Path, results: Path) -> list[Path]:
    """Ten published, compliant closed-division CosmoFlow logs dressed as two mlhpc run folders."""
    source = results / PUBLISHED
    logs = sorted(source.glob("result_*.txt"))
    assert len(logs) == 10
    env = json.loads((MINI_RUNS / "env_0.json").read_text())
    env.update(gpu_names=["NVIDIA A100-SXM4-40GB"] * 4, gpu_count=4)
    folders = []
    for half in (0, 1):
        folder = tmp_path / f"run{half}"
        folder.mkdir()
        for i, log in enumerate(logs[half * 5:(half + 1) * 5]):
            shutil.copyfile(log, folder / f"result_{i}.txt")
            (folder / f"env_{i}.json").write_text(json.dumps(env))
            (folder / f"config_{i}.yaml").write_text(yaml.safe_dump(
                {"workload": "cosmoflow", "submission": {"org": "HPE+LBNL", "platform": "perlmutter",
                                                         "division": "closed", "status": "onprem"},
                 "train": {"global_batch_size": 512}}))
        folders.append(folder)
    return folders


def test_package_is_accepted_by_the_official_package_checker(tmp_path, mlperf_results):
    folders = _run_folders(tmp_path, mlperf_results)
    reading = ':::MLLOG {"key": "power_reading", "value": "250.0"}\n'
    for folder in folders:  # every run measured: power travels beside each packaged log
        for i in range(5):
            node_file = folder / "power" / f"result_{i}" / "node_0.txt"
            node_file.parent.mkdir(parents=True)
            node_file.write_text(reading if (folder, i) != (folders[1], 2) else reading * 2)
    (folders[0] / "power" / "result_0" / "notes.txt").write_text("not a power log")
    out = tmp_path / "submission"
    result = package_runs(folders, out, org="TestOrg", system="perlmutter_128x4")
    bench = out / "TestOrg" / "results" / "perlmutter_128x4" / "strong" / "cosmoflow"
    assert sorted(p.name for p in bench.iterdir() if p.is_file()) == sorted(f"result_{i}.txt" for i in range(10))
    assert sorted(p.name for p in (bench / "power").iterdir()) == sorted(f"result_{i}" for i in range(10))
    assert [p.name for p in (bench / "power" / "result_0").iterdir()] == ["node_0.txt"]
    # result_2 of the second folder is the package's result_7
    assert (bench / "power" / "result_7" / "node_0.txt").read_text() == reading * 2
    desc = json.loads((out / "TestOrg" / "systems" / "perlmutter_128x4.json").read_text())
    assert set(SYSTEM_FIELDS) <= set(desc)
    assert desc["division"] == "closed" and desc["number_of_nodes"] == "128"
    assert desc["accelerators_per_node"] == "4" and desc["accelerator_model_name"].startswith("NVIDIA A100")
    assert desc["framework"].startswith("PyTorch 2.")
    check_package(result)
    assert result.checker_ok, result.checker_messages
    assert not (out / "TestOrg" / "results" / "perlmutter_128x4" / "strong" / "cosmoflow" / "scaling.json").exists()


def test_mini_run_package_layout_and_an_honest_rejection(tmp_path):
    """Our mini runs stop before the target: the layout is right, and the checker says no."""
    out = tmp_path / "pkg"
    runner = CliRunner()
    outcome = runner.invoke(report_command, [str(MINI_RUNS), "--format", "csv", "--package", str(out)])
    assert outcome.exit_code == 1, outcome.output
    root = out / "mlhpc"
    logs = sorted((root / "results" / "1xCPU" / "strong" / "cosmoflow").glob("result_*.txt"))
    assert len(logs) == len(list(MINI_RUNS.glob("result_*.txt")))
    desc = json.loads((root / "systems" / "1xCPU.json").read_text())
    assert desc["submitter"] == "mlhpc" and desc["division"] == "open" and desc["status"] == "research"
    assert desc["host_processor_model_name"] and desc["accelerator_model_name"] == "none (CPU)"
    (rejected,) = [l for l in outcome.stderr.splitlines() if "package_checker" in l]
    assert rejected.startswith("mlhpc: error: package_checker (without RCP bypass) rejected ")
    assert (root / "benchmarks" / "cosmoflow" / "implementations" / "mlhpc" / "mlhpc" / "report" / "score.py").is_file()
    with pytest.raises(ConfigError, match="already holds results"):
        package_runs([MINI_RUNS], out)
    with pytest.raises(ConfigError, match="folder name"):
        package_runs([MINI_RUNS], tmp_path / "other", system="bad/name")


def test_power_logs_of_only_some_runs_are_left_out_with_a_warning(tmp_path, mlperf_results):
    """package_checker refuses a benchmark where some results have power logs and others not:
    the package leaves them all out and says why."""
    folders = _run_folders(tmp_path, mlperf_results)
    node_file = folders[1] / "power" / "result_2" / "node_0.txt"
    node_file.parent.mkdir(parents=True)
    node_file.write_text(':::MLLOG {"key": "power_reading", "value": "250.0"}\n')
    result = package_runs(folders, tmp_path / "submission", org="TestOrg", system="perlmutter_128x4")
    bench = result.root / "results" / "perlmutter_128x4" / "strong" / "cosmoflow"
    assert not (bench / "power").exists()
    assert any("power logs left out for cosmoflow: 1 of 10 runs" in w for w in result.warnings)
    check_package(result)
    assert result.checker_ok, result.checker_messages


def test_a_power_folder_linked_out_of_its_run_folder_is_refused(tmp_path, mlperf_results):
    """A ``power`` link to another folder of the node would carry that folder's files into a
    package meant to be published: refused, naming the folder, as a linked log is."""
    folders = _run_folders(tmp_path, mlperf_results)
    elsewhere = tmp_path / "elsewhere"
    for i in range(5):
        (elsewhere / f"result_{i}").mkdir(parents=True)
        (elsewhere / f"result_{i}" / "node_0.txt").write_text(':::MLLOG {"key": "power_reading", "value": "1"}\n')
    (folders[0] / "power").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="power/result_0: symbolic link out of its run folder"):
        package_runs(folders, tmp_path / "submission", org="TestOrg", system="perlmutter_128x4")
