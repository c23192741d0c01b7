"""The harness parts of benchmarks/gpu.py: `mlhpc run` of each mini config end to end on the
device, checked by MLCommons' compliance checker, the process group, and the side-by-side
comparisons that apply on a GPU (harness against a bare loop, DimeNet++ against torch-geometric's,
and whether each loader keeps the step fed).

`mlhpc run` is run as a user runs it (``python -m mlhpc run CONFIG --set ...``, a subprocess with
a timeout): the device is the config's ``train.device: auto`` (CUDA where visible), bf16 autocast
is ``train.amp: true``, batches arrive through the run's `DeviceLoader`, and power is sampled
where a counter is found (NVML on a GPU): the energy to train is read back from the run's power
log by `mlhpc.report.energy.run_energy`, as ``mlhpc report`` reads it. Each run is bounded by a
small embedded dataset, one epoch (OpenFold: one epoch of a few optimizer steps), and a target
any first evaluation reaches, so that it ends with status success; its exit status, summary and
the official checker's verdict on its log are the figures. The checker holds a log to the
reference target, which a bounded run does not reach: a verdict whose only failed check is the
metric's target is said so (``only_target``) and counts as passed here; any other failed check
fails the run.

A run of one process starts no process group (`mlhpc.runtime.Runtime.distributed` is
``world_size > 1``), so the process group is checked apart (`process_group_check`): the
backend `mlhpc.runtime.init_process_group` picks for the device (NCCL on CUDA, Gloo on a CPU),
at world size 1, one all-reduce checked.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from mlhpc.data.inputs import read_text_input  # noqa: E402

#: A mini run each, bounded (``--set`` pairs): the embedded data made small, one epoch, a
#: target the first evaluation reaches (eval_error below 10, accuracy at least 0).
MINI: dict[str, tuple[str, tuple[str, ...]]] = {
    "cosmoflow": ("configs/cosmoflow-mini.yaml", (
        "synth.train_samples=512", "synth.eval_samples=128", "synth.samples_per_file=128",
        "train.target=10.0")),
    "deepcam": ("configs/deepcam-mini.yaml", (
        "synth.train_samples=64", "synth.validation_samples=16", "train.target=0.0")),
    "oc20": ("configs/opencatalyst-mini.yaml", (
        "synth.train_samples=64", "synth.validation_samples=16", "synth.files_per_split=2",
        "train.target=10.0")),
    "openfold": ("configs/openfold-mini.yaml", (  # fewer chains than its checkpoint was trained on
        "synth.train_chains=16", "synth.validation_chains=4", "synth.msa_depth=16",
        "train.eval_every_steps=4", "train.target=0.0", "model.init_checkpoint=null")),
}
#: ``--tiny``: the same runs made smaller still (the tests' tiny settings), seconds on a CPU.
TINY: dict[str, tuple[str, ...]] = {
    "cosmoflow": ("synth.cube_size=16", "synth.train_samples=32", "synth.eval_samples=16",
                  "synth.samples_per_file=16", "model.input_size=16", "model.conv_channels=4",
                  "model.n_conv_layers=3", "train.global_batch_size=8", "train.target=10.0"),
    "deepcam": ("synth.height=32", "synth.width=48", "synth.train_samples=8",
                "synth.validation_samples=4", "model.entry_channels=[4,4,8,8,8]",
                "model.middle_blocks=1", "model.exit_channels=[8,8,8,8]", "model.aspp_channels=8",
                "model.low_level_channels=4", "model.decoder_channels=8",
                "train.global_batch_size=4", "train.target=0.0"),
    "oc20": ("synth.train_samples=16", "synth.validation_samples=8", "synth.files_per_split=2",
             "model.hidden_channels=16", "model.out_emb_channels=16", "model.int_emb_size=8",
             # few bases: torch-geometric's DimeNet++ derives its basis with sympy when built,
             # 15 s of CPU at the mini's 7 x 6
             "model.num_spherical=3", "model.num_radial=2",
             "train.global_batch_size=8", "train.target=10.0"),
    "openfold": ("synth.train_chains=6", "synth.validation_chains=3", "synth.msa_depth=12",
                 "synth.workers=1", "train.eval_every_steps=3", "model.evoformer_blocks=1",
                 "model.structure_blocks=1", "model.num_recycling_iters=0",
                 "model.max_extra_msa=8", "model.max_msa_clusters=4", "train.target=0.0"),
}
#: Every run: one epoch, the config's device choice (auto), bf16 autocast on CUDA.
COMMON = ("train.max_epochs=1", "train.amp=true", "train.device=auto")


def mini_overrides(workload: str, work: Path, tiny: bool) -> tuple[Path, tuple[str, ...]]:
    """The mini config of ``workload`` and its ``--set`` values (data under ``work``)."""
    config, bounded = MINI[workload]
    extra = TINY[workload] if tiny else ()
    sets = (*bounded, *extra, *COMMON, f"data.path={work / 'data' / workload}")
    if tiny:
        sets = (*sets, "train.threads=1")
    return REPO / config, sets


def run_bounded(args: list[str], timeout_s: float, cwd: Path) -> subprocess.CompletedProcess:
    """``args`` run in a session of its own, its output captured; past ``timeout_s`` seconds the
    whole process group is stopped (SIGTERM, then SIGKILL after 10 s), the processes ``args``
    started included (a synthesis pool's workers), not only the first.

    Raises:
        subprocess.TimeoutExpired: the command ran past ``timeout_s`` (its group stopped).
    """
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, None)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.communicate(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def checker(log: Path, metric: str, timeout_s: float) -> dict[str, Any]:
    """MLCommons' compliance checker (hpc ruleset 3.0.0) on ``log``: ``ok`` (SUCCESS), its
    failed checks, and ``only_target``: every failed check is the quality metric's target (a
    bounded run stops short of the reference target by design; the rest of the log passed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "hpc",
         "--ruleset", "3.0.0", str(log.resolve())], capture_output=True, text=True,
        timeout=max(5.0, timeout_s), cwd=log.parent, check=False)
    text = (proc.stdout + proc.stderr).strip().splitlines()
    ok = proc.returncode == 0 and any("SUCCESS" in line for line in text)
    failed = [line.strip() for line in text if "Failed check" in line]
    only_target = not ok and bool(failed) and all(f"for {metric} " in line for line in failed) \
        and not any(line.startswith(("ERROR", "CRITICAL")) and "FAILED" not in line for line in text)
    return {"ok": ok, "only_target": only_target, "failed_checks": failed,
            "returncode": proc.returncode, "last_line": text[-1] if text else ""}


def _energy(log: Path, summary: dict[str, Any]) -> dict[str, Any]:
    from mlhpc.report.energy import run_energy

    ttt = summary.get("time_to_train_s")
    found = run_energy(log, None if ttt is None else ttt * 1e3)
    return {"energy_to_train_j": found.energy_j, "note": found.note}


def mini_run(workload: str, work: Path, tiny: bool, timeout_s: float) -> dict[str, Any]:
    """`mlhpc run` of one mini config, bounded; its exit status, summary figures, energy and the
    checker's verdict (``ok``: exit 0, status success, checker SUCCESS)."""
    config, sets = mini_overrides(workload, work, tiny)
    out = work / "runs" / workload
    args = [sys.executable, "-m", "mlhpc", "run", str(config)]
    for value in (*sets, f"output.dir={out}"):
        args += ["--set", value]
    start = time.perf_counter()
    try:
        proc = run_bounded(args, max(5.0, timeout_s), work)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": f"timed out after {timeout_s:.0f} s"}
    row: dict[str, Any] = {"returncode": proc.returncode, "wall_s": time.perf_counter() - start}
    log = out / "result_0.txt"
    if proc.returncode != 0 or not log.is_file():
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return {**row, "ok": False, "why": tail[-1] if tail else "no output"}
    summary = json.loads(read_text_input(out / "summary_0.json", what="run summary"))
    row.update({key: summary.get(key) for key in ("status", "time_to_train_s", "epochs_to_target",
                                                   "samples_per_s", "device")})
    row["energy"] = _energy(log, summary)
    from mlhpc.workload import get

    row["checker"] = checker(log, get(workload).metric.key, 120)
    row["ok"] = row["status"] == "success" and (row["checker"]["ok"] or row["checker"]["only_target"])
    return row


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_group_check(device: torch.device) -> dict[str, Any]:
    """A process group of one rank with the backend `mlhpc.runtime` picks for ``device``
    (NCCL on CUDA, Gloo on a CPU), one all-reduce of ones checked, torn down."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    start = time.perf_counter()
    try:
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}",
                                rank=0, world_size=1)
        value = torch.ones(4, device=device)
        dist.all_reduce(value)
        ok = bool(torch.all(value == 1))
        version = ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None
        dist.destroy_process_group()
    except Exception as exc:  # noqa: BLE001 - the check's result, said in one line
        return {"backend": backend, "ok": False, "why": f"{type(exc).__name__}: {exc}"[:200]}
    return {"backend": backend, "ok": ok, "world_size": 1, "nccl_version": version,
            "seconds": time.perf_counter() - start}


def nvml_check() -> dict[str, Any]:
    """What NVML reads here (device count, the first GPU's energy counter), or why not."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        energy_mj = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        count = pynvml.nvmlDeviceGetCount()
        driver = pynvml.nvmlSystemGetDriverVersion()
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError: said, not raised
        return {"ok": False, "why": f"{type(exc).__name__}: {exc}"[:200]}
    return {"ok": True, "gpus": count, "driver": str(driver), "energy_counter_mj": int(energy_mj)}


# ---------------------------------------------------------------------------------- compare


def compare(workload: str, work: Path, tiny: bool, device: str, loader_workers: int) -> dict[str, Any]:
    """benchmarks/side_by_side.py's comparisons on ``device`` for one mini config (the data the
    mini run made): ``harness`` (mlhpc's step against a bare loop), ``model`` (OC20: DimeNet++
    against torch-geometric's), ``data`` (the loader with ``loader_workers`` workers, one epoch)
    and ``data-vs-training`` (the loader's samples/s over the samples/s the step consumes,
    goal 2). One short measurement a side in ``tiny``, five of at least a second otherwise."""
    from side_by_side_core import LoadWatch, Skipped
    from side_by_side_data import loader_work, versus_training
    from side_by_side_step import harness, prepare

    from mlhpc import config as cfg

    config_path, sets = mini_overrides(workload, work, tiny)
    config = cfg.load(config_path, (*sets, f"data.num_workers={loader_workers}"))
    repeats, min_s = (1, 0.0) if tiny else (3, 0.5)
    load = LoadWatch()
    prep = prepare(config, device, 2 if tiny else 4)
    out: dict[str, Any] = {}
    step = harness(prep, repeats, min_s, load)
    out["harness"] = step.to_json()
    data = _loader_rate(prep, loader_work, repeats, min_s, load)
    out["data_samples_per_s"] = data.mlhpc
    feeds = versus_training(data, step)
    out["data-vs-training"] = feeds.to_json()
    if workload == "oc20":
        try:
            from side_by_side_oc20 import model_comparison

            loss_fn = prep.job.workload.build_loss(prep.config)
            found = model_comparison(prep.config, loss_fn, prep.batches, repeats, min_s, load)
            found.extra.pop("models")  # the profile is side_by_side.py's, not timed here
            out["model"] = found.to_json()
        except Skipped as why:
            out["model"] = {"skipped": str(why)}
    out["loader_workers"] = loader_workers
    out["decoded_sample_bytes"] = _sample_bytes(prep)
    return out


def _loader_rate(prep: Any, loader_work: Any, repeats: int, min_s: float, load: Any) -> Any:
    from side_by_side_core import Measured, calibrate

    timed = calibrate(loader_work(prep.parts), min_s)
    rates = []
    for _ in range(repeats):
        load.sample()
        rates.append(timed.measure())
    return Measured("data", "samples/s", rates, rates,
                    sides={"mlhpc": f"the training loader, {prep.parts.train_loader.host.num_workers} "
                                    "workers, one epoch"})


def _sample_bytes(prep: Any) -> int:
    """Bytes of one training sample as the step reads it (decoded input and target)."""
    x, y, n = prep.batches[0]

    def size(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            return value.numel() * value.element_size()
        if isinstance(value, dict):
            return sum(size(v) for v in value.values())
        return 0
    return int((size(x) + size(y)) / max(n, 1))


def loader_workers(tiny: bool) -> int:
    """The machine's cores for the loader (at most 16); none (in-process) in ``--tiny``."""
    return 0 if tiny else max(1, min(16, len(os.sched_getaffinity(0))))
