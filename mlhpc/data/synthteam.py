"""A synthesis shared by the ranks of a job (``mlhpc data synth`` under srun, torchrun or
mpiexec): which part of the plan a rank writes, what the ranks agree on, and their figures.

Every rank calls the workload's ``synthesize`` into one hidden folder
(`mlhpc.data.embedded.synthesize`); the workload's plan of files is the same list on every rank
and a rank writes every ranks-th file from its own index (`SynthTeam.share`), so the ranks' sets
are disjoint, and a file already in place from an interrupted attempt is kept, never written
twice. Rank 0 alone prepares the folder, writes the manifest and renames it into place; the
ranks checksum their share of the files for the manifest. One process is the team of one: no
process group, nothing gathered.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence, TypeVar

from mlhpc import runtime
from mlhpc.errors import DataError

T = TypeVar("T")

#: How long a rank waits for the others at a synthesis's collectives: a rank's share of a
#: full-size data set may take hours longer than another's.
TEAM_TIMEOUT_S = 7 * 24 * 3600.0


class QuietRankError(DataError):
    """Rank 0's error, heard by another rank: that rank exits 2 and leaves the line to rank 0."""


@dataclass(frozen=True)
class SynthTeam:
    """This process's place among the ranks synthesising one data set.

    Attributes:
        rank / ranks: this rank's index and the number of ranks.
        workers: synthesis processes this rank may start (0: the workload's own choice).
    """

    rank: int = 0
    ranks: int = 1
    workers: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def share(self, tasks: Sequence[T]) -> list[T]:
        """Every ``ranks``-th task of ``tasks`` from ``rank`` (the same list on every rank)."""
        return list(tasks[self.rank::self.ranks])

    def gather(self, part: Sequence[T]) -> list[T] | None:
        """Every rank's ``part``, joined in rank order, on rank 0; None on the others.

        Raises:
            DataError: another rank's process ended before it (`everyone`).
        """
        if self.ranks == 1:
            return list(part)
        parts = self.everyone(list(part))
        return [item for each in parts for item in each] if self.is_main else None

    def everyone(self, value: Any) -> list[Any]:
        """``value`` of every rank, in rank order, on every rank.

        Raises:
            DataError: another rank's process ended before it (killed, or stopped by its own
                error, which it says itself): one line, not the collective's traceback; what
                was written stays for the same command to finish.
        """
        if self.ranks == 1:
            return [value]
        try:
            return runtime.all_gather(value)
        except RuntimeError as exc:  # torch.distributed's error when a peer's connection closes
            cause = " ".join(str(exc).split())[-160:]
            raise DataError(f"rank {self.rank}: another rank of this synthesis ended before it ({cause}); "
                            "the files written are kept: run the same command again to finish") from None

    def from_main(self, value: Any) -> Any:
        """Rank 0's ``value``, on every rank."""
        return self.everyone(value)[0]


def cpu_share(local_ranks: int) -> int:
    """This rank's share of its node's CPUs: its affinity mask where the launcher bound it to
    fewer CPUs than the node has (srun --cpu-bind), else the node's CPUs over its ``local_ranks``
    (torchrun, mpiexec without binding); at least 1."""
    mine, node = runtime.usable_cpus(), os.cpu_count() or 1
    return max(1, mine if mine < node else node // max(1, local_ranks))


def team_of(rt: "runtime.Runtime", workers: int | None) -> SynthTeam:
    """The team of ``rt``'s ranks, each starting ``workers`` synthesis processes (None:
    `cpu_share`)."""
    return SynthTeam(rank=rt.rank, ranks=rt.world_size,
                     workers=cpu_share(rt.local_world_size) if workers is None else workers)
