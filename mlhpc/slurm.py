"""Render and submit Slurm batch scripts that run ``mlhpc run`` R times into one results folder.

The script a job runs (`render_sbatch`):

- ``#SBATCH`` directives for the allocation: nodes, tasks per node (one per GPU, or one per
  requested CPU slot when there are no GPUs), GPUs per node, CPUs per task, wall time, partition,
  account, job name and the Slurm log (``<output_dir>/slurm-%j.out``);
- a body that changes to the folder the script was rendered in (so relative paths in the config
  mean what they meant there), then runs, R times one after the other,
  ``srun --mpi=pmi2 ... <python> -m mlhpc run CONFIG --set output.dir=<output_dir>
  --set train.seed=<seed of this run> [--set k=v ...]``. The ``mlhpc run`` harness names each
  log the next free ``result_N.txt`` in the folder, so R runs leave result_0 .. result_R-1 side by
  side, the layout MLCommons' result summarizer reads. A run that fails does not stop the next;
  the job's exit status is 1 when any run failed;
- with ``instances > 1`` (weak scaling, MLPerf HPC rules section "Weak scaling"), each run starts
  that many concurrent ``srun`` steps, each with its share of nodes and tasks, its own
  ``MASTER_PORT`` and its own folder ``<output_dir>/instance_<i>``.

Quoting: every value that reaches the body is quoted with `shlex.quote`, so config paths,
overrides and output folders arrive in ``srun``'s argv byte for byte, whatever they contain.
``#SBATCH`` lines are read by sbatch, not bash: sbatch takes a double-quoted value with ``\\"``
and ``\\\\`` escapes and expands nothing (checked with Slurm 22.05). Partition, account and time
must match Slurm's own syntax; the job name is double-quoted and escaped, its newlines become
``_``; an output folder holding a newline, ``"``, ``\\`` or ``%`` (a filename pattern to Slurm)
gets no ``#SBATCH --output`` line: the body sends its output to ``<output_dir>/slurm-<job id>.out``
itself once the folder exists.

Slurm's PMI-2 plugin (``srun --mpi=pmi2``) is what the PyPI ``mpich`` wheel's MPI library speaks
out of the box (checked with MPICH 5.0 and Slurm 22.05): no MPICH-specific environment needed.
"""

from __future__ import annotations

import random
import re
import shlex
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Optional, Sequence

from mlhpc.config import parse_override
from mlhpc.errors import ConfigError, MlhpcError

DEFAULT_MASTER_PORT = 29511
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*$")
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_UNSAFE = ("\n", "\r", "\0")  # a #SBATCH value cannot hold these, even quoted


class SubmitError(MlhpcError):
    """sbatch is missing, or refused the job (the message carries sbatch's own words)."""


def render_sbatch(
    config_path: Path | str,
    *,
    nodes: int = 1,
    gpus_per_node: int = 0,
    tasks_per_node: Optional[int] = None,
    runs: int = 1,
    time: str = "01:00:00",
    partition: Optional[str] = None,
    account: Optional[str] = None,
    job_name: str = "mlhpc",
    output_dir: Path | str = "results",
    overrides: Sequence[str] = (),
    instances: int = 1,
    cpus_per_task: Optional[int] = None,
    seeds: Optional[Sequence[int]] = None,
    mpi: str = "pmi2",
    python: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    workdir: Optional[Path | str] = None,
    master_port: int = DEFAULT_MASTER_PORT,
) -> str:
    """The text of an sbatch script running ``mlhpc run CONFIG`` ``runs`` times (module docstring).

    Args:
        config_path: the run config; made absolute (it must exist).
        nodes: nodes to allocate (>= 1).
        gpus_per_node: GPUs per node; when > 0 there is one task per GPU.
        tasks_per_node: tasks per node when ``gpus_per_node`` is 0 (default 1); with GPUs it may
            only repeat ``gpus_per_node``.
        runs: sequential runs of the benchmark (>= 1), each a fresh ``result_N.txt``.
        time: wall-time limit, in a Slurm time format (``"MM"``, ``"HH:MM:SS"``, ``"D-HH:MM"``...).
        partition / account: Slurm partition and account (None: the cluster's default).
        job_name: the job's label (characters sbatch cannot take are replaced by ``_``).
        output_dir: the results folder of every run (``--set output.dir=``), made absolute; the
            Slurm log goes to ``<output_dir>/slurm-%j.out``.
        overrides: extra ``key=value`` config overrides, passed as ``--set`` in this order, after
            the script's own ``output.dir`` and ``train.seed`` (so they win).
        instances: concurrent training instances per run (weak scaling); nodes x tasks must split
            evenly between them.
        cpus_per_task: ``--cpus-per-task`` (and ``OMP_NUM_THREADS``) when given.
        seeds: one ``train.seed`` per run (instance i of a run adds i); default: ``runs``
            distinct random seeds drawn now (the MLPerf rules want each run seeded differently)
            -- unless ``overrides`` set ``train.seed``, which then holds for every run.
        mpi: srun's ``--mpi`` plugin (``"pmi2"``; ``"pmix"`` or ``"none"`` elsewhere).
        python: the interpreter the job runs (default: ``sys.executable``, the one rendering, so
            the job finds this install of mlhpc).
        env: extra environment variables exported before the runs.
        workdir: folder the job changes to first (default: the current folder).
        master_port: torch.distributed port of instance 0 (instance i uses ``master_port + i``).

    Returns:
        the script text (bash, ``#!/bin/bash`` first).

    Raises:
        ConfigError: an impossible request (nodes, runs, instances, tasks or cpus < 1; tasks that
            do not split between instances; tasks per node that contradict one task per GPU; seeds
            of the wrong length), a partition, account or time Slurm would not accept, a value
            sbatch cannot carry in a ``#SBATCH`` line, a malformed override, a missing config file
            or a bad environment variable name.
    """
    for name, value, least in (("nodes", nodes, 1), ("runs", runs, 1), ("instances", instances, 1),
                               ("gpus_per_node", gpus_per_node, 0), ("master_port", master_port, 1)):
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"slurm {name}: expected an integer >= {least}, got {value!r}")
    if gpus_per_node > 0:
        if tasks_per_node not in (None, gpus_per_node):
            raise ConfigError(f"slurm tasks_per_node: one task per GPU means {gpus_per_node}, "
                              f"got {tasks_per_node}")
        tasks_per_node = gpus_per_node
    tasks_per_node = 1 if tasks_per_node is None else tasks_per_node
    if not isinstance(tasks_per_node, int) or tasks_per_node < 1:
        raise ConfigError(f"slurm tasks_per_node: expected an integer >= 1, got {tasks_per_node!r}")
    if cpus_per_task is not None and (not isinstance(cpus_per_task, int) or cpus_per_task < 1):
        raise ConfigError(f"slurm cpus_per_task: expected an integer >= 1, got {cpus_per_task!r}")
    inst_nodes, inst_tasks = _split_instances(nodes, tasks_per_node, instances)
    if not _SLURM_TIME.match(str(time)):
        raise ConfigError(f"slurm time: {time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS)")
    for name, value in (("partition", partition), ("account", account)):
        if value is not None and not _SLURM_NAME.match(value):
            raise ConfigError(f"slurm {name}: {value!r} is not a Slurm {name} name")
    if not re.match(r"^[a-z0-9_]+$", mpi):
        raise ConfigError(f"slurm mpi: {mpi!r} is not an srun --mpi plugin name")
    for text in overrides:
        parse_override(text)  # raises ConfigError on a malformed one
    user_seed = any(text.split("=", 1)[0].strip() == "train.seed" for text in overrides)
    if seeds is None:
        draw = random.SystemRandom()
        seeds = draw.sample(range(1, 2**31 - 1), runs)
    seeds = [int(s) for s in seeds]
    if len(seeds) != runs:
        raise ConfigError(f"slurm seeds: expected {runs} (one per run), got {len(seeds)}")
    env = dict(env or {})
    for key in env:
        if not _ENV_NAME.match(key):
            raise ConfigError(f"slurm env: {key!r} is not an environment variable name")
    if cpus_per_task is not None:
        env.setdefault("OMP_NUM_THREADS", str(cpus_per_task))

    config = Path(config_path).expanduser()
    if not config.is_file():
        raise ConfigError(f"{config_path}: config file not found")
    config = config.resolve()
    out = Path(output_dir).expanduser().absolute()
    where = Path(workdir).expanduser().absolute() if workdir is not None else Path.cwd()
    python = python or sys.executable
    q = shlex.quote

    lines = ["#!/bin/bash"]
    lines.append(f"#SBATCH --job-name={_sbatch_value('job_name', _clean_label(job_name))}")
    lines.append(f"#SBATCH --nodes={nodes}")
    lines.append(f"#SBATCH --ntasks-per-node={tasks_per_node}")
    if gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={gpus_per_node}")
    if cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={cpus_per_task}")
    lines.append(f"#SBATCH --time={time}")
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    # Slurm reads "%" in an --output path as a pattern, and a "\\" anywhere turns every pattern
    # off (%j included): such folders, and those sbatch cannot quote, get the log from the body.
    log_in_body = any(c in str(out) for c in _SBATCH_UNSAFE + ("%", "\\", '"'))
    if not log_in_body:
        lines.append(f"#SBATCH --output={_sbatch_value('output_dir', str(out) + '/slurm-%j.out')}")
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    lines += [
        "",
        f"# Rendered by mlhpc.slurm.render_sbatch at {stamp}: {runs} run(s) x {instances} instance(s)",
        f"# of {nodes} node(s) x {tasks_per_node} task(s), {gpus_per_node} GPU(s) per node.",
        "set -uo pipefail",
        f"cd -- {q(str(where))} || exit 1",
        f"mkdir -p -- {q(str(out))} || exit 1",
    ]
    if log_in_body:
        lines.append(f'exec >>{q(str(out))}/slurm-"$SLURM_JOB_ID".out 2>&1')
    for key, value in sorted(env.items()):
        lines.append(f"export {key}={q(str(value))}")
    lines.append(f"SEEDS=({' '.join(str(s) for s in seeds)})")
    lines.append("failed=0")
    lines.append(f"for run in $(seq 0 {runs - 1}); do")
    lines.append(f'    echo "mlhpc: run $((run + 1)) of {runs} (train.seed ${{SEEDS[$run]}}) starting $(date -u +%FT%TZ)"')
    srun = ["srun", f"--mpi={mpi}", f"--nodes={inst_nodes}", f"--ntasks={inst_tasks}",
            f"--ntasks-per-node={min(tasks_per_node, inst_tasks)}", "--kill-on-bad-exit=1"]
    if instances > 1:
        srun.append("--exact")
    for i in range(instances):
        inst_out = out if instances == 1 else out / f"instance_{i}"
        argv = srun + [python, "-m", "mlhpc", "run", str(config), "--set", f"output.dir={inst_out}"]
        cmd = " ".join(q(a) for a in argv)
        run_seed = "${SEEDS[$run]}" if instances == 1 else f"$((SEEDS[run] + {i}))"
        seed = "" if user_seed else f' --set "train.seed={run_seed}"'
        sets = "".join(f" --set {q(text)}" for text in overrides)
        port = f"MASTER_PORT={master_port + i} "
        if instances == 1:
            lines.append(f"    {port}{cmd}{seed}{sets} || failed=1")
        else:
            lines.append(f"    {port}{cmd}{seed}{sets} &")
            lines.append(f"    pid_{i}=$!")
    if instances > 1:
        for i in range(instances):
            lines.append(f"    wait \"$pid_{i}\" || failed=1")
    lines.append("done")
    lines.append('echo "mlhpc: all runs finished $(date -u +%FT%TZ), failed=$failed"')
    lines.append("exit $failed")
    return "\n".join(lines) + "\n"


def submit(script: str, *, dry_run: bool, sbatch: str = "sbatch", timeout_s: float = 120.0) -> list[str]:
    """Submit ``script`` with ``sbatch --parsable`` (script on stdin); returns ``[job_id]``.

    With ``dry_run`` nothing is submitted and ``[]`` is returned (the caller prints the script).
    The folders of the script's ``#SBATCH --output``/``--error`` files are created first, since
    Slurm cannot create them and would lose the job's log.

    Raises:
        SubmitError: ``sbatch`` is not on PATH, does not answer within ``timeout_s``, refuses the
            job (its message is quoted), or prints no job id.
    """
    if dry_run:
        return []
    exe = shutil.which(sbatch)
    if exe is None:
        raise SubmitError(f"{sbatch}: not found on PATH; submit from a Slurm login node or use --dry-run")
    for folder in _log_folders(script):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SubmitError(f"{folder}: cannot create the Slurm log folder ({exc.strerror})") from None
    try:
        proc = subprocess.run([exe, "--parsable"], input=script, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise SubmitError(f"{exe}: no answer in {timeout_s:.0f} s (is slurmctld up?)") from None
    except OSError as exc:
        raise SubmitError(f"{exe}: cannot run ({exc.strerror})") from None
    if proc.returncode != 0:
        why = " ".join((proc.stderr or proc.stdout).split()) or f"exit status {proc.returncode}"
        raise SubmitError(f"sbatch refused the job: {why}")
    ids = [line.split(";")[0].strip() for line in proc.stdout.splitlines() if line.strip()]
    if not ids or not ids[-1].isdigit():
        raise SubmitError(f"sbatch printed no job id: {proc.stdout.strip()!r}")
    return ids[-1:]


def _split_instances(nodes: int, tasks_per_node: int, instances: int) -> tuple[int, int]:
    """(nodes, tasks) of each instance; raises ConfigError when they do not split evenly."""
    total = nodes * tasks_per_node
    if total % instances:
        raise ConfigError(f"slurm instances: {nodes} node(s) x {tasks_per_node} task(s) = {total} "
                          f"tasks do not split into {instances} instances")
    if instances <= nodes:
        if nodes % instances:
            raise ConfigError(f"slurm instances: {nodes} nodes do not split into {instances} instances")
        return nodes // instances, total // instances
    if instances % nodes:
        raise ConfigError(f"slurm instances: {instances} instances do not share {nodes} nodes evenly")
    return 1, total // instances


def _clean_label(text: str) -> str:
    cleaned = "".join("_" if (c in _SBATCH_UNSAFE or not c.isprintable()) else c for c in str(text))
    return cleaned.strip() or "mlhpc"


def _sbatch_value(name: str, value: str) -> str:
    """``value`` double-quoted and escaped for a ``#SBATCH`` line (sbatch's rules, not bash's)."""
    bad = [c for c in _SBATCH_UNSAFE if c in value]
    if bad:
        raise ConfigError(f"slurm {name}: {value!r} holds {bad[0]!r}, which an #SBATCH line cannot carry")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sbatch_unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = re.sub(r'\\(.)', r"\1", value[1:-1])
    return value


def _log_folders(script: str) -> list[Path]:
    folders = []
    for line in script.splitlines():
        match = re.match(r'^#SBATCH\s+--(output|error)=(.*)$', line.strip())
        if match:
            value = _sbatch_unquote(match.group(2))
            folders.append(Path(value).parent)
    return folders
