"""mlhpc's ReFrame checks: the file ``reframe -c`` loads (its path: ``python -m mlhpc.reframe``).

``mlhpc_run``: ``mlhpc run CONFIG`` to its target through the partition's launcher, passed when
it exits 0 with a log the official compliance checker accepts; performance from that log.
``mlhpc_stage``: ``mlhpc stage CONFIG`` timed into the partition's node-local folder. Both are
parameterised by ``config`` (by default the mini configs, ``configs/*-mini.yaml``; others with
``-P config=A.yaml,B.yaml``); ``-S overrides=...``, ``-S nodes=N``, ``-S accelerators_per_node=G``,
``-S ranks_per_node=R`` and (run) ``-S references=FILE`` set the rest. See docs/reframe.md and
`mlhpc.reframe.base`.
"""

import reframe as rfm
from reframe.core.builtins import parameter

from mlhpc.reframe.base import MlhpcRunBase, MlhpcStageBase, default_configs


@rfm.simple_test
class mlhpc_run(MlhpcRunBase):
    """``mlhpc run`` to the target, judged by its log (`mlhpc.reframe.base.MlhpcRunBase`)."""

    config = parameter(default_configs(), type=str)


@rfm.simple_test
class mlhpc_stage(MlhpcStageBase):
    """``mlhpc stage`` timed on node-local storage (`mlhpc.reframe.base.MlhpcStageBase`)."""

    config = parameter(default_configs(), type=str)
