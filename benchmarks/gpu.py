"""The CUDA path in one command: every GPU figure of mlhpc, measured in one short session.

Usage, on a machine with one CUDA GPU (no argument needed; about 8 minutes at most):

    python benchmarks/gpu.py [--json FILE] [--workloads cosmoflow,deepcam,oc20,openfold]
        [--parts machine,steps,harness,compare] [--work DIR] [--budget-scale 1.0]
    python benchmarks/gpu.py --tiny            # on a CPU: tiny sizes, seconds (the default tests)

It writes one JSON file (``--json``, default ``gpu-<UTC date and time>.json`` here) and prints one
line per figure. Parts, in order, each in its own process under its own time budget (seconds on a
GPU; the part is stopped at its budget, 5 s of grace past it, and said ``timed out``, keeping the
figures it had written as it went, so a slow part cannot starve the rest; `BUDGETS_S` sums to
460 s, 495 s at most with the grace):

- ``machine`` (20): GPU name, memory, driver, CUDA, cuDNN and torch versions, TF32 switches, the
  peak bf16 and fp32 FLOP/s of `mlhpc.run.step.device_peak` (the data-sheet table
  `KNOWN_PEAKS_FLOP_PER_S` for known GPUs), what NVML reads;
- ``steps`` (cosmoflow 70, deepcam 80, oc20 30, openfold 60): each workload at its reference size
  (benchmarks/gpu_steps.py: CosmoFlow 128^3 x 4, batch 8; DeepCAM 768 x 1152 x 16, batch 2;
  DimeNet++ at the reference widths on slabs of 80 atoms, batch 8; OpenFold at crop 256 with
  the reference widths, Evoformer measured at 2 and 4 blocks and scaled to 48, said so), one
  training step (the harness's `train_step`) in fp32 (torch's defaults: TF32 in cuDNN
  convolutions, not in matrix products) and in bf16 autocast: median step time, samples/s,
  counted FLOPs and MFU, ``torch.cuda.max_memory_allocated``; torch.compile against eager (bf16)
  for CosmoFlow and DeepCAM, the compile time apart;
- ``harness`` (140): `mlhpc run` of each mini config, bounded (benchmarks/gpu_harness.py: small
  embedded data, one epoch, a reachable target; ``train.amp: true``, the device chosen by the
  config, the `DeviceLoader`, power sampled through NVML), each exit status, summary, energy to
  train and MLCommons' checker verdict; a process group of one rank (NCCL on CUDA) with one
  all-reduce;
- ``compare`` (60): benchmarks/side_by_side.py's comparisons on the device for each mini config:
  the harness's step against a bare loop, DimeNet++ against torch-geometric's, and whether the
  loader (with the machine's cores as workers) keeps the step fed: its samples/s over the
  samples/s the step consumes (goal >= 2), and, by bytes, over what the reference-size bf16 step
  of the ``steps`` part consumes (``feeds-reference``: the loader's decoded bytes/s over the
  reference step's; an estimate that assumes the loader's rate follows bytes).

``--tiny`` runs the same parts and code paths at tiny sizes on whatever device is there (a CPU in
the default tests, tests/test_gpu_script.py): steps in fp32 and bf16 autocast (torch supports
bf16 autocast on CPUs; a configuration that fails is said, with its first line), compile on/off
skipped on a CPU (compiling takes minutes there; benchmarks/side_by_side.py measures it), the
tiny `mlhpc run`s with the checker, the Gloo process group, the loader-feeds ratio.

The device machine (Python 3.12, a CUDA PyTorch, no network) lacks some of mlhpc's dependencies.
Download them here, for its Python and platform, without their dependencies (the image has
torch, numpy, scipy, h5py, pandas, matplotlib, click, pyyaml, rich, xxhash, mpi4py, protobuf,
six, nvidia-ml-py and torch-geometric), into a folder git ignores, and carry it to the device;
scripts/gpu_session.sh installs them there (``pip install --no-index --no-deps --target``), builds
mlhpc from the tree into the same folder and runs this script::

    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        --platform manylinux1_x86_64 -d .whl \
        mlperf-logging==4.1.68 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types \
        typing-inspection typing-extensions==4.16.0 "attrs>=26" sqlalchemy==2.1.9 greenlet \
        psycopg==3.3.9 psycopg-binary==3.3.9 powerbox colossus tfrecord crc32c lmdb ase \
        gemmi==0.7.5
    # there, with .whl carried:  bash scripts/gpu_session.sh   (writes $OUT/gpu.json, gpu.log)

Exit status 0 when every part ran (a figure may still be said skipped or failed); 1 when a part
failed or timed out; 2 with one line on stderr on bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from mlhpc.data.files import write_text_atomic  # noqa: E402
from mlhpc.data.inputs import read_text_input  # noqa: E402
from mlhpc.text import echo  # noqa: E402

WORKLOADS = ("cosmoflow", "deepcam", "oc20", "openfold")
#: ``--tiny`` without ``--workloads``: the harness and compare parts run these two (a tensor
#: batch and a graph batch, the model comparison); DeepCAM's and OpenFold's tiny runs through
#: the checker are their own default tests' (tests/test_deepcam.py, tests/test_openfold_cli.py),
#: and tests/test_gpu_script.py loads every workload's run settings.
TINY_END_TO_END = ("cosmoflow", "oc20")
PARTS = ("machine", "steps", "harness", "compare")
#: Seconds each part may take on a GPU (``--tiny``: `TINY_BUDGETS_S`); steps per workload.
BUDGETS_S = {"machine": 20, "steps:cosmoflow": 70, "steps:deepcam": 80, "steps:oc20": 30,
             "steps:openfold": 60, "harness": 140, "compare": 60}
#: Seconds a part's process may outlive its budget (its start, its last write) before it is stopped.
GRACE_S = 5
TINY_BUDGETS_S = {"machine": 60, "steps:cosmoflow": 60, "steps:deepcam": 60, "steps:oc20": 60,
                  "steps:openfold": 90, "harness": 300, "compare": 200}
GiB = 2**30


class BadInput(Exception):
    """One line for stderr; exit status 2."""


def part_file(args: argparse.Namespace) -> Path:
    name = args.part if args.workload is None else f"{args.part}-{args.workload}"
    return args.work / f"part-{name}.json"


def save(args: argparse.Namespace, found: dict[str, Any]) -> None:
    """A part's figures so far, written at once (atomically): a part stopped at its budget
    keeps what it had measured."""
    write_text_atomic(part_file(args), json.dumps(found, indent=1, default=str))


def device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


# ------------------------------------------------------------------------------ the parts


def part_machine(args: argparse.Namespace) -> dict[str, Any]:
    """The machine and its peaks (also written to ``machine.json`` for the step parts)."""
    from gpu_harness import nvml_check
    from gpu_steps import peaks
    from side_by_side import commit, machine

    dev = device()
    info: dict[str, Any] = {**machine(), "commit": commit(), "device": str(dev),
                            "cudnn": torch.backends.cudnn.version(),
                            "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                                     "cudnn": torch.backends.cudnn.allow_tf32}}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        info.update(gpu_memory_bytes=props.total_memory, multiprocessors=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}")
    info["nvml"] = nvml_check()
    info["peaks"] = peaks(dev)
    gpu = info.get("gpu") or f"CPU ({info['cpu']}, {info['cores']} cores)"
    memory = f", {info['gpu_memory_bytes'] / GiB:.1f} GiB" if "gpu_memory_bytes" in info else ""
    driver = info["nvml"].get("driver", "-")
    echo(f"machine: {gpu}{memory}, driver {driver}, CUDA {info['torch_cuda']}, torch {info['torch']}")
    for precision, peak in info["peaks"].items():
        echo(f"machine: peak {precision} {peak['flop_per_s'] / 1e12:.4g} TFLOP/s ({peak['source']})")
    return info


def _step_lines(workload: str, result: dict[str, Any]) -> None:
    for precision, row in result["precisions"].items():
        if "skipped" in row:
            echo(f"step {workload} {precision}: skipped ({row['skipped']})")
            continue
        memory = row.get("peak_memory_bytes") or row.get("peak_memory_bytes_at_measured_depth")
        shown = f", peak memory {memory / GiB:.2f} GiB" if memory else ""
        echo(f"step {workload} {precision}: {row['step_s']:.4g} s/step, "
             f"{row['samples_per_s']:.4g} samples/s, MFU {row['mfu']:.2%}{shown}")
    if "compile" in result:
        row = result["compile"]
        if "speedup_over_eager" in row:
            echo(f"compile {workload} bf16: {row['speedup_over_eager']:.3g}x the eager step, "
                 f"compiling took {row['compile_s']:.1f} s (not in the step time)")
        else:
            echo(f"compile {workload}: skipped ({row.get('skipped', 'no figure')})")
    if "scaled" in result:
        echo(f"# step {workload}: {result['scaled']}")


def part_steps(args: argparse.Namespace) -> dict[str, Any]:
    """The step figures (gpu_steps.measure_case) of ``args.workload``, or of every workload
    in ``args.workloads`` (``--tiny``: one process for all), within ``args.seconds``."""
    import gpu_steps

    dev = device()
    if dev.type == "cpu":
        torch.set_num_threads(1)
    cases = gpu_steps.TINY if args.tiny else gpu_steps.REFERENCE
    chosen = [args.workload] if args.workload else list(args.workloads)
    machine = json.loads(read_text_input(args.work / "machine.json", what="machine figures"))
    peaks = machine.get("peaks") or gpu_steps.peaks(dev)  # the machine part may have failed
    note = ("skipped on a CPU: compiling takes minutes there (benchmarks/side_by_side.py "
            "measures it); the GPU run measures it") if dev.type == "cpu" else None
    out: dict[str, Any] = {}
    end = time.perf_counter() + 0.9 * args.seconds
    for k, workload in enumerate(chosen):
        torch.manual_seed(0)
        case = next(c for c in cases if c.workload == workload)
        seconds = (end - time.perf_counter()) / (len(chosen) - k)
        measurements = 4 + 2 * case.compile + 4 * (case.scaled_blocks is not None)
        out[workload] = {"sample_bytes": gpu_steps.sample_bytes(case, dev)}
        whole = out if args.workload is None else out[workload]
        plan = {"warmup": 1 if args.tiny or case.scaled_blocks else 3,
                "steps": 2 if args.tiny else 20,
                "batch": case.batch, "slice_s": 0.9 * seconds / measurements,
                "part_deadline": time.perf_counter() + seconds, "out": out[workload],
                "save": lambda whole=whole: save(args, whole)}
        result = gpu_steps.measure_case(case, dev, plan, peaks, note)
        _step_lines(workload, result)
    return out[args.workload] if args.workload else out


def part_harness(args: argparse.Namespace) -> dict[str, Any]:
    """`mlhpc run` of each mini config and the process group check, within ``args.seconds``."""
    from gpu_harness import mini_run, process_group_check

    deadline = time.perf_counter() + args.seconds
    group = process_group_check(device())
    echo(f"process group {group['backend']} (world size 1): {'ok' if group['ok'] else 'FAILED'}"
         + ("" if group["ok"] else f" ({group['why']})"))
    runs: dict[str, Any] = {}
    found = {"process_group": group, "runs": runs}
    for k, workload in enumerate(args.workloads):
        share = (deadline - time.perf_counter()) / (len(args.workloads) - k)
        row = mini_run(workload, args.work, args.tiny, share)
        runs[workload] = row
        save(args, found)
        if not row["ok"]:
            echo(f"run {workload}: FAILED ({row.get('why') or row.get('status')}; checker "
                 f"{row.get('checker', {}).get('last_line', '-')})")
            continue
        energy = row["energy"]["energy_to_train_j"]
        verdict = "SUCCESS" if row["checker"]["ok"] else "only the reference target failed (bounded run)"
        echo(f"run {workload}: exit 0, {row['status']}, {row['time_to_train_s']:.3g} s to train, "
             f"energy {'%.4g J' % energy if energy is not None else 'not measured'}, checker: {verdict}")
    return found


def part_compare(args: argparse.Namespace) -> dict[str, Any]:
    """The side-by-side comparisons of each mini config on the device."""
    from gpu_harness import compare, loader_workers

    out = {}
    workers = loader_workers(args.tiny)
    for workload in args.workloads:
        try:
            row = compare(workload, args.work, args.tiny, str(device()), workers)
        except Exception as exc:  # noqa: BLE001 - one workload's failure is said, the rest go on
            out[workload] = {"failed": f"{type(exc).__name__}: {exc}"[:200]}
            echo(f"compare {workload}: FAILED ({out[workload]['failed']})")
            continue
        out[workload] = row
        save(args, out)
        for name in ("harness", "model", "data-vs-training"):
            if name in row and "ratio" in row[name]:
                echo(f"compare {workload} {name}: {row[name]['ratio']:.3g} (mlhpc "
                     f"{row[name]['mlhpc']:.4g}, reference {row[name]['reference']:.4g} samples/s; "
                     f"goal {row[name]['goal']})")
            elif name in row:
                echo(f"compare {workload} {name}: skipped ({row[name]['skipped']})")
    return out


PART_FUNCTIONS = {"machine": part_machine, "steps": part_steps, "harness": part_harness,
                  "compare": part_compare}


# ------------------------------------------------------------------------------ the runner


def plan(args: argparse.Namespace) -> list[tuple[str, str | None, float]]:
    """``(part, workload or None, seconds)`` in order, as ``--parts`` and ``--workloads`` keep."""
    budgets = TINY_BUDGETS_S if args.tiny else BUDGETS_S
    out: list[tuple[str, str | None, float]] = [("machine", None, budgets["machine"])]
    for part in ("steps", "harness", "compare"):
        if part not in args.parts:
            continue
        if part == "steps" and args.tiny:  # one process for every workload's tiny step
            out.append((part, None, sum(budgets[f"steps:{w}"] for w in args.workloads)
                        * args.budget_scale))
        elif part == "steps":
            out += [(part, w, budgets[f"steps:{w}"] * args.budget_scale) for w in args.workloads]
        else:
            out.append((part, None, budgets[part] * args.budget_scale))
    return out


def run_part(args: argparse.Namespace, part: str, workload: str | None, seconds: float
             ) -> dict[str, Any]:
    """One part in its own process (its output passes through), stopped at ``seconds``; its
    figures, or ``{"failed"}`` / ``{"timed_out_s"}``."""
    name = part if workload is None else f"{part}-{workload}"
    result = args.work / f"part-{name}.json"
    chosen = args.end_to_end if part in ("harness", "compare") else args.workloads
    cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--work", str(args.work),
           "--seconds", f"{seconds:.1f}", "--workloads", ",".join(chosen)]
    cmd += ["--workload", workload] if workload else []
    cmd += ["--tiny"] if args.tiny else []
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=seconds + GRACE_S, check=False, stdout=sys.stdout,
                              stderr=subprocess.PIPE, text=True)
    except subprocess.TimeoutExpired:
        echo(f"{name}: timed out after its budget of {seconds:.0f} s (stopped; what it had "
             f"measured is kept)")
        kept = json.loads(read_text_input(result, what="part figures")) if result.is_file() else {}
        return {**kept, "timed_out_s": seconds}
    if proc.returncode != 0 or not result.is_file():
        tail = (proc.stderr or "").strip().splitlines()
        why = tail[-1] if tail else f"exit status {proc.returncode}"
        echo(f"{name}: FAILED ({why[:200]})")
        return {"failed": why[:400], "returncode": proc.returncode}
    found = json.loads(read_text_input(result, what="part figures"))
    args.part_seconds[name] = time.perf_counter() - start
    return found


def feeds_reference(report: dict[str, Any]) -> dict[str, Any]:
    """Per workload: the loader's decoded bytes/s (``compare``) over the bytes/s the
    reference-size bf16 step consumes (``steps``); goal 2; an estimate (module docstring)."""
    out = {}
    for workload, row in report.get("compare", {}).items():
        step = report.get("steps", {}).get(workload, {})
        if not isinstance(row, dict) or not isinstance(step, dict):
            continue
        bf16 = step.get("precisions", {}).get("bf16", {})
        if "data_samples_per_s" not in row or "samples_per_s" not in bf16 or not step.get("sample_bytes"):
            continue
        loader_bytes_per_s = row["data_samples_per_s"] * row["decoded_sample_bytes"]
        step_bytes_per_s = bf16["samples_per_s"] * step["sample_bytes"]
        out[workload] = {"ratio": loader_bytes_per_s / step_bytes_per_s, "goal": 2.0,
                         "loader_bytes_per_s": loader_bytes_per_s, "step_bytes_per_s": step_bytes_per_s}
        echo(f"feeds-reference {workload}: {out[workload]['ratio']:.3g} (loader "
             f"{loader_bytes_per_s / 1e6:.4g} MB/s decoded, reference bf16 step "
             f"{step_bytes_per_s / 1e6:.4g} MB/s; goal 2; by bytes, an estimate)")
    return out


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every planned part in order; the merged report."""
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/gpu.py", *sys.argv[1:]]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "tiny": args.tiny, "workloads": list(args.workloads), "budgets_s": {}, "steps": {}}
    start = time.perf_counter()
    args.part_seconds = report["part_seconds"] = {}
    for part, workload, seconds in plan(args):
        key = part if workload is None else f"{part}:{workload}"
        report["budgets_s"][key] = seconds
        found = run_part(args, part, workload, seconds)
        if part == "machine":
            write_text_atomic(args.work / "machine.json", json.dumps(found))
        if part == "steps" and workload is None:
            report["steps"] = found
        elif part == "steps":
            report["steps"][workload] = found
        else:
            report[part] = found
    report["feeds_reference"] = feeds_reference(report)
    report["wall_s"] = time.perf_counter() - start
    rows = [*report["steps"].values(), *(report.get(p, {}) for p in ("machine", "harness", "compare"))]
    report["ok"] = not any("failed" in row or "timed_out_s" in row for row in rows) and \
        all(run["ok"] for run in report.get("harness", {}).get("runs", {}).values()) and \
        report.get("harness", {}).get("process_group", {}).get("ok", True)
    return report


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes: seconds, on any device")
    parser.add_argument("--json", type=Path, default=None, help="the report (default gpu-<date>.json)")
    parser.add_argument("--workloads", default=None,
                        help=f"comma-separated (default: {','.join(WORKLOADS)}; --tiny runs the "
                             f"harness and compare parts for {','.join(TINY_END_TO_END)} only)")
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--work", type=Path, default=None,
                        help="folder for the mini data and runs (default: a new temporary one)")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every part's time budget (but machine's)")
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=60.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    named = args.workloads is not None
    args.workloads = tuple(w.strip() for w in (args.workloads or ",".join(WORKLOADS)).split(",")
                           if w.strip())
    args.end_to_end = args.workloads if named or not args.tiny else TINY_END_TO_END
    args.parts = tuple(p.strip() for p in args.parts.split(",") if p.strip())
    for value, known, what in ((args.workloads, WORKLOADS, "--workloads"), (args.parts, PARTS, "--parts")):
        unknown = [v for v in value if v not in known]
        if unknown or not value:
            raise BadInput(f"{what} {unknown[0] if unknown else '(empty)'!r}: expected some of "
                           f"{', '.join(known)}")
    if not args.budget_scale > 0:
        raise BadInput("--budget-scale must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    import tempfile

    try:
        args = parse(argv)
        if args.part:  # one part, in its own process (run_part)
            save(args, PART_FUNCTIONS[args.part](args))
            return 0
        stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
        out = args.json or Path(f"gpu-{stamp}.json")
        if out.is_dir() or not (out.parent if str(out.parent) else Path(".")).is_dir():
            raise BadInput(f"--json {out}: not a file in an existing folder")
        with tempfile.TemporaryDirectory(prefix="mlhpc-gpu-") as scratch:
            args.work = (args.work or Path(scratch)).resolve()
            args.work.mkdir(parents=True, exist_ok=True)
            report = run_all(args)
        write_text_atomic(out, json.dumps(report, indent=1, default=str) + "\n")
        echo(f"# report: {out} ({report['wall_s']:.0f} s; {'every part ran' if report['ok'] else 'a part FAILED or timed out'})")
        return 0 if report["ok"] else 1
    except BadInput as exc:
        echo(f"gpu: {exc}", err=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
