"""The report's energy note never contradicts its table, and the run's no-counter warning names
every source it looked for (NVML, RAPL and the node meter)."""

from __future__ import annotations

import sys

from test_report_people import _power_files, _run_log

from mlhpc import power
from mlhpc.report import build_report
from mlhpc.report.render import to_text
from mlhpc.runtime import Runtime


def test_a_measured_run_that_does_not_count_gives_no_no_counter_note(tmp_path):
    """A run measured at the node (table: its energy) dropped from the score by the compliance
    checker: the note says energy was measured but not scored, never "no power counter"."""
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "result_0.txt").write_text(_run_log("cosmoflow", 90.0))
    _power_files(folder, [100.0, 300.0])
    report = build_report([folder], compliance=True)
    result = report.folders[0]
    assert result.dropped and result.runs[0].power.energy_to_train_j is not None  # measured, not counted
    text = to_text(report, "runs")
    assert "36.000" in text  # 90 s x 400 W = 36 kJ in the table
    assert "no power counter" not in text and "energy not measured" not in text
    assert "energy: measured for 1 run(s) that the score does not count" in text


def test_no_counter_warning_names_nvml_rapl_and_the_node_meter(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing
    said: list[str] = []
    conf = power.PowerConfig(powercap_root=tmp_path / "no-powercap")
    with power.sampling(conf, Runtime(), tmp_path / "result_0.txt", tmp_path, notify=said.append):
        pass
    assert len(said) == 1
    line = said[0]
    assert "NVML: nvidia-ml-py not installed" in line
    assert f"RAPL: no readable package or DRAM zone under {tmp_path / 'no-powercap'}" in line
    assert "node meter: none configured (power.node_meter_command)" in line


def test_no_counter_with_a_failing_node_meter_names_it(tmp_path):
    said: list[str] = []
    conf = power.PowerConfig(node_meter_command=str(tmp_path / "no-such-meter"))
    with power.sampling(conf, Runtime(), tmp_path / "result_0.txt", tmp_path, notify=said.append):
        pass
    assert len(said) == 1 and "node meter:" in said[0] and "no power counter" in said[0]
