"""The first hour with mlhpc (issue 26, points 2, 4 and 7): long steps say what they do, how big
and how long (synthesis progress in a log, a size note before gigabytes are written); a folder of
another workload's data is one line naming that workload; ``--format json`` on list and data
check (the unreleased ``--json`` spelling is gone); ``mlhpc run`` says first where its data and results go."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc.cli import main
from mlhpc.data import embedded, synthwatch
from mlhpc.progress import LOG_INTERVAL_S, SynthLines

TINY_DEEPCAM = ["--set", "synth.height=32", "--set", "synth.width=48"]
TINY_COSMOFLOW = ["--set", "synth.cube_size=8", "--set", "synth.train_samples=8",
                  "--set", "synth.eval_samples=4", "--set", "synth.workers=1"]


def _mlhpc(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python -m mlhpc ARGS`` with stdout and stderr piped (as into a Slurm log)."""
    return subprocess.run([sys.executable, "-m", "mlhpc", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def _bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def test_piped_data_synth_says_what_how_big_and_how_far(tmp_path):
    out = tmp_path / "dc"
    proc = _mlhpc(["data", "synth", "deepcam", "--out", "dc", *TINY_DEEPCAM,
                   "--set", "synth.train_samples=8", "--set", "synth.validation_samples=2"],
                  cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == ("mlhpc: no --config: deepcam's synth defaults (full-size samples) and "
                        "the --set values")
    plan = re.fullmatch(r"writing 10 samples \(about ([\d.]+) (kB|MB)\) into (.+)", lines[1])
    assert plan and plan.group(3) == str(out), lines[1]  # the absolute folder, before writing
    # the estimate is within 5% of what was written (10 files and stats.h5)
    estimate = float(plan.group(1)) * {"kB": 1e3, "MB": 1e6}[plan.group(2)]
    assert abs(estimate - _bytes(out)) < 0.05 * _bytes(out), (estimate, _bytes(out))
    done = [int(m.group(1)) for m in (re.match(r"  synth (\d+)/10 samples, [\d.]+ [kM]B of "
                                               r"about [\d.]+ [kM]B, \d+ s", line)
                                      for line in lines[2:-1]) if m]
    assert len(done) == len(lines) - 3 and done == sorted(done) and done[-1] == 10, proc.stderr
    # the end: the files (10 and stats.h5), their bytes, the time and the rate
    assert re.fullmatch(r"synthesised 11 files, [\d.]+ [kM]B in [\d.]+ s: [\d.]+ [kMG]B/s in all",
                        lines[-1]), lines[-1]
    assert len(done) >= 5  # a line at least every tenth of the samples (or every 5 s)
    assert proc.stdout.strip() == f"wrote deepcam data to {out}"


def test_a_log_gets_a_line_every_interval_or_tenth(monkeypatch):
    clock = {"now": 100.0}
    monkeypatch.setattr("mlhpc.progress.time.monotonic", lambda: clock["now"])
    log = io.StringIO()  # not a terminal: plain lines
    lines = SynthLines(log)
    lines({"kind": "synth_plan", "path": "/d", "samples": 1000, "bytes": None})
    assert log.getvalue().splitlines() == ["writing 1000 samples (size known once written) into /d"]
    event = {"kind": "synth_progress", "path": "/d", "samples": 1000, "bytes": 5_000_000,
             "planned_bytes": None, "elapsed_s": 1.0, "eta_s": 99.0}
    for done in range(1, 100):  # under a tenth, under the interval: quiet
        clock["now"] += 0.01
        lines({**event, "done": done})
    assert len(log.getvalue().splitlines()) == 1
    clock["now"] += LOG_INTERVAL_S  # the interval passed: a line
    lines({**event, "done": 100})
    lines({**event, "done": 101})
    assert log.getvalue().splitlines()[1:] == [
        "  synth 100/1000 samples, 5.0 MB written, 1 s, 5.0 MB/s, about 99 s left"]
    lines({**event, "done": 201})  # a tenth more: a line
    lines({**event, "done": 1000})  # the last: a line
    printed = log.getvalue().splitlines()
    assert len(printed) == 4 and printed[-1].startswith("  synth 1000/1000")


def test_a_slow_silent_synthesis_still_reports(tmp_path, monkeypatch):
    """A workload that reports nothing to its ``progress`` is watched through its bytes,
    at least every TICK_S seconds."""
    monkeypatch.setattr(synthwatch, "TICK_S", 0.1)

    def synthesize(out_dir, synth, seed, progress):  # says nothing to ``progress``
        for split in ("train", "validation"):
            (out_dir / split).mkdir(exist_ok=True)
            (out_dir / split / "a.bin").write_bytes(b"x" * 1000)
        time.sleep(0.6)

    events: list[dict] = []
    fake = types.SimpleNamespace(name="fake", synthesize=synthesize)
    assert embedded.synthesize(tmp_path / "d", fake, None, 0, on_progress=events.append)
    assert events[0] == {"kind": "synth_plan", "path": str(tmp_path / "d"), "samples": None,
                         "bytes": None}
    ticks = [e for e in events if e["kind"] == "synth_progress"]
    assert len(ticks) >= 3 and ticks[-1]["bytes"] >= 2000 and ticks[-1]["done"] is None


def test_gigabytes_are_announced_before_the_first_sample(tmp_path):
    """``data synth deepcam`` without a config makes the full 768 x 1152 grid: it says how many
    samples, about how many GB and where before the first file is written."""
    out = tmp_path / "full"
    proc = subprocess.Popen([sys.executable, "-m", "mlhpc", "data", "synth", "deepcam", "--out",
                             str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path, env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        heard = [proc.stderr.readline() for _ in range(3)]
        written = [p for p in tmp_path.rglob("*.h5")]  # a sample file is renamed into place
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert heard[0].startswith("mlhpc: no --config: deepcam's synth defaults"), heard
    plan = re.fullmatch(rf"writing 320 samples \(about ([\d.]+) GB\) into {re.escape(str(out))}\n",
                        heard[1])
    assert plan and float(plan.group(1)) > 10, heard  # 320 x (768 x 1152 x 17 x 4 bytes)
    assert heard[2].startswith(f"note: this writes {plan.group(1)} GB"), heard
    assert written == [], written


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A tiny CosmoFlow and a tiny DeepCAM dataset."""
    root = tmp_path_factory.mktemp("first-hour")
    runner = CliRunner()
    for name, args in (("cosmoflow", TINY_COSMOFLOW),
                       ("deepcam", [*TINY_DEEPCAM, "--set", "synth.train_samples=4",
                                    "--set", "synth.validation_samples=2"])):
        result = runner.invoke(main, ["data", "synth", name, "--out", str(root / name), *args])
        assert result.exit_code == 0, result.output
    return root


@pytest.mark.parametrize("named, holds", [("cosmoflow", "deepcam"), ("deepcam", "cosmoflow")])
def test_another_workloads_folder_is_one_line(datasets, named, holds):
    folder = datasets / holds
    result = CliRunner().invoke(main, ["data", "check", named, str(folder)])
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"mlhpc: error: {folder} looks like {holds} data, not {named}: try mlhpc data check "
        f"{holds} {folder}"]
    assert result.stdout == ""


def test_bad_files_of_nobody_are_still_named_one_by_one(datasets, tmp_path):
    """Files no workload reads are bad files of the one named, not "another workload's"."""
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(datasets / "cosmoflow", folder)
    broken = sorted((folder / "train").glob("*.h5"))
    for path in broken:
        path.write_bytes(b"not hdf5")
    result = CliRunner().invoke(main, ["data", "check", "cosmoflow", str(folder)])
    assert result.exit_code == 2
    bad = [line for line in result.stderr.splitlines() if line.startswith("bad: ")]
    assert len(bad) == len(broken) and "looks like" not in result.stderr


def test_format_json_on_list_and_data_check(datasets):
    runner = CliRunner()
    listed = runner.invoke(main, ["list", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)
    assert {"cosmoflow", "deepcam"} <= {row["name"] for row in rows}
    assert runner.invoke(main, ["list", "--json"]).exit_code == 2  # no --json: mlhpc was never released with it
    assert not runner.invoke(main, ["list", "--format", "table"]).stdout.lstrip().startswith("[")

    folder = str(datasets / "cosmoflow")
    checked = runner.invoke(main, ["data", "check", "cosmoflow", folder, "--format", "json"])
    assert checked.exit_code == 0, checked.output
    report = json.loads(checked.stdout)
    assert report["ok"] and report["splits"]["train"]["samples"] == 8
    assert runner.invoke(main, ["data", "check", "cosmoflow", folder, "--json"]).exit_code == 2
    # --format FORM (its meaning before --form) still picks the files' form, and says so
    old = runner.invoke(main, ["data", "check", "cosmoflow", folder, "--format", "hdf5"])
    assert old.exit_code == 0 and "in form hdf5" in old.stdout
    assert "--format hdf5 read as --form hdf5" in old.stderr
    wrong = runner.invoke(main, ["data", "check", "cosmoflow", folder, "--format", "jsn"])
    assert wrong.exit_code == 2
    assert wrong.stderr.strip() == "mlhpc: error: --format 'jsn': expected table or json; did you mean json?"


def test_run_says_first_where_data_and_results_go(tmp_path, repo):
    """Relative data.path and output.dir are resolved against the current folder, and the run
    says so before synthesising; then the synthesis progress, at the log's cadence."""
    proc = _mlhpc(["run", str(repo / "configs" / "cosmoflow-mini.yaml"), *TINY_COSMOFLOW,
                   "--set", "synth.samples_per_file=1", "--set", "model.input_size=8",
                   "--set", "model.conv_channels=2", "--set", "model.n_conv_layers=2",
                   "--set", "train.global_batch_size=4", "--set", "train.max_epochs=1",
                   "--set", "train.threads=1", "--set", "train.target=10.0",
                   "--set", "data.staging.enabled=false", "--set", "data.path=d",
                   "--set", f"output.dir={tmp_path / 'out'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    lines = proc.stdout.splitlines()
    assert lines[0] == (f"data: {tmp_path / 'd'} (data.path d is relative: resolved against the "
                        f"current folder {tmp_path})")
    assert lines[1] == f"results: {tmp_path / 'out'}"  # absolute in the config: nothing to say
    assert lines[2].startswith("synthesising the embedded cosmoflow dataset")
    plan = re.fullmatch(rf"writing 12 samples \(about (\d+) kB\) into {re.escape(str(tmp_path / 'd'))}",
                        lines[3])
    assert plan, lines[3]  # and the estimate is within 5% of the bytes written
    assert abs(int(plan.group(1)) * 1e3 - _bytes(tmp_path / "d")) < 0.05 * _bytes(tmp_path / "d")
    synth = [line for line in lines if line.startswith("  synth ")]
    assert synth and synth[-1].startswith("  synth 12/12 samples"), proc.stdout
    assert any(line.startswith("synthesised") for line in lines)
    assert any(f"logging to {tmp_path / 'out'}/result_0.txt" in line for line in lines)


def test_the_run_summary_says_not_staged_never_zero_bandwidth():
    """The end-of-run table: a run that read in place, and a resumed multi-node run whose
    copies were all in place, say "not staged"; neither shows a bandwidth of 0.00 GB/s."""
    from mlhpc.progress import _staging_rows, _staging_text

    assert _staging_text({"staging": {}, "staging_s": None}) == "not staged (read in place)"
    resumed = {"staging": {"staged_files": 8}, "staging_s": 0.4, "staged_bytes": 8_000_000,
               "staging_in_run": False}
    resumed["staging"]["nodes_summary"] = {"nodes": 2, "aggregate_gb_per_s": 0.0,
                                           "node_staged_bytes": [4e6, 4e6], "node_gb_per_s": [0.0, 0.0]}
    rows = dict(_staging_rows(resumed))
    assert "not staged" in rows["staging per node (2 nodes)"]
    assert not any("0.00 GB/s" in v for v in rows.values())
    assert _staging_text(resumed) == "0.40 s (8.0 MB held)"
