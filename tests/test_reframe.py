"""ReFrame drives mlhpc (`mlhpc.reframe`): the real ``reframe`` (reframe-hpc, the ``test`` extra)
runs the shipped checks on the local scheduler and, over ``squeue`` and ``srun``, on the one-node
Slurm cluster the ``slurm`` tests start; the tests read ReFrame's own JSON run report.

The runs are tiny configs made here from the mini configs with ``--set`` overrides, through
mlhpc's own config loader: a DeepCAM with 32 x 48 grids and no cyclone or river in any sample,
whose network learns "background everywhere" in one epoch, so its mean IoU reaches the reference
target (0.82) at once and the official compliance checker accepts its log (a plumbing check, not
a measure of learning); and a tiny CosmoFlow that misses its target (0.0) or reaches a target so
loose (10.0) that the checker, which wants eval_error <= 0.124 in any log, rejects the log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("reframe", reason="reframe-hpc is not installed: pip install -e '.[test]' (or '.[reframe]')")

from mlhpc import config as mlhpc_config  # noqa: E402
from mlhpc.reframe import CHECKS_FILE, CONFIGS  # noqa: E402
from mlhpc.reframe.base import launcher_problem  # noqa: E402
from mlhpc.reframe.references import PERF_VARIABLES, reference_table  # noqa: E402
from mlhpc.store.check import judge, load_references  # noqa: E402
from slurm_cluster import slurm_cluster  # noqa: E402,F401 - pytest fixture

REPO = Path(__file__).resolve().parents[1]
REFRAME = Path(sys.executable).parent / "reframe"

DEEPCAM_TINY = ["synth.height=32", "synth.width=48", "synth.train_samples=64", "synth.validation_samples=8",
                "synth.cyclones_per_sample=0", "synth.rivers_per_sample=0", "train.max_epochs=3",
                "model.entry_channels=[4,4,4,4,4]", "model.middle_blocks=0", "model.aspp_channels=4",
                "model.low_level_channels=4", "model.decoder_channels=4", "optimizer.name=Adam",
                "optimizer.lr=0.05", "optimizer.warmup_steps=0", "optimizer.milestones=[100]"]
COSMOFLOW_TINY = ["synth.cube_size=16", "synth.train_samples=32", "synth.eval_samples=16", "model.input_size=16",
                  "model.conv_channels=4", "model.n_conv_layers=3", "train.global_batch_size=8",
                  "train.max_epochs=1"]
#: Given to every check through ReFrame (``-S overrides=<JSON list>``).
COMMON = ["train.threads=1", "train.device=cpu"]


def _tiny(folder: Path, name: str, mini: str, sets: list[str]) -> str:
    """``configs/<mini>`` with ``sets`` applied by mlhpc's loader, saved as ``folder/name``."""
    path = folder / name
    path.write_text(mlhpc_config.dump(mlhpc_config.load(REPO / "configs" / mini, tuple(sets))))
    return str(path)


@pytest.fixture(scope="module")
def configs(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("reframe-configs")
    (folder / "unknown-workload.yaml").write_text(
        "workload: nosuchbench\ntrain: {global_batch_size: 1, max_epochs: 1}\n")
    (folder / "unparsable.yaml").write_text("workload: [unclosed\n")
    cosmoflow = "cosmoflow-mini.yaml"
    return {
        "pass": _tiny(folder, "deepcam-tiny.yaml", "deepcam-mini.yaml", DEEPCAM_TINY),
        "missed": _tiny(folder, "cosmoflow-missed.yaml", cosmoflow, COSMOFLOW_TINY + ["train.target=0.0"]),
        "rejected": _tiny(folder, "cosmoflow-rejected.yaml", cosmoflow, COSMOFLOW_TINY + ["train.target=10.0"]),
        "unknown": str(folder / "unknown-workload.yaml"),
        "unparsable": str(folder / "unparsable.yaml"),
    }


def _reframe(tmp_path: Path, config: str, args: list[str],
             env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """Run ``reframe`` on the shipped checks with the shipped example ``config``; its output and
    the test cases of its JSON run report."""
    report = tmp_path / "report.json"
    cmd = [str(REFRAME), "-C", str(CONFIGS[config]), "-c", str(CHECKS_FILE), "--prefix", str(tmp_path / "rfm"),
           "--report-file", str(report), "--exec-policy", "async", *args, "-S", f"overrides={json.dumps(COMMON)}", "-r"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "MLHPC_RFM_RESULTS_DB": str(tmp_path / "rfm.db"),
                               **env})
    assert report.is_file(), proc.stdout[-4000:] + proc.stderr[-4000:]
    cases = [case for run in json.loads(report.read_text())["runs"] for case in run["testcases"]]
    return proc, cases


def _case(cases: list[dict], name: str, config: str, **variables) -> dict:
    found = [c for c in cases if c["name"].startswith(name) and c["config"] == config
             and all(c[k] == v for k, v in variables.items())]
    assert len(found) == 1, [(c["display_name"], c["result"]) for c in cases]
    return found[0]


def _report_run(results: Path) -> dict:
    """``mlhpc report --format json``'s one run of the folder."""
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "report", str(results), "--format", "json"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    [run] = json.loads(proc.stdout)["folders"][0]["runs"]
    return run


def _perf(case: dict) -> dict[str, tuple[float, str, str]]:
    """ReFrame's stored performance variables: name -> (value, unit, result)."""
    return {key.rsplit(":", 1)[1]: (v[0], v[4], v[5]) for key, v in case["perfvalues"].items()}


def _assert_same_figures(case: dict, run: dict) -> None:
    """ReFrame's stored figures are those `mlhpc report` prints for the same log, in ReFrame's units."""
    perf = _perf(case)
    assert perf["time_to_train"][:2] == (pytest.approx(run["time_to_train_s"] / 60, rel=1e-12), "min")
    assert perf["staging"][:2] == (pytest.approx(run["staging_s"], rel=1e-12), "s")
    assert perf["epochs_to_target"][:2] == (run["epochs_to_target"], "epochs")
    assert perf["throughput"][:2] == (pytest.approx(run["samples_per_s"], rel=1e-12), "samples/s")
    assert run["energy_to_train_j"] is None and "energy_to_train" not in perf  # no power counter here


@pytest.mark.cluster  # reframe for real
def test_local_scheduler_passes_fails_and_says_why(tmp_path: Path, configs: dict[str, str]) -> None:
    """One ``reframe`` on the local scheduler: the staging check passes; the DeepCAM run passes
    sanity but misses a reference no run can meet (a performance failure); the CosmoFlow runs
    that miss their target or whose log the checker rejects fail sanity; bad input fails its
    check at setup with mlhpc's one line, no traceback."""
    refs = tmp_path / "refs.yaml"
    refs.write_text(yaml.safe_dump({"laptop:default": {"deepcam": {"time_to_train_s": [1e-6, None, 0.0, "s"]}}}))
    runs = ",".join(configs[k] for k in ("pass", "missed", "rejected", "unknown", "unparsable"))
    proc, cases = _reframe(tmp_path, "laptop", [
        "--system", "laptop", "-P", f"mlhpc_run.config={runs}", "-P", f"mlhpc_stage.config={configs['pass']}",
        "-P", "mlhpc_stage.ranks_per_node=1,2", "-S", f"mlhpc_run.references={refs}"],
        {"MLHPC_RFM_STAGING_DEST": str(tmp_path), "MLHPC_RFM_MAX_JOBS": "2"})
    assert proc.returncode != 0 and len(cases) == 7, proc.stdout[-4000:]

    stage = _case(cases, "mlhpc_stage", configs["pass"], ranks_per_node=1)
    assert stage["result"] == "pass", stage["fail_reason"]
    staged = _perf(stage)
    assert staged["staging"][1:] == ("s", "pass") and staged["staging"][0] > 0
    assert staged["staged"][0] > 0 and staged["bandwidth"][1] == "GB/s"
    assert not list(tmp_path.glob("mlhpc-reframe-*")), "the staging check left its copy"

    slow = _case(cases, "mlhpc_run", configs["pass"])
    assert (slow["result"], slow["fail_phase"]) == ("fail", "performance"), slow["fail_reason"]
    assert _perf(slow)["time_to_train"][2] == "fail"
    _assert_same_figures(slow, _report_run(Path(slow["stagedir"]) / "results"))

    missed = _case(cases, "mlhpc_run", configs["missed"])
    assert (missed["result"], missed["fail_phase"]) == ("fail", "sanity")
    assert "the run missed its target (run_stop aborted" in missed["fail_reason"]
    rejected = _case(cases, "mlhpc_run", configs["rejected"])
    assert (rejected["result"], rejected["fail_phase"]) == ("fail", "sanity")
    assert "official compliance checker (hpc 3.0.0) rejects it" in rejected["fail_reason"]

    for key, said in (("unknown", "nosuchbench"), ("unparsable", "unparsable.yaml")):
        case = _case(cases, "mlhpc_run", configs[key])
        assert (case["result"], case["fail_phase"]) == ("fail", "setup"), case["fail_reason"]
        assert case["fail_reason"].startswith("config error: ") and said in case["fail_reason"]
        assert "\n" not in case["fail_reason"] and "Traceback" not in proc.stdout + proc.stderr
    two = _case(cases, "mlhpc_stage", configs["pass"], ranks_per_node=2)
    assert (two["result"], two["fail_phase"]) == ("fail", "setup")
    assert "partition laptop:default: no launcher starts the 2 ranks asked for" in two["fail_reason"]


@pytest.mark.slurm
def test_slurm_squeue_and_srun_run_the_checks_to_a_pass(slurm_cluster, tmp_path: Path,  # noqa: F811
                                                         configs: dict[str, str]) -> None:
    """One ``reframe`` on the one-node cluster (``squeue`` scheduler, ``srun`` launcher): the run
    check with 2 ranks from srun meets its reference and passes, as does the staging check; the
    figures ReFrame stores are those `mlhpc report` prints for the kept log."""
    refs = tmp_path / "refs.yaml"
    refs.write_text(yaml.safe_dump({"cluster:cpu": {"deepcam": {"time_to_train_s": [10.0, None, 0.5, "min"]}}}))
    node_local = tmp_path / "node-local"
    node_local.mkdir()
    proc, cases = _reframe(tmp_path, "slurm", [
        "--system", "cluster:cpu", "-P", f"config={configs['pass']}", "-S", "mlhpc_run.ranks_per_node=2",
        "-S", f"mlhpc_run.references={refs}"],
        {"MLHPC_RFM_PARTITION": slurm_cluster.partition, "MLHPC_RFM_STAGING_DEST": str(node_local)})
    assert proc.returncode == 0, proc.stdout[-6000:]
    run, stage = _case(cases, "mlhpc_run", configs["pass"]), _case(cases, "mlhpc_stage", configs["pass"])
    assert run["result"] == stage["result"] == "pass"
    assert (run["scheduler"], run["num_tasks"]) == ("squeue", 2)
    assert _perf(run)["time_to_train"][2] == "pass"
    results = Path(run["outputdir"]) / "results"
    summary = json.loads((results / "summary_0.json").read_text())
    assert summary["world_size"] == 2  # the ranks came from srun
    _assert_same_figures(run, _report_run(results))
    assert stage["perfvalues"] and not list(node_local.iterdir())


def test_references_mean_the_same_for_reframe_and_results_check(tmp_path: Path) -> None:
    """The better-side bound is left out of ReFrame's table, so a figure fails in ReFrame exactly
    when `mlhpc results check` calls it a regression."""
    refs = tmp_path / "refs.yaml"
    refs.write_text(yaml.safe_dump({"sys:part": {"x": {
        "time_to_train_s": [600.0, -0.1, 0.1, "s"], "samples_per_s": [100.0, -0.1, 0.1, "samples/s"],
        "energy_to_train_j": [2e6, None, 0.05, "kJ"]}},
        "other": {"y": {"samples_per_s": [1.0, None, None, "samples/s"]}}}))
    table = reference_table(refs, "x")
    assert table == {"sys:part": {"time_to_train": (10.0, None, 0.1, "min"),
                                  "throughput": (100.0, -0.1, None, "samples/s"),
                                  "energy_to_train": (2e6, None, 0.05, "kJ")}}
    for ref in load_references(refs):
        if ref.benchmark != "x":
            continue
        value, lower, upper, _ = table["sys:part"][PERF_VARIABLES[ref.figure][0]]
        for factor in (0.5, 0.95, 1.05, 2.0):  # the same run, in ReFrame's unit and in the store's
            fails = ((lower is not None and value * factor < value * (1 + lower))
                     or (upper is not None and value * factor > value * (1 + upper)))
            assert fails == (judge(ref, [ref.value * factor]).verdict == "regression"), (ref.figure, factor)
    with pytest.raises(Exception, match="unknown figure 'speed'"):
        (tmp_path / "bad.yaml").write_text("s:\n  x:\n    speed: [1, null, null, s]\n")
        reference_table(tmp_path / "bad.yaml", "x")


def test_launchers_and_the_paths_a_centre_needs() -> None:
    assert launcher_problem("a:b", "srun", 8) is None and launcher_problem("a:b", "local", 1) is None
    assert "no launcher starts the 4 ranks" in launcher_problem("a:b", "local", 4)
    assert "launcher 'pdsh' gives mlhpc no ranks" in launcher_problem("a:b", "pdsh", 1)
    show = [sys.executable, "-m", "mlhpc.reframe"]
    assert subprocess.run(show, capture_output=True, text=True, check=True).stdout.strip() == str(CHECKS_FILE)
    laptop = subprocess.run(show + ["--config", "laptop"], capture_output=True, text=True, check=True)
    assert Path(laptop.stdout.strip()) == CONFIGS["laptop"] and set(CONFIGS) == {"laptop", "slurm"}
    bad = subprocess.run(show + ["--config", "nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
