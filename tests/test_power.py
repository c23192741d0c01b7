"""Power sampling and energy to train, without hardware: a fake powercap tree, a fake NVML, a
node meter command; the official result_summarizer and `mlhpc report` on the same folders."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from mlhpc import config as cfg
from mlhpc import power
from mlhpc.errors import ConfigError
from mlhpc.data.files import part_path
from mlhpc.power.sampler import Sampler, mllog_line
from mlhpc.power.sources import COUNTER, GAUGE, NodeMeter, SourceError, find_nvml, find_rapl
from mlhpc.report import ReportOptions, build_report, run_report
from mlhpc.report.cli import report_command
from mlhpc.log.parse import parse_log
from mlhpc.log.summary import official_start_stop
from mlhpc.runtime import Runtime

REPO = Path(__file__).resolve().parents[1]
EOS = "hpc_results_v3.0/NVIDIA"
EOS_SYSTEM = "eos_n64_ngc23.09_pytorch"


# ---- sources ---------------------------------------------------------------------------------------

def _zone(root: Path, name: str, kind: str, energy: int | None, max_uj: int = 1000) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(kind + "\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    if energy is None:
        (zone / "energy_uj").mkdir()  # unreadable as a number, even for root
    else:
        (zone / "energy_uj").write_text(f"{energy}\n")
    return zone


def test_rapl_packages_and_dram_counted_wraparound_unwrapped_unreadable_named(tmp_path):
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", 900)
    _zone(tmp_path, "intel-rapl:0:0", "core", 10)  # inside the package: not counted twice
    _zone(tmp_path, "intel-rapl:0:1", "dram", 5)
    _zone(tmp_path, "intel-rapl:1", "package-1", None)
    _zone(tmp_path, "intel-rapl:2", "psys", 7)  # overlaps everything: left out
    domains, problems = find_rapl(tmp_path)
    assert [d.name for d in domains] == ["rapl:0:package-0", "rapl:0:1:dram"]
    assert len(problems) == 1 and "intel-rapl:1 (package-1)" in problems[0] and "not counted" in problems[0]
    package = domains[0]
    (pkg / "energy_uj").write_text("950\n")
    assert package.read() == pytest.approx(50e-6)
    (pkg / "energy_uj").write_text("40\n")  # wrapped past max_energy_range_uj = 1000
    assert package.read() == pytest.approx((50 + 1000 - 950 + 40) * 1e-6)
    (pkg / "energy_uj").unlink()
    with pytest.raises(SourceError, match="energy_uj unreadable"):
        package.read()
    assert find_rapl(tmp_path / "absent") == ([], [])


class _NVMLError(Exception):
    pass


def _fake_nvml(energy_mj: dict[int, list[int]], power_mw: dict[int, int], fail_init: bool = False):
    module = types.ModuleType("pynvml")
    module.NVMLError = _NVMLError
    module.calls = []

    def init():
        if fail_init:
            raise _NVMLError("Driver Not Loaded")

    def energy(handle):
        if handle not in energy_mj:
            raise _NVMLError("Not Supported")
        return energy_mj[handle].pop(0)

    module.nvmlInit = init
    module.nvmlShutdown = lambda: module.calls.append("shutdown")
    module.nvmlDeviceGetCount = lambda: len(set(energy_mj) | set(power_mw))
    module.nvmlDeviceGetHandleByIndex = lambda index: index
    module.nvmlDeviceGetTotalEnergyConsumption = energy
    module.nvmlDeviceGetPowerUsage = lambda handle: power_mw[handle]
    return module


def test_fake_nvml_energy_counter_where_present_power_gauge_otherwise(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({0: [5_000, 5_000, 7_500]}, {1: 250_000}))
    devices, problems, nvml = find_nvml()
    assert problems == [] and [(d.name, d.kind) for d in devices] == [("gpu0", COUNTER), ("gpu1", GAUGE)]
    assert devices[0].read() == pytest.approx(0.0) and devices[0].read() == pytest.approx(2.5)  # J
    assert devices[1].read() == pytest.approx(250.0)  # W
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({}, {}, fail_init=True))
    assert find_nvml()[:2] == ([], ["NVML: Driver Not Loaded"])
    monkeypatch.setitem(sys.modules, "pynvml", None)  # not installed
    assert "nvidia-ml-py not installed" in find_nvml()[1][0]


def _meter(tmp_path: Path, body: str) -> str:
    script = tmp_path / "meter.py"
    script.write_text(body)
    return f"{sys.executable} {script}"


def test_node_meter_command_read_as_watts_and_bad_output_refused(tmp_path):
    assert NodeMeter(_meter(tmp_path, "print(' 412.5 ')")).read() == 412.5
    with pytest.raises(SourceError, match="expected one number of watts"):
        NodeMeter(_meter(tmp_path, "print('n/a')")).read()
    with pytest.raises(SourceError, match="exit 3"):
        NodeMeter(_meter(tmp_path, "import sys; print(1); sys.exit(3)")).read()
    with pytest.raises(SourceError):
        NodeMeter(str(tmp_path / "no-such-meter")).read()


def test_power_config_keys_validated_and_reach_the_run_config():
    conf = cfg.from_dict({"workload": "cosmoflow", "train": {"global_batch_size": 4, "max_epochs": 1},
                          "power": {"interval_s": 0.5, "node_meter_command": "ipmi-watts",
                                    "powercap_root": "/tmp/pc", "enabled": True}})
    assert conf.power.interval_s == 0.5 and conf.power.powercap_root == Path("/tmp/pc")
    for bad in ({"interval_s": 2.0}, {"interval_s": 0.0}, {"enabled": "yes"}, {"unknown": 1}):
        with pytest.raises(ConfigError, match="power"):
            cfg.from_dict({"workload": "cosmoflow", "train": {"global_batch_size": 4, "max_epochs": 1},
                           "power": bad})


# ---- the sampler -----------------------------------------------------------------------------------

class _Clock:
    def __init__(self, t0: float) -> None:
        self.t = t0

    def __call__(self) -> float:
        return self.t


class _RampCounter:
    """A counter whose power rises linearly, P(t) = p0 + a t: E(t) = p0 t + a t^2 / 2 (joules)."""

    name, kind = "ramp", COUNTER

    def __init__(self, clock: _Clock, p0: float, a: float) -> None:
        self.clock, self.t0, self.p0, self.a = clock, clock.t, p0, a

    def read(self) -> float:
        t = self.clock.t - self.t0
        return self.p0 * t + self.a * t * t / 2


def _result_log(path: Path, start_ms: int, stop_ms: int) -> None:
    path.write_text(
        mllog_line("run_start", None, start_ms, "INTERVAL_START", {})
        + mllog_line("epoch_start", None, start_ms, "INTERVAL_START", {"epoch_num": 1})
        + mllog_line("epoch_stop", None, stop_ms, "INTERVAL_END", {"epoch_num": 1})
        + mllog_line("run_stop", None, stop_ms, "INTERVAL_END", {"status": "success"}))


def test_counter_readings_give_the_closed_form_energy_in_report_and_official_integration(tmp_path):
    from mlperf_logging.compliance_checker.mlp_parser import parse_file
    from mlperf_logging.result_summarizer.result_summarizer import _compute_power_node

    clock = _Clock(1_700_000_000.0)
    p0, a, seconds = 300.0, 0.5, 120
    final = power.node_file(tmp_path, "result_0", 0)
    part = part_path(tmp_path / "power" / "node_0.txt")  # the project's temporary name, as the run gives it
    sampler = Sampler([_RampCounter(clock, p0, a)], 1.0, part, final, clock)
    start_ms = int(clock.t * 1e3)
    sampler.start()
    for step in range(seconds):
        clock.t += 1.0 if step % 3 else 0.7337  # uneven intervals: exact all the same
        sampler.read_once()
    assert sampler.stop() == final and not part.exists()
    stop_ms = int(clock.t * 1e3)
    elapsed = clock.t - 1_700_000_000.0  # the counter's own time; the log's ms window is the same span
    expected = p0 * elapsed + a * elapsed ** 2 / 2  # joules, closed form
    assert stop_ms == int(clock.t * 1e3) and abs((stop_ms - start_ms) / 1e3 - elapsed) < 1e-3
    _result_log(tmp_path / "result_0.txt", start_ms, stop_ms)

    run = build_report([tmp_path], compliance=False).folders[0].runs[0]
    assert run.power.energy_to_train_j == pytest.approx(expected, rel=1e-9)
    assert run.power.mean_power_w == pytest.approx(expected / ((stop_ms - start_ms) / 1e3), rel=1e-9)
    assert run.power.mean_epoch_energy_j == pytest.approx(expected, rel=1e-9)
    loglines, _ = parse_file(str(final), "3.0.0")
    official = _compute_power_node(loglines, stop_ms - start_ms)
    assert official == pytest.approx(run.power.energy_to_train_j, rel=1e-3)
    out = CliRunner().invoke(report_command, [str(tmp_path), "--format", "json", "--no-compliance"])
    data = json.loads(out.output)["folders"][0]["runs"][0]
    assert data["energy_to_train_j"] == pytest.approx(expected, rel=1e-9) and data["mean_power_w"] > p0


def _add_power(folder: Path, watts) -> None:  # type: ignore[no-untyped-def]
    """power/result_N/node_{0,1}.txt for every log of ``folder``: a reading each second over the
    log's own run_start .. run_stop."""
    for log in sorted(folder.glob("result_*.txt")):
        start, stop = official_start_stop(parse_log(log).events)
        for node in range(2):
            lines = [mllog_line("power_measurement_start", None, int(start), "INTERVAL_START", {})]
            t = start
            while t < stop:
                t = min(t + 1000, stop)
                lines.append(mllog_line("power_reading", watts(node, (t - start) / 1e3), int(t), "POINT_IN_TIME", {}))
            lines.append(mllog_line("power_measurement_stop", None, int(stop), "INTERVAL_END", {}))
            target = folder / "power" / log.stem / f"node_{node}.txt"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("".join(lines))


def _submission(mlperf_results: Path, root: Path) -> Path:
    """A copy of NVIDIA's v3.0 eos_n64 CosmoFlow submission (10 logs), with power files added."""
    source = mlperf_results / EOS
    (root / "systems").mkdir(parents=True)
    shutil.copy(source / "systems" / f"{EOS_SYSTEM}.json", root / "systems")
    folder = root / "results" / EOS_SYSTEM / "strong" / "cosmoflow"
    shutil.copytree(source / "results" / EOS_SYSTEM / "strong" / "cosmoflow", folder)
    _add_power(folder, lambda node, t: 3000.0 + 250.0 * node + 7.0 * t)
    return folder


def test_official_result_summarizer_and_report_agree_on_energy(mlperf_results, tmp_path):
    ours = _submission(mlperf_results, tmp_path / "ours" / "NVIDIA")
    theirs = _submission(mlperf_results, tmp_path / "theirs" / "NVIDIA")  # it writes scaling.json there
    report = run_report([ours], ReportOptions(fmt="json", price_per_node_hour=2.0, price_per_kwh=0.3))
    folder = report.report.folders[0]
    summary = tmp_path / "summary.csv"
    proc = subprocess.run([sys.executable, "-m", "mlperf_logging.result_summarizer", str(theirs.parents[3]), "hpc",
                           "3.0.0", "--csv", str(summary)], capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(csv.DictReader((tmp_path / "summary_detailed.csv").open()))
    official_j = float(row["cosmoflow:Energy"])  # scored before its RCP check writes scaling.json
    assert folder.energy_olympic_j == pytest.approx(official_j, rel=1e-3)
    assert folder.energy_olympic_j == pytest.approx(official_j, rel=1e-9)  # the same arithmetic
    assert all(r.power.energy_to_train_j and r.power.mean_power_w == pytest.approx(
        r.power.energy_to_train_j / r.facts.timing.time_to_train_s) for r in folder.runs)
    data = json.loads(report.output)
    assert data["folders"][0]["energy_olympic_j"] == pytest.approx(official_j, rel=1e-9)
    assert data["folders"][0]["runs"][0]["energy_to_train_j"] > 0 and data["price_per_kwh"] == 0.3


def test_published_round_without_power_shows_dash_and_claims_no_energy(mlperf_results):
    folder = mlperf_results / EOS / "results" / EOS_SYSTEM / "strong" / "cosmoflow"
    outcome = run_report([folder], ReportOptions(fmt="markdown", compliance=False))
    assert outcome.report.folders[0].energy_olympic_j is None
    energy_view = outcome.output.split("Energy to train")[1]
    assert "| - |" in energy_view and "0.000" not in energy_view
    runs = json.loads(run_report([folder], ReportOptions(fmt="json", compliance=False)).output)
    assert all(r["energy_to_train_j"] is None and r["mean_power_w"] is None for r in runs["folders"][0]["runs"])


def test_cost_to_train_from_prices_and_bad_price_refused(tmp_path):
    clock = _Clock(1_700_000_000.0)
    sampler = Sampler([_RampCounter(clock, 1000.0, 0.0)], 1.0, tmp_path / "power" / ".p",
                      power.node_file(tmp_path, "result_0", 0), clock)
    sampler.start()
    clock.t += 3600.0
    sampler.stop()
    _result_log(tmp_path / "result_0.txt", 1_700_000_000_000, 1_700_003_600_000)
    out = run_report([tmp_path], ReportOptions(fmt="csv", compliance=False, level="runs",
                                               price_per_kwh=0.25))
    row = next(csv.DictReader(out.output.splitlines()))
    assert float(row["energy_to_train_j"]) == pytest.approx(3.6e6) and float(row["cost_to_train"]) == pytest.approx(0.25)
    text = run_report([tmp_path], ReportOptions(level="runs", compliance=False, price_per_kwh=0.25))
    from mlhpc.report.render import to_text
    assert "energy kWh" in to_text(text.report, "runs") and "mean power W" in to_text(text.report, "runs")
    result = CliRunner().invoke(report_command, [str(tmp_path), "--price-per-kwh", "nan"])
    assert result.exit_code == 2 and "expected a finite price" in result.output


# ---- the run hook: start, stop, error, signal --------------------------------------------------------

def test_no_counter_says_so_once_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)
    said: list[str] = []
    conf = power.PowerConfig(powercap_root=tmp_path / "no-powercap")
    with power.sampling(conf, Runtime(), tmp_path / "result_0.txt", tmp_path, notify=said.append) as sampler:
        assert sampler is None
    assert len(said) == 1 and "no power counter" in said[0] and "no energy" in said[0]
    assert not (tmp_path / "power").exists()
    with power.sampling(power.PowerConfig(enabled=False), Runtime(), tmp_path / "result_0.txt", tmp_path,
                        notify=said.append) as sampler:
        assert sampler is None and len(said) == 1


def test_sampling_stops_cleanly_when_the_block_ends_or_raises(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml({0: [0] + [1000 * i for i in range(1, 10_000)]}, {}))
    conf = power.PowerConfig(interval_s=0.05, powercap_root=tmp_path / "none")
    with pytest.raises(RuntimeError, match="boom"):
        with power.sampling(conf, Runtime(), tmp_path / "result_0.txt", tmp_path) as sampler:
            time.sleep(0.3)
            raise RuntimeError("boom")
    assert not sampler._thread.is_alive() and sampler.readings >= 3
    node = power.node_file(tmp_path, "result_0", 0)
    keys = [e.key for e in parse_log(node).events]
    assert keys[0] == "power_measurement_start" and keys[-1] == "power_measurement_stop"
    assert sys.modules["pynvml"].calls == ["shutdown"]
    assert [p.name for p in (tmp_path / "power").iterdir()] == ["result_0"]  # no temporary file left
    with power.sampling(conf, Runtime(), tmp_path / "result_0.txt", tmp_path, notify=print) as again:
        assert again is None  # never over an existing node file


_CHILD = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    from mlhpc import power
    from mlhpc.runtime import Runtime
    out, meter = Path(sys.argv[1]), sys.argv[2]
    def stop(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, stop)
    conf = power.PowerConfig(interval_s=0.05, node_meter_command=meter)
    with power.sampling(conf, Runtime(), out / "result_0.txt", out):
        (out / "started").write_text("1")
        while True:
            time.sleep(0.01)
""")


def _start_child(tmp_path: Path) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    meter = _meter(tmp_path, "print(250)")
    child = subprocess.Popen([sys.executable, str(script), str(tmp_path), meter], cwd=REPO)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert child.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    return child


def test_sigterm_publishes_a_complete_file_and_sigkill_leaves_none(tmp_path):
    child = _start_child(tmp_path)
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 128 + signal.SIGTERM
    events = parse_log(power.node_file(tmp_path, "result_0", 0)).events
    assert events[-1].key == "power_measurement_stop" and all(
        e.value == 250.0 for e in events if e.key == "power_reading")
    killed = tmp_path / "killed"
    killed.mkdir()
    child = _start_child(killed)
    child.kill()
    child.wait(timeout=60)
    assert not (killed / "power" / "result_0").exists()  # nothing claims to be complete
    assert [p.name for p in (killed / "power").iterdir() if p.name.endswith(".mlhpc-part")]


def test_prices_from_the_system_description_the_command_line_wins_bad_ones_refused(mlperf_results, tmp_path):
    folder = _submission(mlperf_results, tmp_path / "sub" / "NVIDIA")
    desc_file = folder.parents[3] / "systems" / f"{EOS_SYSTEM}.json"
    desc = json.loads(desc_file.read_text())
    desc_file.write_text(json.dumps({**desc, "price_per_node_hour": "2.5", "price_per_kwh": 0.3}))

    def folder_json(**prices):  # type: ignore[no-untyped-def]
        data = json.loads(run_report([folder], ReportOptions(fmt="json", compliance=False, **prices)).output)
        table = run_report([folder], ReportOptions(fmt="csv", level="folders", compliance=False, **prices))
        row = {k: float(v) for k, v in next(csv.DictReader(table.output.splitlines())).items()
               if k in ("cost_to_train", "olympic_min", "energy_olympic_j")}
        return data, row

    data, row = folder_json()
    nodes = int(desc["number_of_nodes"])
    assert (data["price_per_node_hour"], data["price_per_kwh"]) == (2.5, 0.3)
    assert row["energy_olympic_j"] > 0 and row["cost_to_train"] == pytest.approx(
        nodes * row["olympic_min"] / 60 * 2.5 + row["energy_olympic_j"] / 3.6e6 * 0.3, rel=1e-12)
    data, row = folder_json(price_per_kwh=0.1)  # the command line wins, price by price
    assert (data["price_per_node_hour"], data["price_per_kwh"]) == (2.5, 0.1)
    assert row["cost_to_train"] == pytest.approx(
        nodes * row["olympic_min"] / 60 * 2.5 + row["energy_olympic_j"] / 3.6e6 * 0.1, rel=1e-12)
    desc_file.write_text(json.dumps({**desc, "price_per_kwh": "cheap"}))
    result = CliRunner().invoke(report_command, [str(folder), "--no-compliance", "--format", "json"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert f"{EOS_SYSTEM}.json" in result.output and "price_per_kwh 'cheap'" in result.output
    assert CliRunner().invoke(report_command, [str(folder), "--no-compliance", "--format", "json",
                                               "--price-per-kwh", "0.2"]).exit_code == 0
    other = _submission(mlperf_results, tmp_path / "other" / "NVIDIA")
    other_desc = other.parents[3] / "systems" / f"{EOS_SYSTEM}.json"
    other_desc.write_text(json.dumps({**desc, "price_per_kwh": 0.4}))
    desc_file.write_text(json.dumps({**desc, "price_per_kwh": 0.3}))
    result = CliRunner().invoke(report_command, [str(folder), str(other), "--no-compliance"])
    assert result.exit_code == 2 and "gives 0.3" in result.output and "gives 0.4" in result.output


def test_run_help_says_what_is_measured_and_names_real_power_keys():
    import re

    from mlhpc.cli import main

    text = " ".join(CliRunner().invoke(main, ["run", "--help"]).output.split())
    assert "NVML" in text and "RAPL" in text and "docs/power.md" in text and "switches" in text
    keys = set(re.findall(r"(?<![/\w])power\.([a-z_]+)", text))  # not docs/power.md
    assert {"interval_s", "node_meter_command", "powercap_root", "enabled"} <= keys
    assert keys <= set(power.PowerConfig.model_fields)
