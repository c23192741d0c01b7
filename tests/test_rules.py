"""MLPerf HPC's rules as data (`mlhpc.rules`): one table per ruleset version, read by the run and
the report, each figure checked against mlperf_logging, the authority; and every bundled
workload's metric and target equal to mlperf_logging's rule files."""

from __future__ import annotations

import pytest

from mlhpc import rules
from mlhpc.log.mlperf_adapter import result_file_counts
from mlhpc.log.mlperf_adapter import quality_target
from mlhpc.workload import get

BUNDLED = ("cosmoflow", "deepcam", "oc20", "openfold")


def _allowed_benchmarks(version: str) -> list[str]:
    from mlperf_logging import benchmark_meta

    return benchmark_meta.get_allowed_benchmarks("hpc", version.rsplit(".", 1)[0])


@pytest.mark.parametrize("version", sorted(rules.RULESETS))
def test_each_ruleset_lists_the_rounds_benchmarks_and_runs_as_mlperf_logging_does(version):
    table = rules.RULESETS[version]
    assert table.version == version
    assert sorted(table.runs) == sorted(_allowed_benchmarks(version))
    counts = result_file_counts("hpc")
    assert {b: counts[b] for b in table.runs} == dict(table.runs)
    assert table.max_dropped == 1  # result_summarizer's hpc olympic mean
    assert table.sample_counted_epochs <= set(table.runs)


def test_staging_is_timed_before_v3_and_not_from_v3():
    assert [rules.staging_timed(v) for v in ("0.7.0", "1.0.0", "2.0.0", "3.0.0")] == [True] * 3 + [False]
    assert rules.ruleset("3.0.1").version == "3.0.0" and rules.ruleset(None).version == rules.CURRENT
    with pytest.raises(ValueError):
        rules.ruleset("0.5.0")


def test_the_report_scores_with_the_table_of_its_round():
    assert rules.of_round(None, "v0.7").version == "0.7.0"
    assert "oc20" not in rules.of_round(None, "v0.7").runs  # not a benchmark of v0.7
    assert rules.of_round("3.0.0", "v0.7").runs["openfold"] == 10  # the ruleset wins
    assert rules.of_round(None, None).version == rules.CURRENT


@pytest.mark.parametrize("name", BUNDLED)
def test_each_workloads_metric_and_target_are_the_rules(name):
    workload = get(name)
    key, target, direction = quality_target(workload.name, rules.CURRENT)
    assert (workload.metric.key, workload.metric.target, workload.metric.direction) == \
        (key, pytest.approx(target), direction)
