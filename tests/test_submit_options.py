"""`mlhpc submit` says what a site needs (issue 26, point 5): CPUs per task (with
OMP_NUM_THREADS), time, account, partition, QoS, constraint, exclusive and GPUs reach the
rendered script; without --time the limit follows the run count, and the user is told."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from mlhpc import slurm
from mlhpc.cli import main
from mlhpc.errors import ConfigError


def _submit(repo, tmp_path, *args):
    result = CliRunner().invoke(main, ["submit", str(repo / "configs" / "cosmoflow-mini.yaml"),
                                       "--set", f"output.dir={tmp_path / 'out'}", "--dry-run", *args])
    return result


def _directives(script: str) -> list[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def test_every_site_option_reaches_the_script(repo, tmp_path):
    result = _submit(repo, tmp_path, "--nodes", "2", "--gpus-per-node", "4", "--cpus-per-task", "8",
                     "--time", "02:30:00", "--account", "proj1", "--partition", "gpu",
                     "--qos", "high", "--constraint", "a100&ib", "--exclusive")
    assert result.exit_code == 0, result.output
    lines = _directives(result.stdout)
    for expected in ("#SBATCH --nodes=2", "#SBATCH --gpus-per-node=4", "#SBATCH --ntasks-per-node=4",
                     "#SBATCH --cpus-per-task=8", "#SBATCH --time=02:30:00",
                     "#SBATCH --account=proj1", "#SBATCH --partition=gpu", "#SBATCH --qos=high",
                     '#SBATCH --constraint="a100&ib"', "#SBATCH --exclusive"):
        assert expected in lines, (expected, lines)
    assert "export OMP_NUM_THREADS=8" in result.stdout.splitlines()
    assert "--time not given" not in result.stderr


def test_options_left_out_leave_no_directive(repo, tmp_path):
    result = _submit(repo, tmp_path, "--time", "10")
    text = "\n".join(_directives(result.stdout))
    for absent in ("--qos", "--constraint", "--exclusive", "--account", "--partition",
                   "--cpus-per-task", "--gpus-per-node"):
        assert absent not in text
    assert "OMP_NUM_THREADS" not in result.stdout


def test_time_follows_the_run_count_and_is_said(repo, tmp_path):
    result = _submit(repo, tmp_path, "--runs", "10")
    assert "#SBATCH --time=0-10:00:00" in _directives(result.stdout)
    assert result.stderr.strip() == ("mlhpc: --time not given: 10 run(s) x 01:00:00 per run "
                                     "(--time-per-run) = 0-10:00:00")
    result = _submit(repo, tmp_path, "--runs", "5", "--time-per-run", "1-06:00")
    assert "#SBATCH --time=6-06:00:00" in _directives(result.stdout)


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("05:30", 330), ("01:02:03", 3723),
                                           ("2-03", 183600), ("1-00:30", 88200),
                                           ("1-00:00:05", 86405)])
def test_slurm_time_forms(text, seconds):
    assert slurm.time_seconds(text) == seconds


def test_bad_values_are_one_line_exit_2(repo, tmp_path):
    for args in (["--time-per-run", "soon"], ["--qos", "a b"], ["--cpus-per-task", "0"]):
        result = _submit(repo, tmp_path, *args)
        assert result.exit_code == 2, (args, result.output)
        assert len(result.stderr.strip().splitlines()) <= 2 and "mlhpc: error:" in result.stderr
    with pytest.raises(ConfigError):
        slurm.job_time(3, "UNLIMITED")


# ------------------------------------------------------------------------------------------
# campaigns: --sweep


def _scripts(stdout: str) -> list[str]:
    return ["#!/bin/bash" + part for part in stdout.split("#!/bin/bash")[1:]]


def _exported(script: str, name: str) -> str:
    import re
    import shlex

    return shlex.split(re.search(rf"^export {name}=(.*)$", script, re.M).group(1))[0]


def test_sweep_renders_one_script_per_point_with_one_campaign(repo, tmp_path):
    result = _submit(repo, tmp_path, "--nodes", "4", "--sweep", "nodes=1,2", "--sweep",
                     "train.max_epochs=3,4", "--sweep", "time=10,20")
    assert result.exit_code == 0, result.output
    scripts = _scripts(result.stdout)
    assert len(scripts) == 8
    campaigns = {_exported(s, "MLHPC_CAMPAIGN") for s in scripts}
    assert len(campaigns) == 1
    campaign = campaigns.pop()
    assert f"mlhpc: campaign {campaign}: 8 job(s)" in result.stderr
    expected = [(n, e, t) for n in (1, 2) for e in (3, 4) for t in ("10", "20")]
    folders = set()
    for script, (nodes, epochs, minutes) in zip(scripts, expected):
        directives = _directives(script)
        assert f"#SBATCH --nodes={nodes}" in directives and f"#SBATCH --time={minutes}" in directives
        [step] = [line for line in script.splitlines() if "MASTER_PORT=" in line]
        assert f"--nodes={nodes} --ntasks={nodes} " in step
        assert step.count("--set train.max_epochs=") == 1 and f"--set train.max_epochs={epochs} " in step
        assert "--set nodes=" not in step and "--set time=" not in step  # submit options, not config keys
        out = tmp_path / "out" / campaign / f"nodes-{nodes}_train.max_epochs-{epochs}_time-{minutes}"
        assert f"--set output.dir={out} " in step and step.count("output.dir=") == 1
        folders.add(out)
    assert len(folders) == 8
    assert "--time not given" not in result.stderr  # the swept time holds


def test_sweep_gpus_and_tasks_are_submit_options(repo, tmp_path):
    result = _submit(repo, tmp_path, "--sweep", "gpus_per_node=2,4", "--sweep", "ntasks-per-node=1")
    assert result.exit_code != 0 and "one task per GPU means 2, got 1" in result.stderr
    result = _submit(repo, tmp_path, "--sweep", "gpus-per-node=2,4", "--runs", "2")
    assert result.exit_code == 0, result.output
    gpus = [[d for d in _directives(s) if d.startswith(("#SBATCH --gpus", "#SBATCH --ntasks"))]
            for s in _scripts(result.stdout)]
    assert gpus == [["#SBATCH --ntasks-per-node=2", "#SBATCH --gpus-per-node=2"],
                    ["#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4"]]
    assert result.stderr.splitlines()[0] == ("mlhpc: --time not given: 2 run(s) x 01:00:00 per run "
                                             "(--time-per-run) = 0-02:00:00")  # said once


@pytest.mark.parametrize("sweep, hint", [("node=1,2", "did you mean nodes?"),
                                         ("gpus-per-nod=1", "did you mean gpus-per-node?"),
                                         ("train.max_epoch=1,2", "did you mean train.max_epochs?"),
                                         ("nodes=1,two", "--sweep nodes=two: expected a whole number"),
                                         ("nodes=1,,2", "no empty value")])
def test_sweep_unknown_key_is_one_line_with_a_hint_exit_2(repo, tmp_path, sweep, hint):
    result = _submit(repo, tmp_path, "--sweep", sweep)
    assert result.exit_code == 2 and result.stdout == ""
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("mlhpc: error: --sweep ") and hint in line, line


def test_sweep_submits_every_point_and_says_what_was_queued(repo, tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    # accepts two jobs (ids 101, 102), refuses the third
    sbatch.write_text("#!/bin/bash\nn=$(ls \"$SBATCH_DIR\" | wc -l)\ncat > \"$SBATCH_DIR/job$n.sh\"\n"
                      "[ $n -lt 2 ] || { echo 'sbatch: error: QOSMaxSubmitJobPerUserLimit' >&2; exit 1; }\n"
                      "echo $((101 + n))\n")
    sbatch.chmod(0o755)
    (tmp_path / "jobs").mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("SBATCH_DIR", str(tmp_path / "jobs"))
    args = ["submit", str(repo / "configs" / "cosmoflow-mini.yaml"), "--set", f"output.dir={tmp_path / 'out'}",
            "--sweep", "nodes=1,2"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stdout.split() == ["101", "102"]
    sent = [(tmp_path / "jobs" / f"job{i}.sh").read_text() for i in range(2)]
    assert len({_exported(s, "MLHPC_CAMPAIGN") for s in sent}) == 1
    assert ["#SBATCH --nodes=1" in _directives(sent[0]), "#SBATCH --nodes=2" in _directives(sent[1])] == [True] * 2
    for job in (tmp_path / "jobs").iterdir():
        job.unlink()
    result = CliRunner().invoke(main, args + ["--sweep", "train.max_epochs=1,2"])
    assert result.exit_code == 2 and result.stdout.split() == []
    [line] = result.stderr.strip().splitlines()[-1:]
    assert "QOSMaxSubmitJobPerUserLimit" in line and "2 of 4 job(s) already queued: 101, 102" in line, line
