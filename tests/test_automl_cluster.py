"""`mlhpc submit CONFIG --automl` (mlhpc/slurm_automl.py): the job's three steps (prepare, one
srun step of workers, finish) rendered in order with every value quoted, the wall time chosen from
the budget, the options a search does not take refused; and `mlhpc automl` across processes of a
real launcher: a tiny search as a Slurm job whose two workers are two tasks of one step, and as
two torchrun agents (two nodes on this machine) sharing one journal file."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.errors import ConfigError
from mlhpc.slurm_automl import render_search, search_time
from mlhpc.slurm_job import Allocation, SubmitOptions
from slurm_cluster import slurm_cluster, wait_for_job  # noqa: F401 - pytest fixture
from test_automl import MINI, ROOT, mlhpc, study_trials, tiny_args, tiny_data  # noqa: F401 - fixture

BIN = Path(sys.executable).parent
# Everything a shell could trip on: spaces, both quotes, $(), backticks, ;, a newline, a
# backslash, sbatch's %j and a glob.
HOSTILE = "a b 'c' \"d\" $(touch PWNED1) `touch PWNED2` ; touch PWNED3\nnext \\ %j *"
HOSTILE_SET = f"submission.poc_name=x {HOSTILE}"
HOSTILE_NAME = HOSTILE.replace("\n", " ")  # a config refuses a path holding a control character

# `python`: each call's argv, NUL-separated, in a file named by the time (calls are sequential
# but the workers'); --prepare and --finish exit with the status the test asks for.
PYTHON_STUB = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_DIR/$(date +%s%N).$$.call"
for a in "$@"; do case "$a" in --prepare) exit "${PREPARE_STATUS:-0}";; --finish) exit "${FINISH_STATUS:-0}";; esac; done
"""
# `srun`: its argv recorded, then the command after its options run once per task.
SRUN_STUB = r"""#!/bin/bash
printf '%s\0' "$@" > "$STUB_DIR/srun.args"
n=1
while [ $# -gt 0 ]; do case "$1" in --ntasks=*) n="${1#--ntasks=}"; shift;; --*) shift;; *) break;; esac; done
for ((i = 0; i < n; i++)); do "$@" & done
wait
"""


def _stubs(tmp_path: Path) -> tuple[Path, Path]:
    bin_dir = tmp_path / "stub-bin"
    bin_dir.mkdir()
    for name, body in (("python", PYTHON_STUB), ("srun", SRUN_STUB)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.mkdir()
    return bin_dir, calls


def _hostile_config(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The AutoML mini copied to a file named HOSTILE_NAME, a working folder and a search folder too."""
    root = tmp_path / "ro ot"
    config = root / "cfg" / f"{HOSTILE_NAME}.yaml"
    config.parent.mkdir(parents=True)
    config.write_text(MINI.read_text())
    work = root / "work" / HOSTILE_NAME
    work.mkdir(parents=True)
    return config, work, root / "out" / HOSTILE_NAME


def _run_job(script: str, tmp_path: Path, **env: str) -> tuple[list[list[str]], list[str] | None, subprocess.CompletedProcess]:
    """The script run in bash with stub python and srun: the python calls' argvs in order, srun's argv."""
    bin_dir, calls = _stubs(tmp_path)
    path = tmp_path / "job.sh"
    path.write_text(script)
    proc = subprocess.run(["bash", str(path)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "STUB_DIR": str(calls),
                               "SLURM_JOB_ID": "77", **env})
    argvs = [f.read_bytes().decode().split("\0")[:-1] for f in sorted(calls.glob("*.call"))]
    srun = calls / "srun.args"
    return argvs, (srun.read_bytes().decode().split("\0")[:-1] if srun.exists() else None), proc


def test_the_job_prepares_runs_one_step_of_workers_and_finishes_with_values_intact(tmp_path: Path) -> None:
    config, work, out = _hostile_config(tmp_path)
    stub_python = str(tmp_path / "stub-bin" / "python")
    job = render_search(config, SubmitOptions(Allocation(nodes=1, tasks_per_node=2, job_name=HOSTILE),
                                              runs=5),  # runs: not a search's option, left out
                        [f"output.dir={out}", HOSTILE_SET, "automl.budget_s=20", "automl.mark_every_s=5"],
                        python=stub_python, workdir=work)
    script = job.script
    assert subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, timeout=30).returncode == 0
    lines = script.splitlines()
    order = [next(i for i, line in enumerate(lines) if f" {flag} " in line) for flag in ("--prepare", "--worker", "--finish")]
    assert order == sorted(order) and lines[order[1]].startswith("srun ")  # in order; the workers one srun step
    assert sum(line.startswith("srun ") for line in lines) == 1
    assert "#SBATCH --time=0-00:11:00" in lines  # 20 s + 600 s + 5%, rounded up to minutes
    assert job.notes == ["mlhpc: --time not given: the search's budget 20 s (automl.budget_s) + 640 s to "
                         "prepare it and stop its last trials = 0-00:11:00"]

    argvs, srun, proc = _run_job(script, tmp_path, SLURM_CPUS_ON_NODE="8")
    assert proc.returncode == 0, proc.stderr
    head = ["-m", "mlhpc", "automl", str(config.resolve())]
    sets = ["--set", f"output.dir={out}"]
    tail = ["--set", HOSTILE_SET, "--set", "automl.budget_s=20", "--set", "automl.mark_every_s=5"]
    worker = [*head, "--worker", *sets, "--set", "automl.trial_threads=4", *tail]  # 8 CPUs, 2 workers
    assert argvs == [[*head, "--prepare", *sets, *tail], worker, worker, [*head, "--finish", *sets, *tail]]
    assert srun == ["--nodes=1", "--ntasks=2", "--ntasks-per-node=2", "--mpi=none", "--kill-on-bad-exit=0",
                    stub_python, *worker]
    assert not list(tmp_path.rglob("PWNED*"))
    assert (out.stat().st_mode & 0o777) == 0o700  # made private, as --prepare wants it
    log = (out / "slurm-77.out").read_text()  # '%', '\\' in the folder: the body writes the log
    assert "2 worker(s) starting" in log and "search finished" in log


def test_the_finish_step_s_status_is_the_job_s_and_a_failed_prepare_starts_no_worker(tmp_path: Path) -> None:
    job = render_search(MINI, SubmitOptions(Allocation(nodes=2, gpus_per_node=4, cpus_per_task=3)),
                        [f"output.dir={tmp_path / 'search'}"], python=str(tmp_path / "stub-bin" / "python"))
    argvs, srun, proc = _run_job(job.script, tmp_path, FINISH_STATUS="1")
    assert proc.returncode == 1 and len(argvs) == 1 + 8 + 1
    assert srun[:8] == ["--nodes=2", "--ntasks=8", "--ntasks-per-node=4", "--mpi=none", "--kill-on-bad-exit=0",
                        "--cpus-per-task=3", "--gpus-per-task=1", str(tmp_path / "stub-bin" / "python")]
    assert "automl.trial_threads=3" in srun  # --cpus-per-task's CPUs for each trial
    assert "#SBATCH --gpus-per-node=4" in job.script and "#SBATCH --ntasks-per-node=4" in job.script
    assert "export OMP_NUM_THREADS=3" in job.script

    again = tmp_path / "again"
    again.mkdir()
    argvs, srun, proc = _run_job(job.script, again, PREPARE_STATUS="2")
    assert proc.returncode == 2 and len(argvs) == 1 and argvs[0][4] == "--prepare" and srun is None


def test_a_config_s_own_trial_threads_are_kept() -> None:
    job = render_search(MINI, SubmitOptions(time_limit="30"), ["automl.trial_threads=2", "output.dir=/tmp/x"])
    assert "TRIAL_THREADS" not in job.script and job.notes == []
    assert "#SBATCH --time=30" in job.script and job.script.count("--set automl.trial_threads=2") == 3


def test_search_time_is_the_budget_and_a_margin_in_whole_minutes() -> None:
    assert search_time(900) == ("0-00:26:00", 660)  # 900 + 600 + 45 = 1545 s -> 26 min
    assert search_time(86400) == ("1-01:22:00", 4920)


def _submit(*args: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(main, ["submit", *args, "--dry-run"])
    return result.exit_code, result.stderr.strip().splitlines()


@pytest.mark.parametrize("option, words", [
    (["--runs", "1"], "--runs: not with --automl"),  # given, even at its default
    (["--instances", "2"], "--instances: not with --automl"),
    (["--sweep", "nodes=1,2"], "--sweep: not with --automl"),
    (["--time-per-run", "10"], "--time-per-run: not with --automl"),
])
def test_run_options_are_refused_with_automl(tmp_path: Path, option: list[str], words: str) -> None:
    status, lines = _submit(str(MINI), "--automl", "--set", f"output.dir={tmp_path}", *option)
    assert status == 2 and len(lines) == 1 and lines[0].startswith(f"mlhpc: error: {words}"), lines


def test_a_config_without_a_search_or_a_folder_with_one_is_refused(tmp_path: Path) -> None:
    status, lines = _submit(str(ROOT / "configs" / "cosmoflow-mini.yaml"), "--automl",
                            "--set", f"output.dir={tmp_path}")
    assert status == 2 and len(lines) == 1 and "automl: section missing" in lines[0], lines
    (tmp_path / "study.json").write_text("{}")
    status, lines = _submit(str(MINI), "--automl", "--set", f"output.dir={tmp_path}")
    assert status == 2 and len(lines) == 1 and "already holds a search (study.json)" in lines[0], lines
    with pytest.raises(ConfigError, match=r"automl\.space\.model\.nope: not a knob"):
        render_search(MINI, SubmitOptions(), ["automl.space={model.nope: {low: 1, high: 2}}", f"output.dir={tmp_path / 'x'}"])


def test_submit_automl_dry_run_prints_the_script_and_the_chosen_time(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["submit", str(MINI), "--automl", "--nodes", "2", "--set",
                                       f"output.dir={tmp_path / 's'}", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "+ 660 s to prepare it" in result.stderr and "#SBATCH --time=0-00:26:00" in result.stdout
    assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1" in result.stdout
    assert not (tmp_path / "s").exists()  # a dry run makes nothing


# ------------------------------------------------------------------------------------------
# the search across the processes of a real launcher

def _workers_and_pids(out: Path) -> set[str]:
    trials = study_trials(out)
    assert trials
    for t in trials:
        assert (out / f"trial_{t.number:04d}" / "trial.json").is_file(), t.number
    assert len(list(out.glob("trial_*"))) == len(trials)
    return {t.user_attrs["worker"] for t in trials}


@pytest.mark.slurm
def test_a_slurm_job_s_two_workers_take_trials_from_one_study(slurm_cluster, tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "search"
    env = {**os.environ, "MLHPC_STORE": "none", "OMP_NUM_THREADS": "1"}  # the job inherits both
    proc = subprocess.run([sys.executable, "-m", "mlhpc", "submit", *tiny_args(tiny_data, out, 24), "--automl",
                           "--nodes", "1", "--tasks-per-node", "2", "--partition", slurm_cluster.partition,
                           "--job-name", "mlhpc-automl"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "--time not given: the search's budget 24 s" in proc.stderr
    job_id = proc.stdout.strip().splitlines()[-1]
    end = wait_for_job(job_id, timeout_s=240)
    log = out / f"slurm-{job_id}.out"
    text = log.read_text() if log.exists() else ""
    assert (end.state, end.exit_code) == ("COMPLETED", "0:0"), end.details + text
    workers = _workers_and_pids(out)
    assert len(workers) == 2 and len({w.rsplit(":", 1)[1] for w in workers}) == 2, workers
    assert "2 worker(s) starting" in text and "AutoML study" in text  # the score, from --finish
    report = mlhpc("report", str(out), "--format", "json")
    assert report.returncode == 0, report.stderr
    marks = json.loads(report.stdout)["marks"]
    assert [m["elapsed_s"] for m in marks] == pytest.approx([8.0, 16.0, 24.0], abs=1e-3)
    assert marks[-1]["total_flops"] > 0  # trials that ended within the budget counted


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.cluster  # two torchrun agents
def test_two_torchrun_nodes_take_trials_from_one_journal(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "search"
    args = tiny_args(tiny_data, out, 20, "automl.trial_threads=1")
    prepared = mlhpc("automl", *args, "--prepare")
    assert prepared.returncode == 0, prepared.stderr
    port, env = _free_port(), {**os.environ, "OMP_NUM_THREADS": "1", "MLHPC_STORE": "none"}
    env.pop("SLURM_JOB_ID", None)
    agents = [subprocess.Popen(
        [str(BIN / "torchrun"), "--nnodes", "2", "--node_rank", str(node), "--nproc-per-node", "1",
         "--master_addr", "127.0.0.1", "--master_port", str(port), "--no-python", str(BIN / "mlhpc"),
         "automl", *args, "--worker"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True) for node in range(2)]
    try:
        ends = [agent.communicate(timeout=120) for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    for agent, (stdout, stderr) in zip(agents, ends):
        assert agent.returncode == 0, stderr[-3000:]
    workers = _workers_and_pids(out)
    assert len(workers) == 2, workers  # one worker per node, both in the one study
    finished = mlhpc("automl", *args, "--finish")
    assert finished.returncode in (0, 1), finished.stderr
    assert "AutoML study" in finished.stdout  # the score
    assert json.loads((out / "study.json").read_text())["ended_unix_s"] is not None
