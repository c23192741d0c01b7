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
