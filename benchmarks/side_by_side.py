"""Every comparison of one workload, side by side with what a user would pick instead.

Usage:
    python benchmarks/side_by_side.py WORKLOAD [--json OUT] [--config YAML] [--set KEY=VALUE]...
        [--repeats 5] [--min-seconds 1.0] [--batches 4] [--only NAME,...] [--quick]

WORKLOAD is any registered workload (cosmoflow, deepcam, oc20, ...); its config is ``--config``
or the ``*-mini.yaml`` under configs/ that names it (its data are synthesised first when missing,
as `mlhpc run` does). Comparisons, in this order (``--only`` picks some):

- ``harness``: the training step `mlhpc run` trains with (`mlhpc.run.step.train_step` on the parts
  `mlhpc.run.assemble.build` makes, through benchmarks/throughput.py's ``one_batch``) against a bare
  PyTorch loop of the same model, loss, optimizer and scheduler, on the same batches already
  decoded in memory; samples/s; goal 0.95.
- ``model`` (OC20 only): mlhpc's DimeNet++ training step against torch-geometric's
  ``DimeNetPlusPlus`` at the same widths and weights, same batches, edges and triplets
  (benchmarks/side_by_side_oc20.py); samples/s; goal 1.0. A torch.profiler breakdown of both
  steps goes to the JSON.
- ``data``: the training loader, one epoch, against a raw read of the same samples in the same
  order (h5py; lmdb + the restricted unpickler for OC20); samples/s; goal 0.8. CosmoFlow adds
  ``data-whole-files`` (whole HDF5 files read in sequence; context, no goal).
- ``data-vs-training``: the loader's samples/s against the samples/s the training step consumes
  (the harness's mlhpc side); goal 2.
- ``compile``: the step with ``train.compile: true`` (the "mlhpc" side) against the same step
  eager (the "reference" side): ratio > 1 means compiling pays once compiled; the compile time
  is printed apart.

Each comparison warms both sides up (not counted), sizes a measurement to last ``--min-seconds``,
then measures the two sides in turn (A B A B ...), ``--repeats`` times each, and reports the
median of each side. Output: one line per comparison,
``name  mlhpc=<figure> <unit>  reference=<figure> <unit>  ratio=<mlhpc/reference>`` (ratio > 1:
mlhpc better; every figure here is a rate, higher is better), and comment lines starting with
``#`` (notes, and ``# NAME: skipped (why)`` for a comparison that does not apply). ``--json``
writes every raw figure, the machine, the torch build and the load average during the run.

Exit status 0; 2 with one line on stderr on bad input (unknown workload, bad config or data,
a ``--json`` path that cannot be written).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from side_by_side_core import LoadWatch, Measured, Skipped
from side_by_side_data import data_comparisons, versus_training
from side_by_side_step import compile_switch, harness, prepare

from mlhpc import config as cfg
from mlhpc import workload as workloads
from mlhpc.config.catalog import describe
from mlhpc.data.files import write_text_atomic
from mlhpc.data.inputs import read_text_input
from mlhpc.errors import MlhpcError
from mlhpc.text import echo

COMPARISONS = ("harness", "model", "data", "compile")
MODEL_COMPARED = {"oc20"}  # workloads with an alternative implementation of their model here


class BadInput(Exception):
    """One line for stderr; exit status 2."""


def find_config(name: str) -> Path:
    """The config of workload ``name`` under configs/: its ``*-mini.yaml`` (the shortest name),
    else its only config. Raises BadInput when there is none to pick."""
    rows = [row for row in describe((REPO / "configs",)) if row["name"] == name]
    found = sorted((Path(p) for p in rows[0]["configs"]) if rows else (),
                   key=lambda p: (not p.name.endswith("-mini.yaml"), len(p.name), p.name))
    if not found:
        raise BadInput(f"workload {name!r}: no config under {REPO / 'configs'} names it; "
                       f"pass --config")
    return found[0]


def check_writable(path: Path | None) -> None:
    """Raises BadInput when ``path`` could not be written (missing folder, a folder, no right)."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise BadInput(f"--json {path}: is a folder")
    if not parent.is_dir():
        raise BadInput(f"--json {path}: folder {parent} not found")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise BadInput(f"--json {path}: not writable")


def machine() -> dict[str, Any]:
    """CPU model and cores, torch version and build, the platform."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = read_text_input(cpuinfo, 1 << 22, what="cpuinfo").splitlines() if cpuinfo.is_file() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")),
               platform.processor())
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "platform": platform.platform(),
            "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def commit() -> str | None:
    """The checkout's commit (``+`` when files differ from it), or None outside a git checkout."""
    import subprocess

    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+" if dirty else "")


def compile_note(result: Measured) -> str:
    extra = result.extra
    verdict = "pays" if result.ratio > 1 else "does not pay"
    line = (f"# compile: {verdict} on this machine once compiled ({result.ratio:.2f}x the eager "
            f"step); compiling took {extra['compile_s']:.1f} s")
    if extra["break_even_steps"] is not None and result.ratio > 1:
        line += f", made up after {extra['break_even_steps']:.0f} steps"
    return line + " (not in the rates)"


def run(args: argparse.Namespace, report: dict[str, Any], emit: Any) -> None:
    """Every comparison of ``args.workload`` that ``args.only`` keeps, each printed through
    ``emit`` as it finishes and added to ``report``."""
    workload = workloads.get(args.workload).name
    config_path = args.config or find_config(workload)
    config = cfg.load(config_path, tuple(args.overrides))
    if config.workload != workload:
        raise BadInput(f"{config_path}: workload is {config.workload!r}, not {workload!r}")
    load = LoadWatch()
    report.update(config=str(config_path), overrides=args.overrides,
                  batch_size=config.train.global_batch_size)
    start = time.perf_counter()
    prep = prepare(config, args.device, args.batches)
    report.update(setup_s=time.perf_counter() - start, threads=torch.get_num_threads(),
                  device=str(prep.job.rt.device))
    results: dict[str, Measured] = {}

    def record(name: str, measure: Any) -> None:
        if name.split("-")[0] not in args.only:
            return
        try:
            found = measure()
        except Skipped as why:
            report["skipped"][name] = str(why)
            emit(f"# {name}: skipped ({why})")
            return
        for result in found if isinstance(found, list) else [found]:
            results[result.name] = result
            report["comparisons"][result.name] = result.to_json()
            emit(result.line())

    opts = (args.repeats, args.min_seconds, load)
    record("harness", lambda: harness(prep, *opts))
    record("model", lambda: model(workload, prep, *opts))
    record("data", lambda: data_comparisons(workload, prep.parts, *opts))
    if "data" in results and "harness" in results:
        record("data-vs-training", lambda: versus_training(results["data"], results["harness"]))
    compiled = cfg.load(config_path, (*args.overrides, "train.compile=true"))
    record("compile", lambda: compile_switch(prep, compiled, *opts))
    if "compile" in results:
        emit(compile_note(results["compile"]))
    load.sample()
    report["load_average_1min"] = load.to_json()


def model(workload: str, prep: Any, repeats: int, min_s: float, load: LoadWatch) -> Measured:
    if workload not in MODEL_COMPARED:
        raise Skipped(f"no other implementation of the {workload} model to compare with here "
                      f"(the reference trains the same architecture in plain PyTorch)")
    from side_by_side_oc20 import model_comparison, profiled

    loss_fn = prep.job.workload.build_loss(prep.config)
    found = model_comparison(prep.config, loss_fn, prep.batches, repeats, min_s, load)
    return profiled(found, loss_fn, prep.batches)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload")
    parser.add_argument("--json", type=Path, default=None, help="write every raw figure here")
    parser.add_argument("--config", type=Path, default=None,
                        help="the workload's config (default: its *-mini.yaml under configs/)")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a config value (repeatable)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements of each side")
    parser.add_argument("--min-seconds", type=float, default=1.0,
                        help="shortest measurement, seconds")
    parser.add_argument("--batches", type=int, default=4,
                        help="training batches the step comparisons cycle through")
    parser.add_argument("--only", default=",".join(COMPARISONS),
                        help=f"comparisons to run, comma-separated ({', '.join(COMPARISONS)})")
    parser.add_argument("--device", choices=("cpu", "cuda", "auto"), default="cpu")
    parser.add_argument("--quick", action="store_true",
                        help="one measurement per side, as short as can be (checks, not figures)")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.min_seconds = 1, 0.0
    args.only = {name.strip() for name in args.only.split(",") if name.strip()}
    unknown = args.only - set(COMPARISONS)
    if unknown or args.repeats < 1 or args.batches < 1 or args.min_seconds < 0:
        what = f"--only {min(unknown)!r} (known: {', '.join(COMPARISONS)})" if unknown \
            else "--repeats and --batches must be >= 1, --min-seconds >= 0"
        raise BadInput(what)
    return args


def main(argv: list[str] | None = None) -> int:
    report: dict[str, Any] = {
        "command": " ".join(["python", "benchmarks/side_by_side.py", *(argv or sys.argv[1:])]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(), "commit": commit(), "comparisons": {}, "skipped": {}, "notes": []}
    try:
        args = parse(argv)
        report["workload"] = args.workload
        check_writable(args.json)

        def emit(line: str) -> None:
            echo(line)
            if line.startswith("# "):
                report["notes"].append(line[2:])

        run(args, report, emit)
        if args.json:
            write_text_atomic(args.json, json.dumps(report, indent=1) + "\n")
    except (BadInput, MlhpcError) as exc:
        echo(f"side_by_side: {exc}", err=True)
        return 2
    except OSError as exc:
        echo(f"side_by_side: {exc.filename or ''}: {exc.strerror or exc}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
