"""The Slurm job of an AutoML search: ``mlhpc submit CONFIG --automl`` (docs/automl.md).

The script (`render_search`, the template ``mlhpc/templates/automl.sh.in`` filled by
`mlhpc.slurm.render_template`, its ``#SBATCH`` lines and folders as `mlhpc.slurm.check_job`
makes them for ``mlhpc run`` jobs) runs three steps of ``mlhpc automl`` (`mlhpc.automl.launch`):

1. ``<python> -m mlhpc automl CONFIG --prepare --set output.dir=OUT [--set ...]``, once, on the
   batch host: the search space checked, the data made, the study created, ``study.json``
   written -- the time budget ``automl.budget_s`` starts. Should it fail, no worker starts and its
   exit status is the job's;
2. one ``srun`` job step with one task per node (default) or per GPU (``--gpus-per-node G``, each
   task given its own GPU by ``--gpus-per-task=1``), each task one worker
   ``<python> -m mlhpc automl CONFIG --worker ...`` asking the study for trials until the budget
   ends. The step is not one MPI job (``--mpi=none``), and a worker that fails does not stop the
   others (``--kill-on-bad-exit=0``): its running trial is failed by the next step. Each trial
   runs at ``automl.trial_threads`` threads: the config's, else ``--cpus-per-task``, else the
   batch host's CPUs (``SLURM_CPUS_ON_NODE``) over the tasks per node;
3. ``<python> -m mlhpc automl CONFIG --finish ...``: trials whose worker died failed, the end
   written, the score printed; its exit status (0: the validity gates passed, 1: one failed) is
   the job's.

The workers share nothing but the study's storage: ``output.dir`` (which holds the default
journal file and every trial's folder) must be on a file system every node sees, or
``automl.storage`` an RDB URL. Every value reaches the script through `shlex.quote`.
The wall time (`search_time`): the budget plus a margin to prepare the search and stop its last
trials.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from mlhpc import slurm
from mlhpc.automl.space import check_space
from mlhpc.automl.study import STUDY_FILE
from mlhpc.data.trees import make_private_dir
from mlhpc.errors import ConfigError, OutputError
from mlhpc.slurm_job import SbatchJob, SubmitOptions

#: Wall time beyond the budget: preparing the search (data made where missing, the study) and
#: stopping the trials still running at its end, plus this share of the budget.
MARGIN_S, MARGIN_SHARE = 600, 0.05


@dataclass(frozen=True)
class SearchJob:
    """A rendered search job: the search's folder, the sbatch script, lines for the user."""

    output_dir: Path
    script: str
    notes: list[str]


def search_time(budget_s: float) -> tuple[str, int]:
    """The job's wall time for a search of ``budget_s`` seconds: ``(D-HH:MM:SS, margin in s)``,
    the budget plus `MARGIN_S` + `MARGIN_SHARE` of it, rounded up to whole minutes (Slurm's
    unit)."""
    total_s = 60 * math.ceil((budget_s + MARGIN_S + MARGIN_SHARE * budget_s) / 60)
    days, rest = divmod(total_s, 86400)
    return f"{days}-{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}", int(total_s - budget_s)


def render_search(config_path: Path, options: SubmitOptions, overrides: list[str], *,
                  python: str | None = None, workdir: Path | None = None) -> SearchJob:
    """The job of ``mlhpc submit CONFIG --automl``: the script (module docstring) and its notes.

    Args:
        config_path: the search's config (its ``automl`` section: space, budget).
        options: the submit command's options: its allocation and ``time_limit`` count (None:
            `search_time` of the budget, said in a note); runs and instances are left out.
        overrides: ``--set`` overrides of every step, in order (after the script's own
            ``output.dir``, so they win).
        python / workdir: the job's interpreter and first folder (`mlhpc.slurm_job.SbatchJob`'s).

    Raises:
        ConfigError: a bad config, no ``automl`` section or a bad search space (naming the
            key), an ``output.dir`` that already holds a search, or a Slurm request
            `mlhpc.slurm.check_job` refuses.
    """
    from mlhpc import config as cfg

    config = cfg.load(config_path, tuple(overrides))
    check_space(config)  # no automl section, or a knob the workload does not take: refused here
    assert config.automl is not None
    out = Path(config.output.dir).resolve()
    if os.path.lexists(out / STUDY_FILE):
        raise ConfigError(f"output.dir {out}: already holds a search ({STUDY_FILE}); choose another output.dir")
    limit, notes = options.time_limit, []
    if limit is None:
        limit, margin_s = search_time(config.automl.budget_s)
        notes.append(f"mlhpc: --time not given: the search's budget {config.automl.budget_s:g} s (automl.budget_s) "
                     f"+ {margin_s} s to prepare it and stop its last trials = {limit}")
    # a relative output.dir given is the folder resolved here; each step gets it absolute
    sets = [text for text in overrides if text.partition("=")[0].strip() != "output.dir"]
    job = SbatchJob(config_path, options.allocation, time=limit, output_dir=out, overrides=sets,
                    python=python, workdir=workdir)
    parts = slurm.check_job(job)
    shared = {key: value for key, value in parts.values.items() if key != "python"}  # in each step's line
    values = {**shared, **_steps(job, parts, config.automl.trial_threads),
              "budget_s": slurm.Verbatim(f"{config.automl.budget_s:g}"),
              "workers": job.allocation.nodes * parts.layout.tasks_per_node}
    return SearchJob(out, slurm.render_template(slurm.template_text("automl.sh.in"), values), notes)


def _steps(job: SbatchJob, parts: slurm.JobParts, trial_threads: int | None) -> dict[str, object]:
    """The three steps' command lines (quoted), and the trial threads' computation if needed."""
    q = shlex.quote
    tasks = parts.layout.tasks_per_node

    def step(flag: str, *extra: str) -> str:
        head = [parts.python, "-m", "mlhpc", "automl", str(parts.config), flag,
                "--set", f"output.dir={parts.output_dir}"]
        return " ".join([*map(q, head), *extra, *(f"--set {q(text)}" for text in job.overrides)])

    alloc = job.allocation
    srun = ["srun", f"--nodes={alloc.nodes}", f"--ntasks={alloc.nodes * tasks}", f"--ntasks-per-node={tasks}",
            "--mpi=none", "--kill-on-bad-exit=0"]
    srun += [f"--cpus-per-task={alloc.cpus_per_task}"] if alloc.cpus_per_task else []
    srun += ["--gpus-per-task=1"] if alloc.gpus_per_node else []
    threads, compute = [], None
    if trial_threads is None and alloc.cpus_per_task:
        threads = [f"--set {q(f'automl.trial_threads={alloc.cpus_per_task}')}"]
    elif trial_threads is None:  # the node's CPUs shared by its workers, as mlhpc automl --workers does
        threads = ['--set "automl.trial_threads=$TRIAL_THREADS"']
        compute = slurm.Verbatim(f"TRIAL_THREADS=$(( ${{SLURM_CPUS_ON_NODE:-{tasks}}} / {tasks} )); "
                                 '[ "$TRIAL_THREADS" -ge 1 ] || TRIAL_THREADS=1')
    return {"prepare": slurm.Verbatim(step("--prepare")),
            "trial_threads": compute,
            "workers_step": slurm.Verbatim(" ".join(map(q, srun)) + " " + step("--worker", *threads)),
            "finish": slurm.Verbatim(step("--finish"))}


def submit_search(job: SearchJob, dry_run: bool) -> list[str]:
    """Submit the search's job (`mlhpc.slurm.submit`); ``[job id]``, or ``[]`` with ``dry_run``.
    Its folder is made first, private (``0700``, as ``mlhpc automl --prepare`` wants it): the
    Slurm log goes there from the job's start.

    Raises:
        OutputError: the folder is a link, someone else's, writable by others, or cannot be made.
        SubmitError: sbatch is missing or refused the job.
    """
    if not dry_run:
        make_private_dir(job.output_dir, OutputError, "AutoML search")
    return slurm.submit(job.script, dry_run=dry_run)
