"""`mlhpc results compare` compares like with like on the published rounds: one scaling mode,
MLCommons' own score (equal to the official scores in the archive's expected_scores.csv), says
what it compared, never mixes strong and weak runs, and a selection that matches nothing is an
error (exit status 2)."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from mlhpc.store import open_store
from mlhpc.store.api import compare_selections
from mlhpc.store.cli import results_group
from mlhpc.store.ingest import ingest_paths

PERLMUTTER = "benchmark=deepcam,system=perlmutter_512x4"
EOS = "benchmark=deepcam,system=eos_n256_ngc23.09_pytorch"
PERLMUTTER_WEAK = "benchmark=deepcam,system=perlmutter_10x128x4_ngc21.09_pytorch"
FOLDERS = ("HPE+LBNL/results/perlmutter_512x4/strong/deepcam",
           "NVIDIA/results/eos_n256_ngc23.09_pytorch/strong/deepcam",
           "NVIDIA/results/eos_n256_ngc23.09_pytorch/weak/deepcam",
           "HPE+LBNL/results/perlmutter_10x128x4_ngc21.09_pytorch/weak/deepcam")


@pytest.fixture(scope="module")
def store_url(tmp_path_factory, mlperf_results) -> str:
    """A store holding the v3.0 deepcam folders of the two systems (133 eos logs: 5 strong, 128
    weak) and one more weak-scaling system."""
    url = f"sqlite:///{tmp_path_factory.mktemp('compare') / 'results.db'}"
    result = ingest_paths(open_store(url), [mlperf_results / "hpc_results_v3.0" / f for f in FOLDERS])
    assert result.refused == [] and len(result.added) == 5 + 5 + 128 + 10
    return url


@pytest.fixture(scope="module")
def official(mlperf_results) -> dict[tuple[str, str], dict[str, str]]:
    """MLCommons' scores of the v3.0 deepcam folders, keyed (system, scaling)."""
    with open(mlperf_results / "expected_scores.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["round"] == "hpc_results_v3.0" and r["benchmark"] == "deepcam"]
    return {(r["system"], r["mode"]): r for r in rows}


def invoke(*args: str):
    return CliRunner().invoke(results_group, list(args), catch_exceptions=False)


def test_eos_is_faster_than_perlmutter_in_strong_scaling(store_url, official):
    result = compare_selections(open_store(store_url), PERLMUTTER, EOS)
    assert result.a.scaling == result.b.scaling == "strong"
    assert (result.a.n, result.b.n) == (5, 5) and (result.a.left_out, result.b.left_out) == (0, 128)
    assert result.verdict == "faster"
    assert result.a.score == pytest.approx(float(official[("perlmutter_512x4", "strong")]["olympic_min"]), rel=1e-9)
    assert result.b.score == pytest.approx(float(official[("eos_n256_ngc23.09_pytorch", "strong")]["olympic_min"]),
                                           rel=1e-9)
    out = invoke("compare", "--store", store_url, PERLMUTTER, EOS)
    assert out.exit_code == 0, out.output
    assert out.output.startswith("compared: strong scaling; score: olympic mean of the times to train (min)")
    assert "olympic mean 1.811 min" in out.output and "olympic mean 0.8302 min" in out.output
    assert "128 weak-scaling run(s) left out (add scaling=weak to compare them)" in out.output
    assert "verdict: B is faster than A beyond run-to-run noise" in out.output
    assert "slower" not in out.output


def test_weak_scaling_compared_by_throughput(store_url, official):
    result = compare_selections(open_store(store_url), PERLMUTTER_WEAK, EOS + ",scaling=weak")
    assert result.a.scaling == "weak" and result.b.n == 128 and result.b.left_out == 0  # scaling=weak selected it
    assert result.a.score == pytest.approx(
        float(official[("perlmutter_10x128x4_ngc21.09_pytorch", "weak")]["models_per_min"]), rel=1e-9)
    assert result.b.score == pytest.approx(float(official[("eos_n256_ngc23.09_pytorch", "weak")]["models_per_min"]),
                                           rel=1e-9)
    assert result.verdict == "faster"
    out = invoke("compare", "--store", store_url, "--format", "json", PERLMUTTER_WEAK, EOS + ",scaling=weak")
    data = json.loads(out.output)
    assert data["scaling"] == "weak" and data["score_unit"] == "models/min" and data["verdict"] == "faster"
    text = invoke("compare", "--store", store_url, PERLMUTTER_WEAK, EOS + ",scaling=weak").output
    assert text.startswith("compared: weak scaling; score: throughput (models/min")
    assert "no run-to-run noise to test" in text


def test_strong_and_weak_are_never_mixed(store_url):
    out = invoke("compare", "--store", store_url, PERLMUTTER, EOS + ",scaling=weak")
    assert out.exit_code == 2
    assert "strong and weak scaling scores are not compared" in out.output


@pytest.mark.parametrize("selection", ["no-such-campaign", "benchmark=deepcam,system=nowhere",
                                       "benchmark=deepcam,scaling=sideways"])
def test_a_selection_matching_nothing_is_exit_2(store_url, selection):
    out = invoke("compare", "--store", store_url, PERLMUTTER, selection)
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mlhpc: error: selection") and selection in lines[0]


def test_list_filters_by_scaling(store_url):
    weak = json.loads(invoke("list", "--store", store_url, "--scaling", "weak", "--format", "json").output)
    strong = json.loads(invoke("list", "--store", store_url, "--scaling", "strong", "--format", "json").output)
    assert (len(weak), len(strong)) == (138, 10)
