"""``mlhpc data synth`` shared by the ranks of a job: each rank writes a disjoint share of one
data set, the bytes do not depend on the number of ranks, an interrupted job run again writes
only what is missing, and bad input is one line with exit status 2."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import tree_bytes
from test_distributed import BIN, free_port

from mlhpc.data.synthjob import scaled
from mlhpc.data.synthteam import SynthTeam, cpu_share
from mlhpc.errors import ConfigError
from mlhpc.workload import get

COSMO = ["--set", "synth.cube_size=16", "--set", "synth.train_samples=12", "--set", "synth.eval_samples=4"]
DEEPCAM = ["--set", "synth.height=32", "--set", "synth.width=48", "--set", "synth.train_samples=6",
           "--set", "synth.validation_samples=3"]
OC20 = ["--set", "synth.train_samples=6", "--set", "synth.validation_samples=3", "--set",
        "synth.files_per_split=3", "--set", "synth.metals=[Cu]", "--set", "synth.adsorbates=[O]",
        "--set", "synth.facets=['111']"]
OPENFOLD = ["--set", "synth.train_chains=6", "--set", "synth.validation_chains=3"]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def synth(workload: str, out: Path, *args: str, ranks: int = 1, **kw) -> subprocess.CompletedProcess:
    cmd = [str(BIN / "mlhpc"), "data", "synth", workload, "--out", str(out), *args]
    if ranks > 1:
        cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks), "--no-python", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=_env(), **kw)


def test_shares_are_disjoint_and_whole():
    plan = list(range(23))
    for ranks in (1, 2, 3, 7, 30):
        shares = [SynthTeam(rank=r, ranks=ranks).share(plan) for r in range(ranks)]
        assert sorted(t for share in shares for t in share) == plan
        assert max(map(len, shares)) - min(map(len, shares)) <= 1


def test_a_rank_takes_its_share_of_the_node(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    assert cpu_share(2) == 4 and cpu_share(16) == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})  # bound by srun
    assert cpu_share(2) == 3


def test_a_fraction_scales_the_sample_counts_only():
    cosmo = get("cosmoflow")
    synth_cfg = cosmo.synth_config(cube_size=128, train_samples=524_288, eval_samples=65_536)
    part = scaled(cosmo, synth_cfg, 0.001)
    assert (part.train_samples, part.eval_samples, part.cube_size) == (524, 65, 128)
    assert scaled(cosmo, synth_cfg, 1e-9).eval_samples == 1  # at least one of each
    assert scaled(cosmo, synth_cfg, 0.29).train_samples == 152_043  # not 152_043.5 rounded up
    for bad in (0.0, -0.5, 1.5, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="--fraction"):
            scaled(cosmo, synth_cfg, bad)


@pytest.mark.parametrize("args, says", [
    (["--fraction", "0"], "--fraction 0.0: expected a fraction F with 0 < F <= 1"),
    (["--fraction", "1.5"], "--fraction 1.5: expected a fraction F with 0 < F <= 1"),
    (["--workers", "0"], "--workers 0: expected 1 or more synthesis processes per rank"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, says):
    proc = synth("cosmoflow", tmp_path / "d", *COSMO, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"mlhpc: error: {says}"), proc.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("workload, size", [("cosmoflow", 16_777_216 + 32), ("deepcam", 768 * 1152 * 17 * 4)])
def test_a_fraction_of_the_reference_config_is_reference_sized(tmp_path, repo, workload, size):
    """The reference configs' synth sections hold the reference sample sizes and counts: a
    fraction of them writes reference-sized samples (CosmoFlow 128^3 x 4 int16 and its two
    4-vectors, DeepCAM 768 x 1152 x 16 float32 and int32 labels)."""
    proc = synth(workload, tmp_path / "d", "--config", str(repo / "configs" / f"{workload}.yaml"),
                 "--fraction", "0.00001", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    files = sorted((tmp_path / "d" / "train").iterdir())
    assert len(files) == 5 if workload == "cosmoflow" else len(files) == 1  # 524,288 and 121,266 x 1e-5
    assert all(size < f.stat().st_size < size + 16_384 for f in files)


def test_one_process_says_its_rate(tmp_path):
    proc = synth("cosmoflow", tmp_path / "d", *COSMO, "--fraction", "0.5", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    done = [line for line in proc.stderr.splitlines() if line.startswith("synthesised ")]
    assert len(done) == 1 and done[0].endswith("/s in all"), proc.stderr
    # 6 + 2 samples of the --set counts, and synth.json
    assert sorted(p.name for p in (tmp_path / "d" / "train").iterdir()) == [f"univ_{i:06d}.h5" for i in range(6)]
    assert len(list((tmp_path / "d" / "validation").iterdir())) == 2


@pytest.mark.cluster
@pytest.mark.parametrize("workload, args", [("cosmoflow", COSMO), ("deepcam", DEEPCAM),
                                            ("oc20", OC20), ("openfold", OPENFOLD)])
def test_two_ranks_write_the_bytes_of_one(tmp_path, workload, args):
    one = synth(workload, tmp_path / "one", *args, "--workers", "1")
    assert one.returncode == 0, one.stderr
    two = synth(workload, tmp_path / "two", *args, "--workers", "1", ranks=2)
    assert two.returncode == 0, two.stderr[-3000:]
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")
    assert any(line.startswith("  per rank: rank ") for line in two.stderr.splitlines()), two.stderr[-2000:]
    assert sum("wrote " in line for line in two.stdout.splitlines()) == 1  # rank 0 alone says it
    check = subprocess.run([str(BIN / "mlhpc"), "data", "check", workload, str(tmp_path / "two")],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.cluster
def test_a_killed_job_run_again_writes_only_what_is_missing(tmp_path):
    args = ["--set", "synth.cube_size=32", "--set", "synth.train_samples=48", "--set",
            "synth.eval_samples=8", "--workers", "1"]
    out, hidden = tmp_path / "two", tmp_path / ".two.mlhpc-synth"
    cmd = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "--no-python",
           str(BIN / "mlhpc"), "data", "synth", "cosmoflow", "--out", str(out), *args]
    job = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while len(list(hidden.glob("train/univ_*.h5"))) < 6 and time.monotonic() < deadline:
        time.sleep(0.2)
    os.killpg(job.pid, signal.SIGKILL)  # every rank and the agent, midway
    job.wait()
    assert not out.exists()
    before = {p.relative_to(hidden): (p.stat().st_ino, p.stat().st_mtime_ns)
              for p in hidden.glob("*/univ_*.h5")}
    assert 6 <= len(before) < 56
    again = synth("cosmoflow", out, *args, ranks=2)
    assert again.returncode == 0, again.stderr[-3000:]
    for rel, stamp in before.items():  # kept, not written again
        assert ((out / rel).stat().st_ino, (out / rel).stat().st_mtime_ns) == stamp
    one = synth("cosmoflow", tmp_path / "one", *args)
    assert one.returncode == 0, one.stderr
    assert tree_bytes(tmp_path / "one") == tree_bytes(out)


def test_the_reference_config_reads_a_fraction_it_could_not_have_synthesised(tmp_path, repo):
    """A config that may not synthesise (the reference one) uses a complete synthesised folder as
    it is; one that may (a mini) still refuses data synthesised with other settings."""
    from mlhpc import config as cfg
    from mlhpc.data import ready
    from mlhpc.errors import DataError
    from mlhpc.runtime import Runtime

    data = tmp_path / "d"
    proc = synth("cosmoflow", data, "--config", str(repo / "configs" / "cosmoflow.yaml"), "--fraction", "0.00001",
                 "--set", "synth.cube_size=16", "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    reference = cfg.load(repo / "configs" / "cosmoflow.yaml", overrides=(f"data.path={data}",))
    assert ready.ensure_data(reference, get("cosmoflow"), Runtime()) == 0.0
    mini = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", overrides=(f"data.path={data}",))
    with pytest.raises(DataError, match="data were synthesised with"):
        ready.ensure_data(mini, get("cosmoflow"), Runtime())


def test_a_data_set_whose_parent_folders_are_missing_is_made_with_them(tmp_path):
    """``data.path`` under folders that do not exist yet (a fresh working folder): they are made,
    as before the ranks shared the synthesis."""
    proc = synth("cosmoflow", tmp_path / "work" / "deeper" / "data", *COSMO, "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "work" / "deeper" / "data" / "train").is_dir()


def test_a_peer_that_ended_is_one_line_not_a_traceback(monkeypatch):
    from mlhpc import runtime
    from mlhpc.errors import DataError

    def closed(value):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1")

    monkeypatch.setattr(runtime, "all_gather", closed)
    with pytest.raises(DataError) as err:
        SynthTeam(rank=0, ranks=2).gather(["a"])
    message = str(err.value)
    assert "\n" not in message and message.startswith("rank 0: another rank of this synthesis ended")
    assert "Connection closed by peer" in message and "run the same command again" in message
    assert SynthTeam().everyone(3) == [3]  # one process: nothing gathered, nothing to lose


@pytest.mark.cluster
def test_when_a_rank_is_killed_the_others_say_so_in_one_line(tmp_path):
    """Two ranks started by hand, as srun without --kill-on-bad-exit leaves them: one is killed
    midway; the other reaches the end of its share, finds its peer gone, and says so in one line."""
    args = ["--set", "synth.cube_size=32", "--set", "synth.train_samples=24", "--set",
            "synth.eval_samples=4", "--workers", "1"]
    hidden = tmp_path / ".d.mlhpc-synth"
    env = {**_env(), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    cmd = [str(BIN / "mlhpc"), "data", "synth", "cosmoflow", "--out", str(tmp_path / "d"), *args]
    ranks = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    deadline = time.monotonic() + 300
    while not list(hidden.glob("train/univ_*.h5")) and time.monotonic() < deadline:
        time.sleep(0.1)
    ranks[1].kill()
    out, err = ranks[0].communicate(timeout=300)
    ranks[1].wait()
    assert ranks[0].returncode == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = [line for line in err.splitlines() if line.startswith("mlhpc: error:")]
    assert len(said) == 1 and "another rank of this synthesis ended" in said[0], err[-3000:]
    assert not (tmp_path / "d").exists() and list(hidden.glob("train/univ_*.h5"))
