"""``mlhpc data synth`` as a call: the workload's synthetic data set written by one process, or
shared by the ranks of a job started by srun, torchrun or mpiexec (the runtime detection
``mlhpc run`` uses, `mlhpc.runtime.detect`), at the config's sizes or a fraction of its counts.

A centre without the reference data (DeepCAM's 8.8 TB is offered only through Globus, CosmoFlow
is 1.7 TB preprocessed) writes them at the reference sample sizes with its own nodes: every rank
writes a disjoint set of files of one data set (`mlhpc.data.synthteam`), each sample a function
of (seed, index) alone, so the bytes do not depend on the number of ranks or processes; an
interrupted job run again writes only the files that are missing; rank 0 writes the manifest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from mlhpc import runtime
from mlhpc.data import embedded
from mlhpc.data.synthteam import TEAM_TIMEOUT_S, team_of
from mlhpc.data.synthwatch import ProgressFn
from mlhpc.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - typing only
    from mlhpc.config import Config
    from mlhpc.workload import Workload


@dataclass(frozen=True)
class SynthRequest:
    """What ``mlhpc data synth`` asks besides the config.

    Attributes:
        seed: the synthesis's seed.
        fraction: the part (0 < F <= 1) of the synth section's sample counts to write; None: all.
        workers: synthesis processes per rank; None: the rank's share of its node's CPUs.
    """

    seed: int
    fraction: float | None = None
    workers: int | None = None


def synth_job(config: "Config", out_dir: Path, request: SynthRequest,
              progress: Callable[[bool], ProgressFn]) -> bool | None:
    """Write ``config``'s workload's synthetic data set into ``out_dir`` (`embedded.synthesize`),
    this process's share of it when it is one rank of several; ``progress(is_main)`` gives the
    listener of this rank's events (`mlhpc.data.synthwatch.SynthWatch`).

    Returns:
        True when anything was written, False when the folder was already complete; None on a
        rank other than 0 (rank 0 says what happened).

    Raises:
        ConfigError: ``fraction`` outside (0, 1], or the workload declares no sample counts to
            scale; ``workers`` below 1 (each before anything is written).
        DataError: as `embedded.synthesize`, on every rank (another rank than 0 hearing rank
            0's error raises `QuietRankError`: rank 0 says it).
    """
    from mlhpc.workload import get

    workload = get(config.workload)
    if request.workers is not None and request.workers < 1:
        raise ConfigError(f"--workers {request.workers}: expected 1 or more synthesis processes per rank")
    synth = scaled(workload, config.synth, request.fraction)
    rt = runtime.detect(device="cpu")
    on_progress = progress(rt.is_main)
    runtime.init_process_group(rt, timeout_s=TEAM_TIMEOUT_S)
    try:
        wrote = embedded.synthesize(out_dir, workload, synth, request.seed, on_progress=on_progress,
                                    team=team_of(rt, request.workers))
    finally:
        runtime.destroy_process_group()
    return wrote if rt.is_main else None


def scaled(workload: "Workload", synth: object, fraction: float | None) -> object:
    """``synth`` with its sample counts (``workload.synth_count_keys``) times ``fraction``,
    rounded down, at least 1 each; ``synth`` itself for None.

    Raises:
        ConfigError: ``fraction`` outside (0, 1] or not finite, or the workload declares no
            sample counts.
    """
    if fraction is None:
        return synth
    if not (math.isfinite(fraction) and 0 < fraction <= 1):
        raise ConfigError(f"--fraction {fraction}: expected a fraction F with 0 < F <= 1 of the "
                          "synth section's sample counts")
    if not workload.synth_count_keys:
        raise ConfigError(f"--fraction: workload {workload.name!r} declares no sample counts to "
                          "scale (Workload.synth_count_keys); set them with --set synth.KEY=N")
    dumped = synth.model_dump()  # type: ignore[attr-defined]
    update = {key: max(1, math.floor(round(fraction * dumped[key], 6))) for key in workload.synth_count_keys}
    return type(synth).model_validate({**dumped, **update})
