"""The records of a Slurm job: what it asks Slurm for (`Allocation`), what ``mlhpc submit`` was
given (`SubmitOptions`, built once by the command line) and the job a script is rendered from
(`SbatchJob`, `mlhpc.slurm.render_sbatch`). Values are checked where the script is rendered
(`mlhpc.slurm.check_job`), not here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field, fields, replace
from pathlib import Path

DEFAULT_MASTER_PORT = 29511


@dataclass(frozen=True)
class Allocation:
    """The nodes and tasks a job asks for, and how Slurm files it (its ``#SBATCH`` lines).

    Fields:
        nodes: nodes to allocate (>= 1).
        gpus_per_node: GPUs per node; when > 0 there is one task per GPU.
        tasks_per_node: tasks per node when ``gpus_per_node`` is 0 (default 1); with GPUs it may
            only repeat ``gpus_per_node``.
        cpus_per_task: ``--cpus-per-task`` (and ``OMP_NUM_THREADS``) when given.
        partition / account / qos: Slurm partition, account and quality of service (None: the
            cluster's default).
        constraint: ``--constraint`` node features (e.g. ``"gpu&a100"``; None: any node).
        exclusive: ``--exclusive``: no other job shares the nodes.
        job_name: the job's label (characters sbatch cannot take are replaced by ``_``).
    """

    nodes: int = 1
    gpus_per_node: int = 0
    tasks_per_node: int | None = None
    cpus_per_task: int | None = None
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    exclusive: bool = False
    job_name: str = "mlhpc"


@dataclass(frozen=True)
class SubmitOptions:
    """The options of ``mlhpc submit``, by parameter name.

    Fields:
        allocation: the job's `Allocation` (an AutoML search's job takes only this).
        runs: sequential runs of the benchmark in one results folder.
        instances: concurrent training instances per run (weak scaling).
        time_limit: the job's wall time (a Slurm time); None: ``runs`` x ``time_per_run``.
        time_per_run: the wall time one run is allowed (a Slurm time).
    """

    allocation: Allocation = field(default_factory=Allocation)
    runs: int = 1
    instances: int = 1
    time_limit: str | None = None
    time_per_run: str = "01:00:00"

    def with_option(self, name: str, value: object) -> SubmitOptions:
        """A copy with the option ``name`` (a field of this record or of its `Allocation`) set
        to ``value`` (a sweep's point).

        Raises:
            TypeError: ``name`` is neither.
        """
        if name in {f.name for f in fields(Allocation)}:
            return replace(self, allocation=replace(self.allocation, **{name: value}))
        return replace(self, **{name: value})


@dataclass(frozen=True)
class SbatchJob:
    """One batch job: R runs of ``mlhpc run CONFIG``, and the allocation they run in.

    Fields:
        config_path: the run config; made absolute (it must exist).
        allocation: the nodes and tasks, and the ``#SBATCH`` lines (`Allocation`).
        runs: sequential runs of the benchmark (1 .. ``mlhpc.slurm.MAX_RUNS``), each a fresh
            ``result_N.txt``.
        time: wall-time limit, in a Slurm time format (``"MM"``, ``"HH:MM:SS"``, ``"D-HH:MM"``...).
        output_dir: the results folder of every run (``--set output.dir=``), made absolute; the
            Slurm log goes to ``<output_dir>/slurm-%j.out``.
        overrides: extra ``key=value`` config overrides, passed as ``--set`` in this order, after
            the script's own ``output.dir`` and ``train.seed`` (so they win).
        instances: concurrent training instances per run (weak scaling); nodes x tasks must split
            evenly between them.
        seeds: one ``train.seed`` per run (instance i of a run adds i); default: ``runs``
            distinct random seeds drawn at rendering (the MLPerf rules want each run seeded
            differently) -- unless ``overrides`` set ``train.seed``, which then holds for every run.
        mpi: srun's ``--mpi`` plugin (``"pmi2"``; ``"pmix"`` or ``"none"`` elsewhere).
        python: the interpreter the job runs (default: ``sys.executable``, this interpreter, so
            the job finds this install of mlhpc).
        env: extra environment variables exported before the runs.
        workdir: folder the job changes to first (default: the current folder).
        master_port: torch.distributed port of instance 0 (instance i uses ``master_port + i``).
    """

    config_path: Path | str
    allocation: Allocation = field(default_factory=Allocation)
    _: KW_ONLY
    runs: int = 1
    time: str = "01:00:00"
    output_dir: Path | str = "results"
    overrides: Sequence[str] = ()
    instances: int = 1
    seeds: Sequence[int] | None = None
    mpi: str = "pmi2"
    python: str | None = None
    env: Mapping[str, str] | None = None
    workdir: Path | str | None = None
    master_port: int = DEFAULT_MASTER_PORT
