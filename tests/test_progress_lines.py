"""A run with stdout piped to a file (a Slurm log) says what it does (issue 26, point 2): the
synthesis of the embedded data (what, how big, where; then how long) and a ``step N/M`` line every
``train.log_every_steps``, at the same cadence as on a terminal."""

from __future__ import annotations

import re

from test_run_e2e import TINY, run_cli


def test_piped_run_shows_synthesis_and_step_lines(tmp_path, repo):
    data, out = tmp_path / "data", tmp_path / "out"
    # 64 training samples, global batch 8: 8 steps per epoch; a target reached at epoch 1
    proc = run_cli(["run", str(repo / "configs" / "cosmoflow-mini.yaml"), *TINY,
                    "--set", f"data.path={data}", "--set", f"output.dir={out}",
                    "--set", "train.target=10.0", "--set", "train.log_every_steps=3",
                    "--set", "data.staging.enabled=false"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    synth = [line for line in lines if line.startswith("synthesising")]
    assert len(synth) == 1 and "64 train, 32 eval samples" in synth[0], proc.stdout
    assert str(data) in synth[0]
    assert any(re.fullmatch(rf"synthesised {re.escape(str(data))} in \d+\.\d s", line)
               for line in lines), proc.stdout
    steps = [re.search(r"step (\d+)/(\d+)", line).groups() for line in lines
             if re.match(r"\s+step \d+/\d+", line)]
    assert steps == [("3", "8"), ("6", "8")], proc.stdout
    # a second run finds the data complete: no synthesis line
    again = run_cli(["run", str(repo / "configs" / "cosmoflow-mini.yaml"), *TINY,
                     "--set", f"data.path={data}", "--set", f"output.dir={out}",
                     "--set", "train.target=10.0", "--set", "data.staging.enabled=false"],
                    cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "synthesising" not in again.stdout and "step " not in again.stdout
