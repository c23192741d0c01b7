"""Fuzzing the MLLOG parser and the run summary with truncated, reordered and garbled logs:
nothing but LogFormatError may escape, and every malformed line is reported with its file and
line number."""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlhpc.report.compliance import check_run
from mlhpc.log.parse import TOKEN, parse_text
from mlhpc.log.summary import summarize_run
from mlhpc.report.score import score_folder

SAMPLE = (Path(__file__).parent / "data" / "report" / "cosmoflow-mini-runs" / "result_0.txt").read_text()
LINES = SAMPLE.splitlines()
NAME = "fuzz/result_0.txt"


def _mutate(line: str, kind: int, cut: int, junk: str) -> str:
    if kind == 0:
        return line[: cut % (len(line) + 1)]  # truncated
    if kind == 1:
        at = cut % (len(line) + 1)
        return line[:at] + junk + line[at:]  # garbled
    if kind == 2:
        return f"{cut % 64:3d}: " + line  # rank prefix
    if kind == 3:
        return junk  # program output (or anything)
    return line


mutation = st.tuples(st.integers(0, 4), st.integers(0, 10_000), st.text(max_size=12))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.permutations(range(len(LINES))), keep=st.integers(1, len(LINES)),
       mutations=st.lists(mutation, min_size=len(LINES), max_size=len(LINES)),
       newline=st.sampled_from(["\n", "\r\n", "\r"]))
def test_parser_survives_truncated_reordered_garbled_logs(order, keep, mutations, newline):
    lines = [_mutate(LINES[i], *mutations[i]) for i in order[:keep]]
    text = newline.join(lines)
    parsed = parse_text(text, NAME)
    physical = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    for bad in parsed.malformed:
        assert bad.message.startswith(f"{NAME}:{bad.lineno}: ") and bad.reason
        assert TOKEN in physical[bad.lineno - 1]
    for event in parsed.events:
        assert TOKEN in physical[event.lineno - 1]
    assert parsed.n_records == sum(TOKEN in line for line in physical)
    run = summarize_run(parsed)
    assert run.timing.status in ("success", "aborted", "incomplete")
    assert len(run.malformed) == len(parsed.malformed)
    verdict = check_run(parsed, "3.0.0")
    assert isinstance(verdict.ok, bool)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=400))
def test_arbitrary_text_never_raises(text):
    parsed = parse_text(TOKEN + text + "\n" + text, NAME)
    summarize_run(parsed)
    for bad in parsed.malformed:
        assert bad.message.startswith(f"{NAME}:{bad.lineno}: ")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=300), cut=st.integers(0, len(SAMPLE)))
def test_folder_scoring_of_broken_files_never_raises(tmp_path_factory, data, cut):
    folder = tmp_path_factory.mktemp("runs")
    (folder / "result_0.txt").write_bytes(SAMPLE[:cut].encode() + data)
    (folder / "result_1.txt").write_bytes(data)
    result = score_folder(folder, sorted(folder.glob("result_*.txt")))
    assert len(result.runs) == 2 and result.olympic_min is None
