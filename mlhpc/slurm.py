"""Render and submit Slurm batch scripts that run ``mlhpc run`` R times into one results folder.

The script a job runs (`render_sbatch`, filling the template ``mlhpc/templates/sbatch.sh.in``,
package data, with `render_template`):

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
  ``MASTER_PORT`` and its own folder ``<output_dir>/instance_<i>``;
- power (docs/power.md, "On Slurm"): after each run of a multi-node, one-instance job, the power
  files ``power/result_N/node_K.txt`` missing on the batch host (a node-local output folder) are
  fetched from the K-th node, never over a file and never through a link; at the end, each run's
  time and energy (``mlhpc report --level runs``) and Slurm's ``sacct ... ConsumedEnergy``,
  guarded so that neither can fail the job;
- ``env`` is exported first (``mlhpc submit --sweep`` exports ``MLHPC_CAMPAIGN`` there).

Quoting: every value that reaches the body is quoted with `shlex.quote` (`render_template`
quotes any plain string it inserts), so config paths, overrides and output folders arrive in
``srun``'s argv byte for byte, whatever they contain.
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
from dataclasses import dataclass
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Mapping, Sequence

from mlhpc.config import parse_override
from mlhpc.errors import ConfigError, MlhpcError
from mlhpc.slurm_job import SbatchJob

MAX_RUNS = 1000  # runs of one job run one after the other; a benchmark's score takes 5 or 10
_PLACEHOLDER = re.compile(r"@([a-z_]+)@")
_SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-]+(,[A-Za-z0-9_.\-]+)*$")
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SBATCH_UNSAFE = ("\n", "\r", "\0")  # a #SBATCH value cannot hold these, even quoted


class SubmitError(MlhpcError):
    """sbatch is missing, or refused the job (the message carries sbatch's own words)."""


def render_sbatch(job: SbatchJob) -> str:
    """The text of an sbatch script running ``mlhpc run CONFIG`` ``runs`` times (module docstring),
    the template ``mlhpc/templates/sbatch.sh.in`` filled in for ``job``.

    Returns:
        the script text (bash, ``#!/bin/bash`` first).

    Raises:
        ConfigError: an impossible request (nodes, runs, instances, tasks or cpus < 1, more than
            ``MAX_RUNS`` runs; tasks that do not split between instances; tasks per node that
            contradict one task per GPU; seeds of the wrong length), a partition, account or time
            Slurm would not accept, a value sbatch cannot carry in a ``#SBATCH`` line, a malformed
            override, a missing config file or a bad environment variable name.
    """
    parts = check_job(job)
    seeds = _run_seeds(job.seeds, job.runs)
    return render_template(template_text("sbatch.sh.in"), {**parts.values, **_run_values(job, parts, seeds)})


def _run_values(job: SbatchJob, parts: JobParts, seeds: list[int]) -> dict[str, object]:
    """The run template's own values (`render_template`'s rules): runs, seeds, the srun steps."""
    layout, out = parts.layout, parts.output_dir
    head = _srun(layout, job.mpi) + [parts.python, "-m", "mlhpc", "run", str(parts.config)]
    user_seed = any(text.split("=", 1)[0].strip() == "train.seed" for text in job.overrides)
    return {
        "runs": job.runs, "instances": job.instances, "last_run": job.runs - 1,
        "seeds": Verbatim(" ".join(str(s) for s in seeds)),
        "steps": _run_steps(layout, head, out, job.overrides, not user_seed, job.master_port),
        # node-local output.dir: node K's power files fetched after each run (one instance only;
        # an instance's node K is not the job's)
        "collect_nodes": job.allocation.nodes if job.allocation.nodes > 1 and layout.instances == 1 else None,
    }


@dataclass(frozen=True)
class JobParts:
    """A checked job (`check_job`): its tasks, absolute config and results folder, interpreter,
    and the template ``values`` every job script shares (`render_template`'s rules)."""

    layout: _Layout
    config: Path
    output_dir: Path
    python: str
    values: dict[str, object]


def check_job(job: SbatchJob) -> JobParts:
    """``job`` checked, and the values every job script shares: the ``#SBATCH`` lines, ``stamp``,
    ``workdir``, ``output_dir``, ``body_log_dir``, ``exports``, ``python`` (mlhpc/templates/).

    Raises:
        ConfigError: as `render_sbatch` (counts, Slurm syntax, overrides, config file, env).
    """
    layout = _layout(job)
    _check_slurm_syntax(job)
    for text in job.overrides:
        parse_override(text)  # raises ConfigError on a malformed one
    env = _environment(job.env, job.allocation.cpus_per_task)
    config = Path(job.config_path).expanduser()
    if not config.is_file():
        raise ConfigError(f"{job.config_path}: config file not found")
    out = Path(job.output_dir).expanduser().absolute()
    python = job.python or sys.executable
    return JobParts(layout, config.resolve(), out, python, _values(job, layout, out, python, env))


def _values(job: SbatchJob, layout: _Layout, out: Path, python: str,
            env: Mapping[str, str]) -> dict[str, object]:
    """The shared template values of a checked job (`check_job`)."""
    alloc = job.allocation
    where = Path(job.workdir).expanduser().absolute() if job.workdir is not None else Path.cwd()
    # Slurm reads "%" in an --output path as a pattern, and a "\\" anywhere turns every pattern
    # off (%j included): such folders, and those sbatch cannot quote, get the log from the body.
    log_in_body = any(c in str(out) for c in _SBATCH_UNSAFE + ("%", "\\", '"'))
    sbatch_output = _sbatch_value("output_dir", str(out) + "/slurm-%j.out") if not log_in_body else None
    return {
        "job_name": Verbatim(_sbatch_value("job_name", _clean_label(alloc.job_name))),
        "nodes": alloc.nodes, "tasks_per_node": layout.tasks_per_node, "gpus_per_node": alloc.gpus_per_node,
        "sbatch_gpus_per_node": alloc.gpus_per_node or None, "sbatch_cpus_per_task": alloc.cpus_per_task,
        # checked against Slurm's syntax, which no shell quoting can be part of
        "time": Verbatim(job.time),
        "sbatch_partition": Verbatim(alloc.partition) if alloc.partition else None,
        "sbatch_account": Verbatim(alloc.account) if alloc.account else None,
        "sbatch_qos": Verbatim(alloc.qos) if alloc.qos else None,
        "sbatch_constraint": (Verbatim(_sbatch_value("constraint", alloc.constraint))
                              if alloc.constraint else None),
        "sbatch_exclusive": Verbatim("--exclusive") if alloc.exclusive else None,
        "sbatch_output": Verbatim(sbatch_output) if sbatch_output else None,
        "stamp": Verbatim(datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")),
        "workdir": str(where), "output_dir": str(out), "body_log_dir": str(out) if log_in_body else None,
        "exports": [Verbatim(f"export {key}={shlex.quote(str(value))}") for key, value in sorted(env.items())],
        "python": python,
    }


class Verbatim(str):
    """Text `render_template` inserts as it is: already quoted (or built only of safe parts)."""


def render_template(template: str, values: Mapping[str, object]) -> str:
    """Fill ``@name@`` placeholders of ``template`` (a bash script) from ``values``.

    Rules, line by line: a line holding a placeholder whose value is None is left out (an
    optional ``#SBATCH`` option); a line that is nothing but one placeholder (plus indentation)
    whose value is a list becomes one line per item, indented alike (none for an empty list);
    otherwise each placeholder becomes its value: an ``int`` as digits, a `Verbatim` as it is,
    any other ``str`` through `shlex.quote` -- so a user's value reaches bash as one word, byte
    for byte, unless the code building ``values`` quoted it itself.

    Raises:
        KeyError: a placeholder without a value, or a value no placeholder uses (the template
            and the code disagree: a bug, not bad input).
    """
    used: set[str] = set()
    lines = []
    for line in template.splitlines():
        names = _PLACEHOLDER.findall(line)
        used.update(names)
        missing = [name for name in names if name not in values]
        if missing:
            raise KeyError(f"template placeholder @{missing[0]}@ has no value")
        if any(values[name] is None for name in names):
            continue
        whole = _PLACEHOLDER.fullmatch(line.strip())
        if whole and isinstance(values[whole.group(1)], list):
            indent = line[: len(line) - len(line.lstrip())]
            lines += [indent + _text(item) for item in values[whole.group(1)]]
            continue
        lines.append(_PLACEHOLDER.sub(lambda m: _text(values[m.group(1)]), line))
    unused = sorted(set(values) - used)
    if unused:
        raise KeyError(f"value {unused[0]!r} has no @{unused[0]}@ placeholder in the template")
    return "\n".join(lines) + "\n"


def _text(value: object) -> str:
    if isinstance(value, (Verbatim, int)):
        return str(value)
    if isinstance(value, str):
        return shlex.quote(value)
    raise TypeError(f"template value {value!r}: expected str, Verbatim or int")


def template_text(name: str) -> str:
    """A template shipped with the package (mlhpc/templates/, package data)."""
    return resources.files("mlhpc").joinpath("templates", name).read_text(encoding="utf-8")


@dataclass(frozen=True)
class _Layout:
    """Tasks of the allocation and of each weak-scaling instance."""

    tasks_per_node: int
    instances: int
    instance_nodes: int
    instance_tasks: int


def _layout(job: SbatchJob) -> _Layout:
    """Counts checked; tasks per node (one per GPU when there are GPUs), each instance's share."""
    alloc = job.allocation
    for name, value, least in (("nodes", alloc.nodes, 1), ("runs", job.runs, 1), ("instances", job.instances, 1),
                               ("gpus_per_node", alloc.gpus_per_node, 0), ("master_port", job.master_port, 1)):
        if not isinstance(value, int) or value < least:
            raise ConfigError(f"slurm {name}: expected an integer >= {least}, got {value!r}")
    if job.runs > MAX_RUNS:
        raise ConfigError(f"slurm runs: at most {MAX_RUNS} runs in one job, got {job.runs}")
    tasks_per_node = alloc.tasks_per_node
    if alloc.gpus_per_node > 0:
        if tasks_per_node not in (None, alloc.gpus_per_node):
            raise ConfigError(f"slurm tasks_per_node: one task per GPU means {alloc.gpus_per_node}, "
                              f"got {tasks_per_node}")
        tasks_per_node = alloc.gpus_per_node
    tasks_per_node = 1 if tasks_per_node is None else tasks_per_node
    if not isinstance(tasks_per_node, int) or tasks_per_node < 1:
        raise ConfigError(f"slurm tasks_per_node: expected an integer >= 1, got {tasks_per_node!r}")
    cpus = alloc.cpus_per_task
    if cpus is not None and (not isinstance(cpus, int) or cpus < 1):
        raise ConfigError(f"slurm cpus_per_task: expected an integer >= 1, got {cpus!r}")
    inst_nodes, inst_tasks = _split_instances(alloc.nodes, tasks_per_node, job.instances)
    return _Layout(tasks_per_node, job.instances, inst_nodes, inst_tasks)


def _check_slurm_syntax(job: SbatchJob) -> None:
    """Values Slurm parses itself must match its syntax (they go into the script unquoted)."""
    if not _SLURM_TIME.match(str(job.time)):
        raise ConfigError(f"slurm time: {job.time!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS)")
    alloc = job.allocation
    for name, value in (("partition", alloc.partition), ("account", alloc.account), ("qos", alloc.qos)):
        if value is not None and not _SLURM_NAME.match(value):
            raise ConfigError(f"slurm {name}: {value!r} is not a Slurm {name} name")
    if not re.match(r"^[a-z0-9_]+$", job.mpi):
        raise ConfigError(f"slurm mpi: {job.mpi!r} is not an srun --mpi plugin name")


def _run_seeds(seeds: Sequence[int] | None, runs: int) -> list[int]:
    """One seed per run: the given ones, or ``runs`` distinct ones drawn from the OS."""
    if seeds is None:
        seeds = random.SystemRandom().sample(range(1, 2**31 - 1), runs)
    seeds = [int(s) for s in seeds]
    if len(seeds) != runs:
        raise ConfigError(f"slurm seeds: expected {runs} (one per run), got {len(seeds)}")
    return seeds


def _environment(env: Mapping[str, str] | None, cpus_per_task: int | None) -> dict[str, str]:
    env = dict(env or {})
    for key in env:
        if not _ENV_NAME.match(key):
            raise ConfigError(f"slurm env: {key!r} is not an environment variable name")
    if cpus_per_task is not None:
        env.setdefault("OMP_NUM_THREADS", str(cpus_per_task))
    return env


def _run_steps(layout: _Layout, head: list[str], out: Path, overrides: Sequence[str],
               seed_each_run: bool, master_port: int) -> list[Verbatim]:
    """The body of one run: one step ``<head> --set output.dir=...`` per instance (concurrent,
    each waited for, when there are several).

    With ``seed_each_run`` each step gets ``--set train.seed=<this run's seed + instance>``
    from the script's SEEDS array (otherwise the user's overrides set the seed).
    """
    q = shlex.quote
    lines: list[Verbatim] = []
    for i in range(layout.instances):
        inst_out = out if layout.instances == 1 else out / f"instance_{i}"
        cmd = " ".join(q(a) for a in [*head, "--set", f"output.dir={inst_out}"])
        run_seed = "${SEEDS[$run]}" if layout.instances == 1 else f"$((SEEDS[run] + {i}))"
        seed = f' --set "train.seed={run_seed}"' if seed_each_run else ""
        sets = "".join(f" --set {q(text)}" for text in overrides)
        step = f"MASTER_PORT={master_port + i} {cmd}{seed}{sets}"
        if layout.instances == 1:
            lines.append(Verbatim(f"{step} || failed=1"))
        else:
            lines += [Verbatim(f"{step} &"), Verbatim(f"pid_{i}=$!")]
    if layout.instances > 1:
        lines += [Verbatim(f'wait "$pid_{i}" || failed=1') for i in range(layout.instances)]
    return lines


def _srun(layout: _Layout, mpi: str) -> list[str]:
    """``srun`` and its options for the step of one instance."""
    srun = ["srun", f"--mpi={mpi}", f"--nodes={layout.instance_nodes}", f"--ntasks={layout.instance_tasks}",
            f"--ntasks-per-node={min(layout.tasks_per_node, layout.instance_tasks)}", "--kill-on-bad-exit=1"]
    return srun + ["--exact"] if layout.instances > 1 else srun


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


def time_seconds(text: str) -> int:
    """Seconds of a Slurm time (``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``; sbatch's own reading).

    Raises:
        ConfigError: not a finite Slurm time.
    """
    text = str(text)
    if not _SLURM_TIME.match(text) or text in ("UNLIMITED", "INFINITE"):
        raise ConfigError(f"slurm time: {text!r} is not a Slurm time (MM, HH:MM:SS, D-HH:MM:SS)")
    days, _, rest = text.rpartition("-")
    parts = [int(p) for p in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        return int(days) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]
    if len(parts) == 1:  # MM
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def job_time(runs: int, per_run: str) -> str:
    """The wall-time limit of a job of ``runs`` runs one after the other, each allowed ``per_run``
    (a Slurm time), as ``D-HH:MM:SS``.

    Raises:
        ConfigError: ``per_run`` is not a finite Slurm time.
    """
    total = max(1, runs) * time_seconds(per_run)
    days, rest = divmod(total, 86400)
    return f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
