"""``mlhpc report --package`` ships the source of every workload its runs name, found through the
workload's entry point wherever it is installed: an OC20 run (whose workload lives in a folder not
named after the benchmark) and a workload installed from a distribution of its own, each package
accepted by MLCommons' package_checker."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from mlhpc.report.package import check_package, package_runs

HERE = Path(__file__).parent
MINI_RUNS = HERE / "data" / "report" / "cosmoflow-mini-runs"
TOY = HERE / "toy_workload" / "mlhpc_toy.py"
PUBLISHED = "hpc_results_v3.0/HPE+LBNL/results/perlmutter_128x4/strong/{}"


def _run_folder(tmp_path: Path, results: Path, benchmark: str, workload: str, runs: int) -> Path:
    """``runs`` published, compliant closed-division logs of ``benchmark`` dressed as one mlhpc
    run folder whose configs name ``workload``."""
    logs = sorted((results / PUBLISHED.format(benchmark)).glob("result_*.txt"))[:runs]
    assert len(logs) == runs
    env = json.loads((MINI_RUNS / "env_0.json").read_text())
    env.update(gpu_names=["NVIDIA A100-SXM4-40GB"] * 4, gpu_count=4)
    folder = tmp_path / f"{benchmark}-{workload}"
    folder.mkdir()
    for i, log in enumerate(logs):
        shutil.copyfile(log, folder / f"result_{i}.txt")
        (folder / f"env_{i}.json").write_text(json.dumps(env))
        (folder / f"config_{i}.yaml").write_text(yaml.safe_dump(
            {"workload": workload, "submission": {"org": "HPE+LBNL", "platform": "perlmutter",
                                                  "division": "closed", "status": "onprem"}}))
    return folder


def _shipped(out: Path, benchmark: str) -> set[str]:
    source = out / "TestOrg" / "benchmarks" / benchmark / "implementations" / "mlhpc"
    return {p.relative_to(source).as_posix() for p in source.rglob("*.py")}


def test_an_oc20_package_holds_the_oc20_source(tmp_path, mlperf_results):
    folder = _run_folder(tmp_path, mlperf_results, "oc20", "oc20", 5)
    out = tmp_path / "submission"
    result = package_runs([folder], out, org="TestOrg", system="perlmutter_128x4")
    shipped = _shipped(out, "oc20")
    assert {"mlhpc_workloads/opencatalyst/__init__.py", "mlhpc_workloads/opencatalyst/dimenet.py",
            "mlhpc_workloads/__init__.py", "mlhpc_workloads/departures.py",
            "mlhpc/workload.py"} <= shipped
    assert not any(p.startswith("mlhpc_workloads/cosmoflow/") for p in shipped)  # only what ran
    check_package(result)
    assert result.checker_ok, result.checker_messages


SCRIPT = """
import sys
from pathlib import Path
from mlhpc.report.package import check_package, package_runs
result = check_package(package_runs([Path(sys.argv[1])], Path(sys.argv[2]), org="TestOrg",
                                    system="perlmutter_128x4"))
print("CHECKER", result.checker_ok, result.checker_messages)
"""


def test_a_workload_from_its_own_distribution_is_shipped(tmp_path, mlperf_results):
    """The toy workload, installed as a distribution of its own (a ``.dist-info`` with its entry
    point beside its module), is found and shipped at its import path; the runs' logs are
    published CosmoFlow ones, so that the checker has a benchmark it knows."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(TOY, site / "mlhpc_toy.py")
    info = site / "mlhpc_toy-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlhpc-toy\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[mlhpc.workloads]\ntoy = mlhpc_toy:WORKLOAD\n")
    folder = _run_folder(tmp_path, mlperf_results, "cosmoflow", "toy", 10)
    out = tmp_path / "submission"
    env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(folder), str(out)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "CHECKER True []" in proc.stdout, proc.stdout[-2000:]
    shipped = _shipped(out, "cosmoflow")
    assert "mlhpc_toy.py" in shipped and "mlhpc/workload.py" in shipped
    assert not any(p.startswith("mlhpc_workloads/") for p in shipped)
