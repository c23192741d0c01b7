"""Campaigns: ``mlhpc submit --sweep KEY=V1,V2,...`` -> one job per point, one shared campaign id.

`sweep_points` expands the sweep specifications into one ``KEY=VALUE`` list per job (the
cartesian product when several keys are swept) and a campaign id. `render_jobs` (the submit
command's one call, with or without a sweep) renders one sbatch script per point: a key that is
an ``mlhpc submit`` option (`SUBMIT_KEYS`: nodes, gpus-per-node, tasks-per-node, time, ...) sets
that option for the point, any other key is a config ``--set`` override; every point's config and
script are checked before anything is queued. Each job exports ``MLHPC_CAMPAIGN=<id>``, so that
`record_run` stores each run under the campaign and ``mlhpc results scaling --campaign ID``
reads it, and writes its runs into ``<output.dir>/<id>/<point label>`` (one MLCommons-style
results folder per point). `submit_jobs` queues them.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from mlhpc.errors import ConfigError
from mlhpc.text import clip
from mlhpc.hints import did_you_mean
from mlhpc.slurm_job import SbatchJob, SubmitOptions
from mlhpc.store.queries import INT64_MAX, parse_count
from mlhpc.store.record import CAMPAIGN_ENV


@dataclass(frozen=True)
class Sweep:
    """A campaign: its id and, per job, the ``KEY=VALUE`` overrides (in the sweep's key order)."""

    campaign_id: str
    points: list[list[str]]


#: The most jobs one ``mlhpc submit --sweep`` queues (a site's per-user queue limit is lower still).
MAX_SWEEP_POINTS = 1000


def new_campaign_id() -> str:
    """``YYYYmmdd-HHMMSS-<6 hex>`` (UTC): sortable by time, unique across concurrent submits."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def sweep_points(specs: list[str], campaign_id: str | None = None) -> Sweep:
    """``["nodes=1,2,4", "train.global_batch_size=64,128"]`` -> 6 points, each a list of
    ``--set`` overrides (``["nodes=1", "train.global_batch_size=64"]``, ...).

    Raises:
        ConfigError: a specification without ``=``, with no value, a repeated key, a value
            list with an empty entry (naming it), or more than `MAX_SWEEP_POINTS` points.
    """
    keys, values = [], []
    for spec in specs:
        key, sep, listed = spec.partition("=")
        key = key.strip()
        choices = [v.strip() for v in listed.split(",")]
        if not sep or not key or not listed.strip() or any(not v for v in choices):
            raise ConfigError(f"--sweep {clip(repr(spec), 120)}: expected KEY=V1,V2,... with no empty value")
        if key in keys:
            raise ConfigError(f"--sweep {clip(repr(spec), 120)}: key {clip(repr(key), 80)} swept twice")
        keys.append(key)
        values.append(choices)
    count = math.prod(len(v) for v in values)
    if count > MAX_SWEEP_POINTS:  # refused before a point is made or a script rendered
        raise ConfigError(f"--sweep: {' x '.join(str(len(v)) for v in values)} = {count} points, over the "
                          f"{MAX_SWEEP_POINTS} jobs one submit may queue; split the sweep")
    points = [[f"{k}={v}" for k, v in zip(keys, combo)] for combo in itertools.product(*values)]
    return Sweep(campaign_id or new_campaign_id(), points)


#: ``mlhpc submit`` options a sweep may vary per job, by option name (``--sweep nodes=1,2``;
#: underscores read as dashes) -> (the field of `SubmitOptions` or of its allocation, the value's
#: type). Any other key is a config key, passed as ``--set KEY=VALUE``.
SUBMIT_KEYS: dict[str, tuple[str, type]] = {
    "nodes": ("nodes", int), "gpus-per-node": ("gpus_per_node", int),
    "tasks-per-node": ("tasks_per_node", int), "ntasks-per-node": ("tasks_per_node", int),
    "cpus-per-task": ("cpus_per_task", int), "runs": ("runs", int), "instances": ("instances", int),
    "time": ("time_limit", str), "time-per-run": ("time_per_run", str), "partition": ("partition", str),
    "account": ("account", str), "qos": ("qos", str), "constraint": ("constraint", str),
    "job-name": ("job_name", str)}
_TOP_LEVEL_CONFIG_KEYS = ("workload",)
_UNSAFE_LABEL = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True)
class RenderedJob:
    """One rendered job: its sweep point (``KEY=VALUE`` as swept; empty without a sweep), the
    folder its runs write, its sbatch script, and lines for the user (stderr)."""

    point: list[str]
    output_dir: Path
    script: str
    notes: list[str]


def _split_point(point: list[str], options: SubmitOptions) -> tuple[SubmitOptions, list[str]]:
    """A point's submit options (``options`` with the point's submit keys set) and its config
    overrides.

    Raises:
        ConfigError: a key that is neither a submit option nor a config key (with the closest
            submit option), or a submit option's value of the wrong type.
    """
    sets: list[str] = []
    for text in point:
        key, _, value = text.partition("=")
        if "." in key or key in _TOP_LEVEL_CONFIG_KEYS:
            sets.append(text)
            continue
        known = SUBMIT_KEYS.get(key.replace("_", "-"))
        if known is None:
            hint = did_you_mean(key.replace("_", "-"), list(SUBMIT_KEYS) + list(_TOP_LEVEL_CONFIG_KEYS))
            raise ConfigError(f"--sweep {clip(key, 80)}: neither an mlhpc submit option ({', '.join(SUBMIT_KEYS)}) "
                              f"nor a config key (section.key){hint}")
        name, kind = known
        try:
            options = options.with_option(name, parse_count(value, "") if kind is int else value)
        except ConfigError:  # ASCII digits within int64: "²", "٣" or 20 digits are not a count
            raise ConfigError(f"--sweep {clip(key, 80)}={clip(value, 80)}: expected a whole number "
                              f"from 1 to {INT64_MAX}") from None
    return options, sets


def _label(point: list[str], taken: set[str]) -> str:
    """A folder name for a point (``nodes-2_train.global_batch_size-64``), unique in ``taken``."""
    label = "_".join(_UNSAFE_LABEL.sub("_", text.replace("=", "-", 1)) for text in point)[:120] or "point"
    unique, n = label, 2
    while unique in taken:
        unique, n = f"{label}_{n}", n + 1
    taken.add(unique)
    return unique


def _load(config_path: Path, sets: list[str], swept: set[str]):
    """The point's config (validated), a swept key's error said as ``--sweep KEY``."""
    from mlhpc import config as cfg

    try:
        return cfg.load(config_path, tuple(sets))
    except ConfigError as exc:
        text = str(exc)
        key = text[len("--set "):].split(":", 1)[0] if text.startswith("--set ") else None
        if key in swept:
            raise ConfigError("--sweep " + text[len("--set "):]) from None
        raise


def render_jobs(config_path: Path, options: SubmitOptions, overrides: list[str],
                specs: list[str] = (), campaign_id: str | None = None) -> tuple[str | None, list[RenderedJob]]:
    """The jobs ``mlhpc submit CONFIG [--sweep ...]`` submits, every one rendered (so checked)
    before any is queued.

    Args:
        config_path: the run config.
        options: the submit command's options (`SubmitOptions`; ``time_limit`` None: ``runs`` x
            ``time_per_run``); a sweep's submit keys replace them per point.
        overrides: ``--set`` overrides of every job.
        specs: ``--sweep KEY=V1,V2,...`` (`sweep_points`); none: one job, no campaign.
        campaign_id: the sweep's id (default: a new one).

    Returns:
        ``(campaign id or None, jobs)``. A sweep's jobs export ``MLHPC_CAMPAIGN=<id>`` and write
        ``<output.dir>/<id>/<point label>`` unless ``output.dir`` is swept.

    Raises:
        ConfigError: a bad sweep, key, config or Slurm request (one line, naming it).
    """
    sweep = sweep_points(list(specs), campaign_id) if specs else None
    taken: set[str] = set()
    jobs = []
    for point in (sweep.points if sweep else [[]]):
        point_options, sets = _split_point(point, options)
        swept = {text.partition("=")[0] for text in point}
        out = Path(_load(config_path, list(overrides) + sets, swept).output.dir).resolve()
        base = list(overrides)
        if sweep and "output.dir" not in swept:  # the script's own --set output.dir= holds
            out = out / sweep.campaign_id / _label(point, taken)
            base = [text for text in base if text.partition("=")[0].strip() != "output.dir"]
        env = {CAMPAIGN_ENV: sweep.campaign_id} if sweep else None
        jobs.append(_render(config_path, point_options, base + sets, env, point, out))
    return (sweep.campaign_id if sweep else None), jobs


def _render(config_path: Path, options: SubmitOptions, sets: list[str], env: dict[str, str] | None,
            point: list[str], out: Path) -> RenderedJob:
    from mlhpc import slurm

    runs, per_run, limit = options.runs, options.time_per_run, options.time_limit
    notes = []
    if limit is None:
        limit = slurm.job_time(runs, per_run)
        notes.append(f"mlhpc: --time not given: {runs} run(s) x {per_run} per run (--time-per-run) = {limit}")
    job = SbatchJob(config_path, options.allocation, runs=runs, instances=options.instances, time=limit,
                    output_dir=out, overrides=sets, env=env)
    return RenderedJob(point, out, slurm.render_sbatch(job), notes)


def submit_jobs(campaign_id: str | None, jobs: list[RenderedJob], dry_run: bool = False) -> list[str]:
    """Submit each job's script (`mlhpc.slurm.submit`); the job ids, in order.

    Raises:
        SubmitError: sbatch is missing or refused a job; the message says which jobs of the
            campaign were already queued (they stay queued).
    """
    from mlhpc.slurm import SubmitError, submit

    ids: list[str] = []
    for job in jobs:
        try:
            ids += submit(job.script, dry_run=dry_run)
        except SubmitError as exc:
            if not ids:
                raise
            raise SubmitError(f"{exc} (campaign {campaign_id}: {len(ids)} of {len(jobs)} job(s) already "
                              f"queued: {', '.join(ids)})") from None
    return ids
