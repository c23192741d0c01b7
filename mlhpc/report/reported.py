"""A run as the report shows it: the log's facts and what the report computes from them.

`ReportedRun` holds the log's `mlhpc.log.facts.RunSummary` as it was read, beside the figures
the report computes: energy from the power logs (`mlhpc.report.energy.run_power`), HPC AI500's
Valid FLOPS (`mlhpc.report.validflops.run_valid_flops`) and MLCommons' compliance verdict
(`mlhpc.report.compliance.run_check`). Built once per log (`report_run`, called by
`mlhpc.report.folders.read_folder`); the facts are never changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlhpc.log.facts import RunSummary
from mlhpc.log.parse import Event
from mlhpc.report.compliance import RunCheck
from mlhpc.report.energy import RunPower, run_power
from mlhpc.report.validflops import ValidFlops, run_valid_flops


@dataclass(frozen=True)
class ReportedRun:
    """One run of the report.

    Attributes:
        facts: what the log says (`mlhpc.log.summary.summarize_run`).
        power: energy to train, mean power, per-node and per-epoch energy, or why none.
        valid_flops: HPC AI500's figures of the run (None: not computed, e.g. a run read
            elsewhere than in a report).
        compliant / compliance_messages: MLCommons' compliance checker's verdict and messages
            (None and none: not checked, e.g. a resumed run, kept apart).
    """

    facts: RunSummary
    power: RunPower = field(default_factory=RunPower)
    valid_flops: ValidFlops | None = None
    compliant: bool | None = None
    compliance_messages: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The facts' dict (`RunSummary.to_dict`) with the report's figures in their keys
        (`mlhpc.log.facts.REPORT_KEYS`, same order): the run in ``mlhpc report --format json``."""
        out = self.facts.to_dict()
        power = self.power
        out.update(compliant=self.compliant, compliance_messages=list(self.compliance_messages),
                   energy_to_train_j=power.energy_to_train_j, mean_power_w=power.mean_power_w,
                   node_energy_j=dict(power.node_energy_j), mean_epoch_energy_j=power.mean_epoch_energy_j,
                   power_note=power.power_note,
                   valid_flops=self.valid_flops.to_dict() if self.valid_flops is not None else None)
        return out


def report_run(facts: RunSummary, log: Path, events: list[Event], verdict: RunCheck | None,
               exponent: float) -> ReportedRun:
    """The `ReportedRun` of the log ``log`` (its ``facts`` and records ``events``): its energy
    (`mlhpc.report.energy.run_power`), its Valid FLOPS (penalty exponent ``exponent``,
    `mlhpc.report.validflops.run_valid_flops`) and its compliance ``verdict`` (None: not
    checked, a run kept apart). Never raises for a log that was read."""
    power = run_power(log, events)
    flops = run_valid_flops(facts, power.mean_power_w, log, events, exponent)
    if verdict is None:
        return ReportedRun(facts, power, flops)
    return ReportedRun(facts, power, flops, verdict.compliant, tuple(verdict.messages))
