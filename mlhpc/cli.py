"""The `mlhpc` command line. Each command parses, calls ONE library function, prints.

Exit status: 0 the quality target was reached, 1 it was not (the run ended, aborted), 2 bad
input or environment (every `MlhpcError`: bad config, data, staging, log or results folder,
one line on stderr), 128 + N a signal N stopped the run (143: SIGTERM; a checkpoint was saved
when it came after run_start). Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from mlhpc import rules
from mlhpc.automl.cli import automl_command
from mlhpc.data.cli import data_group  # the data commands live with their package, as below
from mlhpc.errors import ConfigError, one_line_errors
from mlhpc.report.cli import report_command
from mlhpc.store.cli import results_group
from mlhpc.text import console, echo
from mlhpc.validate.cli import validate_command

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.slurm_job import SubmitOptions

SET_HELP = "Override a config value, e.g. --set train.max_epochs=5 (repeatable)."


_friendly = one_line_errors()  # every command: an MlhpcError is one line and exit 2


@click.group(context_settings={"help_option_names": ["-h", "--help"]})  # inherited by every command
@click.version_option(package_name="mlhpc")
def main() -> None:
    """mlhpc: MLPerf HPC-style benchmarks (the workloads `mlhpc list` shows): time to train,
    split into staging, convergence and compute."""


FORMAT_HELP = "A table for people, JSON for scripts."


@main.command("list")
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help=FORMAT_HELP)
@_friendly
def list_command(fmt: str) -> None:
    """The registered workloads: data formats, configs (under ./configs) and quality targets."""
    from mlhpc.config.catalog import describe

    rows = describe()
    if fmt == "json":
        echo(json.dumps(rows, indent=2))
        return
    import shutil

    echo(describe_text(rows, shutil.get_terminal_size().columns))


def describe_text(rows: list[dict[str, Any]], width: int = 80) -> str:
    """`mlhpc.workload.describe`'s rows as lines for a terminal of ``width`` columns: per workload its name and
    quality target, then its data formats, splits and configs under it. Lines wrap between
    words only; a config path is one line of its own, never broken (a path longer than the
    width overflows it whole)."""
    import textwrap

    def wrapped(label: str, text: str) -> list[str]:
        return textwrap.wrap(text, max(width, 40), initial_indent=f"  {label:<13} ", subsequent_indent=" " * 16,
                             break_long_words=False, break_on_hyphens=False) or [f"  {label}"]

    lines = ["mlhpc workloads (entry-point group mlhpc.workloads)"]
    for r in rows:
        sign = "<=" if r["direction"] == "min" else ">="
        formats = ", ".join(r["formats"]) or "-"
        if r["convert_to"]:
            formats += f" (converts to {', '.join(r['convert_to'])})"
        lines += ["", f"{r['name']}  {r['metric']} {sign} {r['target']}", *wrapped("data formats", formats),
                  *wrapped("splits", ", ".join(r["splits"]))]
        configs = r["configs"] or ["-"]
        lines += [f"  {'configs':<13} {configs[0]}", *(" " * 16 + c for c in configs[1:])]
    return "\n".join(lines)


@main.command("run")
@click.argument("config_path", type=click.Path(path_type=Path), required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--instances", type=int, default=None,
              help="Throughput mode: train K independent models at once, each on its share of "
                   "the ranks, each with its own seed and log (same as --set train.instances=K).")
@click.option("--resume", "resume_dir", type=click.Path(path_type=Path), default=None,
              help="Continue the run stopped in this run folder (or from this checkpoint_N.pt); "
                   "the new log goes to that folder and is not a scored run (the MLPerf clock "
                   "may not be paused).")
@click.option("--emulate-accelerator", "emulate", default=None, metavar="NAME|TIME",
              help="Storage mode: the real data path, each training step a sleep of this "
                   "accelerator's published time per sample (h100, a100, ...: the config's "
                   "workload's are listed when a name is unknown) or of this time per sample "
                   "(12.5ms) x the local batch; no evaluation, ends after train.max_epochs; "
                   "`mlhpc report` gives the accelerator utilisation (docs/data.md).")
@click.option("--sweep-accelerators", "sweep", is_flag=True,
              help="With --emulate-accelerator: run storage mode on this node with 1, 2, 4, ... "
                   "ranks (one emulated accelerator each, each keeping the config's local batch) "
                   "into OUTPUT/accelerators_K/ until AU falls below the workload's minimum; "
                   "prints the most accelerators per node that meet it (OUTPUT/sweep.json).")
@click.option("--max-accelerators", type=int, default=None, metavar="N",
              help="With --sweep-accelerators: the most ranks to try (default: this node's CPUs).")
@_friendly
def run_command(config_path: Path | None, overrides: tuple[str, ...], instances: int | None,
                resume_dir: Path | None, emulate: str | None, sweep: bool,
                max_accelerators: int | None) -> None:
    """Train CONFIG's workload to its quality target and write a compliant result log.

    Power: from run_start to run_stop one thread per node reads, each power.interval_s (1 s),
    the node meter (power.node_meter_command, watts) or else every GPU by NVML and the CPU
    package and DRAM RAPL zones under power.powercap_root, into power/result_N/node_K.txt,
    which `mlhpc report` and mlperf_logging's result_summarizer turn into energy to train.
    Without a node meter, fans, power supplies, NICs and disks are not measured; network switches
    never are (an estimate may be added as power/result_N/sw_K.txt). No readable counter: the
    run says so and claims no energy. power.enabled=false turns sampling off. See docs/power.md."""
    from mlhpc import config as cfg
    from mlhpc.run import command
    from mlhpc.progress import RunProgress, print_summary

    if instances is not None:
        overrides = overrides + (f"train.instances={instances}",)
    if emulate is not None:  # quoted: a value such as 12 stays a string and is refused as one
        overrides = overrides + (f"train.emulate_accelerator={json.dumps(emulate)}",)
    if sweep or max_accelerators is not None:  # a sweep of runs, each an `mlhpc run` of its own
        _sweep_accelerators(config_path, overrides, resume_dir, sweep, max_accelerators)
    if resume_dir is not None:
        if config_path is not None or overrides:
            raise ConfigError("--resume: give the run folder alone (its checkpoint holds the config)")
        progress = RunProgress()
        result = command.run(None, on_progress=progress, resume_dir=resume_dir)
    else:
        if config_path is None:
            raise ConfigError("run: give a CONFIG file (or --resume RUN_FOLDER)")
        config = cfg.load(config_path, overrides)
        from mlhpc.run.emulate import emulation

        emulation(config, config.workload)  # an unknown accelerator: one line before anything runs
        progress = RunProgress()
        result = command.run(config, on_progress=progress)
    came = _record_run(Path(result.result_file), progress) if result.result_file else []
    if result.summary:
        print_summary(result.summary)
    if result.signal and result.summary:  # stopped by a signal, checkpoint saved
        echo(f"mlhpc: stopped by {result.signal}; continue with: mlhpc run --resume "
                   f"{Path(result.result_file).parent if result.result_file else '<run folder>'}",
                   err=True)
    # agreed by every rank (`mlhpc.run.outcome.agree`): 0 reached, 1 not, 128 + N signal N; a
    # signal while the finished run was recorded ends the command as that signal asks
    sys.exit(128 + came[0] if came and not result.signal else result.exit_status)


def _sweep_accelerators(config_path: Path | None, overrides: tuple[str, ...], resume_dir: Path | None,
                        sweep: bool, max_accelerators: int | None) -> None:
    """``mlhpc run --sweep-accelerators`` (`mlhpc.run.sweep`): a line as each K starts and ends,
    the table and headline; exit 0 when one accelerator met the minimum, else 1."""
    if not sweep:
        raise ConfigError("--max-accelerators: give it with --sweep-accelerators")
    if resume_dir is not None or config_path is None:
        raise ConfigError("--sweep-accelerators: give a CONFIG file (not --resume)")
    from mlhpc import config as cfg
    from mlhpc.run import sweep as sweeping

    config = cfg.load(config_path, overrides)
    plan = sweeping.Plan.of(config_path, overrides, config)
    result = sweeping.run_sweep(config, plan, max_accelerators, say=echo)
    echo("\n".join(sweeping.table_lines(result)))
    sys.exit(result.exit_status)


def _record_run(log: Path, progress: Any) -> list[int]:
    """The finished run's log in the results store (MLHPC_STORE=none: off): a warning, never a
    raise, and one note saying where it went. A SIGTERM or SIGINT meanwhile abandons the
    recording (`mlhpc.store.record.signals_abandon_recording`); returns the signals that came."""
    from mlhpc.store import record_run
    from mlhpc.store.engine import shown_url
    from mlhpc.store.record import RecordingInterrupted, signals_abandon_recording

    with signals_abandon_recording() as came:
        try:
            run_id = record_run(log.parent, log, lambda m: progress({"kind": "warning", "message": m}))
            if run_id is not None:
                progress({"kind": "note", "message": f"recorded in the results store {shown_url()} as run "
                          f"{run_id} (mlhpc results show {run_id}; MLHPC_STORE=none turns recording off)"})
        except RecordingInterrupted:  # after the store's work: the run was recorded
            pass
    return came


@main.command("stage")
@click.argument("config_path", type=click.Path(path_type=Path), required=False)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
              show_default=True, help=FORMAT_HELP)
@click.option("--list", "list_copies", is_flag=True,
              help="List this node's staged copies (yours, made by mlhpc) with their sizes.")
@click.option("--clean", is_flag=True, help="Remove this node's staged copies (yours, made by mlhpc).")
@click.option("--in", "roots", multiple=True, type=click.Path(path_type=Path),
              help="Folder to look in for --list/--clean (repeatable; default $TMPDIR, else /tmp).")
@_friendly
def stage_command(config_path: Path | None, overrides: tuple[str, ...], fmt: str, list_copies: bool,
                  clean: bool, roots: tuple[Path, ...]) -> None:
    """Copy CONFIG's dataset to node-local storage, timed and verified (copies refuse links out
    of the source and never write through one; a destination must be yours and private).
    --list / --clean: this node's copies in $TMPDIR (else /tmp) or each --in folder, only real
    folders owned by you and marked by mlhpc (links never followed). A run removes the copy it
    made when it ends unless data.staging.keep is true."""
    if list_copies or clean:
        if config_path is not None or overrides:
            raise ConfigError("stage --list/--clean: give no CONFIG (use --in FOLDER to look elsewhere)")
        _staged_copies(list(roots) or None, clean, fmt)
        return
    if config_path is None:
        raise ConfigError("stage: give a CONFIG file (or --list / --clean)")
    from mlhpc import config as cfg
    from mlhpc.run.assemble import stage_only

    result, reports = stage_only(cfg.load(config_path, overrides))
    if not reports:
        return
    if result is None:
        echo("staging is disabled in this config (data.staging.enabled: false); nothing copied")
    elif fmt == "json":
        echo(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        from mlhpc.progress import print_staging

        print_staging(result.to_dict())


def _staged_copies(roots: list[Path] | None, clean: bool, fmt: str) -> None:
    """`mlhpc stage --list` / `--clean` (`mlhpc.data.stage.copies`)."""
    from mlhpc.data.stage.copies import clean as remove_all
    from mlhpc.data.stage.copies import find_copies, render

    copies = find_copies(roots)
    if clean:
        copies, left = remove_all(copies)
        for line in left:  # a copy a run still reads stays
            echo(f"mlhpc: {line}", err=True)
    echo(json.dumps([c.to_dict() for c in copies], indent=2) if fmt == "json" else render(copies, clean))


@main.command("submit")
@click.argument("config_path", type=click.Path(path_type=Path))
@click.option("--nodes", type=int, default=1, show_default=True, help="Nodes to allocate.")
@click.option("--gpus-per-node", type=int, default=0, show_default=True,
              help="GPUs per node; one task per GPU (0: CPU job).")
@click.option("--tasks-per-node", type=int, default=None,
              help="Tasks per node on a CPU job (default: 1, or one per GPU).")
@click.option("--cpus-per-task", type=int, default=None,
              help="CPUs per task (--cpus-per-task); also sets OMP_NUM_THREADS in the job.")
@click.option("--runs", type=int, default=1, show_default=True,
              help="Runs in one results folder (an MLPerf HPC score needs "
                   + ", ".join(f"{n} for {b}" for b, n in rules.ruleset().runs.items()) + ").")
@click.option("--instances", type=int, default=1, show_default=True,
              help="Throughput mode: concurrent model instances per run.")
@click.option("--time", "time_limit", default=None,
              help="Wall-time limit of the whole job (Slurm time: MM, HH:MM:SS, D-HH:MM:SS). "
                   "Default: --runs x --time-per-run, said on stderr.")
@click.option("--time-per-run", default="01:00:00", show_default=True,
              help="Wall time allowed for one run (staging, init, training) when --time is not given.")
@click.option("--partition", default=None, help="Slurm partition (default: the cluster's).")
@click.option("--account", default=None, help="Slurm account to charge (default: yours).")
@click.option("--qos", default=None, help="Slurm quality of service.")
@click.option("--constraint", default=None, help="Node features the job needs (e.g. 'gpu&a100').")
@click.option("--exclusive", is_flag=True, help="Nodes not shared with other jobs.")
@click.option("--job-name", default="mlhpc", show_default=True)
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...",
              help="A campaign: one job per point (the cartesian product of several --sweep), each "
                   "exporting MLHPC_CAMPAIGN=<id> and writing <output.dir>/<id>/<point>. KEY is a "
                   "submit option (nodes, gpus-per-node, tasks-per-node, time, ...) or a config key.")
@click.option("--automl", is_flag=True,
              help="An AutoML search (mlhpc automl): prepare once, one worker per node (or per GPU) "
                   "in one srun step, finish; --time defaults to automl.budget_s plus a margin.")
@click.option("--dry-run", is_flag=True, help="Print the sbatch script(s); submit nothing.")
@_friendly
def submit_command(config_path: Path, nodes: int, gpus_per_node: int, tasks_per_node: int | None,
                   cpus_per_task: int | None, runs: int, instances: int, time_limit: str | None,
                   time_per_run: str, partition: str | None, account: str | None, qos: str | None,
                   constraint: str | None, exclusive: bool, job_name: str,
                   overrides: tuple[str, ...], sweeps: tuple[str, ...], automl: bool,
                   dry_run: bool) -> None:
    """Render an sbatch script running CONFIG R times under srun, and submit it (--sweep: one
    script per point of a campaign; --automl: one AutoML search)."""
    from mlhpc.slurm_job import Allocation, SubmitOptions
    from mlhpc.store.campaign import render_jobs, submit_jobs

    allocation = Allocation(nodes=nodes, gpus_per_node=gpus_per_node, tasks_per_node=tasks_per_node,
                            cpus_per_task=cpus_per_task, partition=partition, account=account, qos=qos,
                            constraint=constraint, exclusive=exclusive, job_name=job_name)
    options = SubmitOptions(allocation, runs=runs, instances=instances, time_limit=time_limit,
                            time_per_run=time_per_run)
    if automl:
        _submit_search(config_path, options, list(overrides), dry_run)
        return
    # every job's config and script checked before anything is queued
    campaign, jobs = render_jobs(config_path, options, list(overrides), list(sweeps))
    for note in dict.fromkeys(note for job in jobs for note in job.notes):
        echo(note, err=True)
    if campaign is not None:
        echo(f"mlhpc: campaign {campaign}: {len(jobs)} job(s), MLHPC_CAMPAIGN={campaign}, "
                   f"read with: mlhpc results scaling --campaign {campaign} --benchmark ...", err=True)
    for job in jobs:
        if campaign is not None:
            echo(f"mlhpc: job {' '.join(job.point)} -> {job.output_dir}", err=True)
        if dry_run:
            echo(job.script, nl=False)
    for job_id in submit_jobs(campaign, jobs, dry_run=dry_run):
        echo(job_id)


#: Options of `mlhpc submit` that an AutoML search's job does not take: parameter -> (option, why).
_NOT_WITH_AUTOML = {"runs": ("--runs", "the search's trials are its runs"),
                    "instances": ("--instances", "the search's workers are its instances"),
                    "sweeps": ("--sweep", "a search is one job"),
                    "time_per_run": ("--time-per-run", "--time defaults to automl.budget_s plus a margin")}


def _submit_search(config_path: Path, options: SubmitOptions, overrides: list[str], dry_run: bool) -> None:
    """`mlhpc submit CONFIG --automl` (`mlhpc.slurm_automl`): an option given that a search does
    not take is refused (one line, exit 2)."""
    from click.core import ParameterSource

    from mlhpc.slurm_automl import render_search, submit_search

    context = click.get_current_context()
    for name, (flag, why) in _NOT_WITH_AUTOML.items():
        if context.get_parameter_source(name) not in (None, ParameterSource.DEFAULT):
            raise ConfigError(f"{flag}: not with --automl ({why})")
    job = render_search(config_path, options, overrides)
    for note in job.notes:
        echo(note, err=True)
    if dry_run:
        echo(job.script, nl=False)
    for job_id in submit_search(job, dry_run):
        echo(job_id)


@main.command("profile")
@click.argument("config_path", type=click.Path(path_type=Path))
@click.option("--steps", type=int, default=5, show_default=True,
              help="Profiled training steps (1 .. 100000).")
@click.option("--warmup", type=int, default=2, show_default=True,
              help="Untimed steps first (0 .. 100000).")
@click.option("--trace", "trace_path", type=click.Path(path_type=Path), default=None,
              help="Chrome/Perfetto trace file (default: <output.dir>/profile/<workload>-trace.json).")
@click.option("--roofline", "roofline_path", type=click.Path(path_type=Path), default=None,
              help="Also measure the machine's ceilings (a large GEMM and convolution at the step's "
                   "precision, a large copy's bandwidth) and draw the step and its heaviest operators "
                   "under them in this PNG (HPC AI500's roofline).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help=SET_HELP)
@_friendly
def profile_command(config_path: Path, steps: int, warmup: int, trace_path: Path | None,
                    roofline_path: Path | None, overrides: tuple[str, ...]) -> None:
    """A few training steps under torch.profiler: time per phase and operator, memory, trace;
    with --roofline, the step against the machine's measured ceilings."""
    from rich.table import Table

    from mlhpc import config as cfg
    from mlhpc.run.profile import profile

    result = profile(cfg.load(config_path, overrides), steps=steps, warmup=warmup,
                     trace_path=trace_path, roofline_path=roofline_path)
    out = console()
    phases = Table(title=f"time per step phase (ms, local batch {result.local_batch_size}, "
                   f"{result.samples_per_s:.1f} samples/s)")
    for name in result.phase_ms:
        phases.add_column(name, justify="right")
    phases.add_row(*(f"{v:.2f}" for v in result.phase_ms.values()))
    out.print(phases)
    ops = Table(title="operators by self CPU time per step")
    for col in ("operator", "calls", "self CPU ms", "share"):
        ops.add_column(col, justify="left" if col == "operator" else "right")
    for row in result.operators:
        ops.add_row(row["name"], str(row["calls"]), f"{row['self_cpu_ms']:.2f}", f"{100 * row['share']:.1f}%")
    out.print(ops)
    mem = Table(title="memory (MB)")
    for key, value in result.memory.items():
        mem.add_column(key.replace("_bytes", ""), justify="right")
    mem.add_row(*("n/a" if v is None else f"{v / 1e6:.2f}" for v in result.memory.values()))
    out.print(mem)
    out.print(f"FLOPs per sample: forward {result.flops['forward_flops'] / 1e9:.3f} GFLOP, "
                  f"forward+backward {result.flops['train_flops'] / 1e9:.3f} GFLOP", highlight=False)
    out.print(f"trace: {result.trace} (open in chrome://tracing or ui.perfetto.dev)", highlight=False,
                  soft_wrap=True)  # the path in one piece, to be copied
    if result.roofline is not None:
        c, step = result.roofline["ceilings"], result.roofline["step"]
        out.print(f"roofline: {result.roofline_png} (ceilings at {c['precision']}: GEMM "
                  f"{c['gemm_flop_per_s'] / 1e9:.4g} GFLOP/s, convolution {c['conv_flop_per_s'] / 1e9:.4g} "
                  f"GFLOP/s, copy {c['copy_bytes_per_s'] / 1e9:.4g} GB/s; step {step['flop_per_s'] / 1e9:.4g} "
                  f"GFLOP/s at {step['intensity_flop_per_byte']:.3g} FLOP/byte)", highlight=False, soft_wrap=True)


@main.group("config")
def config_group() -> None:
    """Configs: the reference of every key."""


@config_group.command("reference")
@click.option("--out", "out_path", type=click.Path(path_type=Path), default=None,
              help="Write the Markdown here (e.g. docs/config-reference.md) instead of printing it.")
@_friendly
def config_reference_command(out_path: Path | None) -> None:
    """Every config key: type, default, allowed values, unit, meaning (from the schema)."""
    from mlhpc.config import reference as config_reference

    if out_path is None:
        echo(config_reference.render(), nl=False)
    else:
        from mlhpc.data.outputs import output_file
        from mlhpc.run.result import write_text_atomic  # OutputError when it cannot be written

        write_text_atomic(output_file(out_path, "--out"), config_reference.render())
        echo(f"wrote {out_path}")


main.add_command(report_command)
main.add_command(automl_command)
main.add_command(data_group)
main.add_command(results_group)
main.add_command(validate_command)

if __name__ == "__main__":  # pragma: no cover
    main()
