"""The ReFrame test classes behind mlhpc's checks (the only mlhpc module that imports ReFrame).

`MlhpcRunBase` launches ``mlhpc run CONFIG`` through the partition's launcher (``srun``,
``mpirun``, ``mpiexec``, ``ibrun``; ``local`` for one rank), so the ranks come from the launcher
as they do under ``mlhpc submit``; `MlhpcStageBase` times ``mlhpc stage`` into the node-local
folder the partition names. Both are judged by the run itself (`mlhpc.reframe.verdict`): the
exit status, the result log and the official compliance checker, never by patterns in the
output; their performance figures come from the log through ``mlhpc report``'s own reader, and
their references from the file ``mlhpc results check --references`` reads
(`mlhpc.reframe.references`).

Bad input (a config that does not load, an unknown workload or key, a references file that does
not parse, a partition whose launcher cannot start the ranks asked for) ends the check in its
setup with mlhpc's one-line reason as a ReFrame ``ConfigError``; a run that fails ends it in
sanity with the run's own one-line reason. See docs/reframe.md.
"""

from __future__ import annotations

import os
import shlex
import sys
import uuid
from pathlib import Path

import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.builtins import run_after, run_before, sanity_function, variable
from reframe.core.exceptions import ConfigError as ReframeConfigError
from reframe.core.exceptions import SanityError

import mlhpc
from mlhpc.errors import MlhpcError
from mlhpc.reframe import verdict
from mlhpc.reframe.references import reference_table
from mlhpc.text import one_line

#: ReFrame launchers whose ranks mlhpc's runtime reads (Slurm's task variables, or MPI's).
RANK_LAUNCHERS = ("srun", "srunalloc", "mpirun", "mpiexec", "ibrun")
#: ReFrame launchers that start one process (one rank).
ONE_PROCESS_LAUNCHERS = ("local", "ssh")
#: A rank's place on its node as the launchers above set it (srun, Open MPI, MPICH), else 0.
LOCAL_RANK = "${SLURM_LOCALID:-${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}}}"
#: The partition ``extras`` key naming its node-local folder (``data.staging.dest``).
STAGING_EXTRA = "mlhpc_staging_dest"


def default_configs() -> list[str]:
    """The mini configs (``configs/*-mini.yaml``) of the mlhpc checkout the package runs from,
    else of the folder ReFrame runs in; one pattern that names none when neither has them (the
    check then says so in one line)."""
    for folder in (Path(mlhpc.__file__).resolve().parents[1] / "configs", Path.cwd() / "configs"):
        found = sorted(str(path) for path in folder.glob("*-mini.yaml"))
        if found:
            return found
    return ["configs/*-mini.yaml"]


def launcher_problem(partition: str, launcher: str, ranks: int) -> str | None:
    """Why ``launcher`` (a ReFrame launcher name) of ``partition`` cannot start ``ranks`` ranks
    that mlhpc's runtime recognises, in one line; None when it can."""
    if launcher in RANK_LAUNCHERS or (launcher in ONE_PROCESS_LAUNCHERS and ranks == 1):
        return None
    if launcher in ONE_PROCESS_LAUNCHERS:
        return (f"partition {partition}: no launcher starts the {ranks} ranks asked for (its launcher "
                f"'{launcher}' starts one process): set the partition's launcher to srun or mpirun, "
                "or ask for one rank (-S nodes=1 -S ranks_per_node=1)")
    return (f"partition {partition}: launcher '{launcher}' gives mlhpc no ranks (it reads Slurm's or "
            f"MPI's); use one of {', '.join(RANK_LAUNCHERS)}")


class _MlhpcBase(rfm.RunOnlyRegressionTest):
    """What both checks share: the config, the overrides, the ranks, the command, bad input."""

    #: The workload config ``mlhpc run`` reads (a parameter: ``-P config=A.yaml,B.yaml``).
    config: str
    #: ``--set KEY=VALUE`` overrides, in order (``-S overrides=a.b=1,c.d=2`` or a JSON list).
    overrides = variable(typ.List[str], value=[])
    #: Nodes, accelerators per node (0: none asked for), ranks per node (0: one per accelerator,
    #: else one).
    nodes = variable(int, value=1)
    accelerators_per_node = variable(int, value=0)
    ranks_per_node = variable(int, value=0)
    #: How to start mlhpc on the nodes (empty: this Python, ``-m mlhpc``).
    mlhpc_command = variable(typ.List[str], value=[])

    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    sourcesdir = None
    tags = {"mlhpc"}

    def ranks(self) -> int:
        """Ranks in all: nodes x ranks per node."""
        return self.nodes * self.per_node()

    def per_node(self) -> int:
        return self.ranks_per_node or self.accelerators_per_node or 1

    def config_path(self) -> Path:
        return Path(os.path.expandvars(self.config)).expanduser().resolve()

    def command(self, *args: str) -> list[str]:
        """``mlhpc ARGS...`` as the job runs it."""
        return [*(self.mlhpc_command or [sys.executable, "-m", "mlhpc"]), *args]

    def node_local(self) -> str | None:
        """The node-local folder the partition names (``extras: {mlhpc_staging_dest: PATH}``)."""
        value = self.current_partition.extras.get(STAGING_EXTRA)
        return str(value) if value else None

    def load(self, overrides: tuple[str, ...]):  # noqa: ANN201 - an mlhpc Config
        """The config as ``mlhpc run`` will read it, or ReFrame's ConfigError with mlhpc's one
        line (a missing or unparsable file, an unknown workload or key, a bad value)."""
        from mlhpc import config as mlhpc_config

        try:
            return mlhpc_config.load(self.config_path(), overrides)
        except MlhpcError as exc:
            raise ReframeConfigError(one_line(exc)) from None

    @run_after("setup")
    def _check_input(self) -> None:
        if self.nodes < 1 or self.per_node() < 1 or self.accelerators_per_node < 0:
            raise ReframeConfigError(f"nodes {self.nodes}, ranks_per_node {self.ranks_per_node}, "
                                     f"accelerators_per_node {self.accelerators_per_node}: expected >= 1, >= 0, >= 0")
        partition = self.current_partition
        problem = launcher_problem(partition.fullname, partition.launcher_type.registered_name, self.ranks())
        if problem:
            raise ReframeConfigError(problem)

    @run_before("run")
    def _place_ranks(self) -> None:
        self.num_tasks = self.ranks()
        self.num_tasks_per_node = self.per_node()
        if self.accelerators_per_node:
            self.num_gpus_per_node = self.accelerators_per_node
        if self.current_partition.launcher_type.registered_name == "srun":
            self.job.launcher.options = ["--kill-on-bad-exit=1", *self.job.launcher.options]
        self.postrun_cmds = verdict.exit_status_commands() + list(self.postrun_cmds)

    def set_command(self, argv: list[str]) -> None:
        """The launched command, every word quoted for the job script's shell."""
        self.executable = shlex.quote(argv[0])
        self.executable_opts = [shlex.quote(arg) for arg in argv[1:]]

    def stage_path(self, name: str) -> Path:
        return Path(self.stagedir) / name


class MlhpcRunBase(_MlhpcBase):
    """``mlhpc run CONFIG`` to its quality target, judged by its log (module docstring).

    Performance variables (`mlhpc.reframe.verdict.run_figures`): ``time_to_train`` (min),
    ``staging`` (s), ``epochs_to_target``, ``throughput`` (samples/s), ``energy_to_train`` (kJ,
    where measured); references from ``-S references=FILE`` (`mlhpc.reframe.references`). The
    run's folder (``results/``: the log and its side files) is kept in ReFrame's output folder.
    """

    #: A references file (docs/store.md): system -> benchmark -> figure -> [value, lower, upper, unit].
    references = variable(str, value="")
    #: ``submission.platform`` logged (empty: the partition's full name, ``system:partition``),
    #: the system under which the results store and ``mlhpc results check`` find the run.
    platform = variable(str, value="")
    keep_files = [verdict.RESULTS_DIR]

    @run_after("setup")
    def _command_line(self) -> None:
        own = [f"output.dir={self.stage_path(verdict.RESULTS_DIR)}",
               f"submission.platform={self.platform or self.current_partition.fullname}"]
        node_local = self.node_local()  # a fresh folder there: the run removes the copy it made
        first = [f"data.staging.dest={node_local}/mlhpc-reframe-{uuid.uuid4().hex[:12]}"] if node_local else []
        sets = (*first, *self.overrides, *own)
        self.load(sets)
        if self.references:
            try:
                reference_table(self.references, "")  # a bad file stops the check here, in one line
            except MlhpcError as exc:
                raise ReframeConfigError(one_line(exc)) from None
        self.set_command(self.command("run", str(self.config_path()), *[a for s in sets for a in ("--set", s)]))

    @sanity_function
    def passed(self):  # noqa: ANN201 - ReFrame's sanity function
        """Exit status 0, one result log, run_stop success, accepted by the compliance checker."""
        try:
            self._run = verdict.judge_run(Path(self.stagedir), self.stage_path(self.job.stderr))
        except MlhpcError as exc:
            raise SanityError(one_line(exc)) from None
        return True

    @run_before("performance")
    def _performance(self) -> None:
        figures = verdict.run_figures(self._run)
        self.perf_variables = {f.name: sn.make_performance_function(sn.defer(f.value), f.unit) for f in figures}
        benchmark = self._run.facts.submission.benchmark
        if self.references and benchmark:
            self.reference = reference_table(self.references, benchmark)


class MlhpcStageBase(_MlhpcBase):
    """``mlhpc stage CONFIG`` timed into a fresh folder under the node-local path the partition
    names (its ``extras``' ``mlhpc_staging_dest``; skipped where it names none), one rank per
    node by default; the copy is removed after (``mlhpc stage --clean``, only what it made).

    Performance variables (`mlhpc.reframe.verdict.stage_figures`): ``staging`` (s, the slowest
    node), ``bandwidth`` (GB/s, all nodes), ``staged`` (GB). A source that is missing is made
    first where the config synthesises its data (``mlhpc data synth``, untimed).
    """

    ranks_per_node = 1

    @run_after("setup")
    def _command_line(self) -> None:
        node_local = self.node_local()
        self.skip_if(node_local is None, f"partition {self.current_partition.fullname} names no node-local "
                                         f"folder (extras: {{{STAGING_EXTRA}: PATH}})")
        scratch = f"{node_local}/mlhpc-reframe-{uuid.uuid4().hex[:12]}"
        config = self.load((*self.overrides, f"data.staging.dest={scratch}/copy"))
        sets = [a for s in (*self.overrides, f"data.staging.dest={scratch}/copy") for a in ("--set", s)]
        stage = shlex.join(self.command("stage", str(self.config_path()), "--format", "json", *sets))
        clean = shlex.join(self.command("stage", "--clean", "--in", scratch))
        first_on_node = f'[ "{LOCAL_RANK}" = 0 ]'  # one rank per node removes the node's copy
        self.set_command(["bash", "-c", f"{stage}; s=$?; if {first_on_node}; then {clean} >&2; "
                                        f"rmdir {shlex.quote(scratch)} 2>/dev/null; fi; exit $s"])
        if config.data.synthesize_if_missing:
            synth = [a for s in self.overrides if s.startswith("synth.") for a in ("--set", s)]
            make = shlex.join(self.command("data", "synth", config.workload, "--out", str(config.data.path),
                                           "--config", str(self.config_path()), "--seed",
                                           str(config.data.synth_seed), *synth))
            self.prerun_cmds = [f"[ -e {shlex.quote(str(config.data.path))} ] || {make} >&2", *self.prerun_cmds]

    @sanity_function
    def passed(self):  # noqa: ANN201 - ReFrame's sanity function
        """Exit status 0 and a whole copy timed."""
        try:
            self._figures = verdict.stage_figures(Path(self.stagedir), self.stage_path(self.job.stdout),
                                                  self.stage_path(self.job.stderr))
        except MlhpcError as exc:
            raise SanityError(one_line(exc)) from None
        return True

    @run_before("performance")
    def _performance(self) -> None:
        self.perf_variables = {f.name: sn.make_performance_function(sn.defer(f.value), f.unit)
                               for f in self._figures}
