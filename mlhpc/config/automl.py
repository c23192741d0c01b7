"""The ``automl`` section of a config (`mlhpc.config`): the search ``mlhpc automl`` runs
(`mlhpc.automl`), AIPerf's benchmark on an Optuna study.

AIPerf (Ren et al., arXiv:2008.07141; AI-HPC-Research-Team/AIPerf) scores a machine by an
AutoML search "at discrete timestamps" (every hour) and calls a run valid when it "lasts at
least 1 hour", trains "at FP16 or higher precision" and reaches a best accuracy above 70%.
Here the marks, the time budget and the gates are the config's (defaults: AIPerf's hour); the
quality gate defaults to the workload's quality target.
"""

from __future__ import annotations

from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, model_validator

Number = Union[StrictInt, StrictFloat]


class KnobRange(BaseModel):
    """The values one knob takes: ``low`` .. ``high`` (integers for an integer setting; ``log``:
    sampled on a log scale; ``step``: a grid), or a list of ``choices``."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    low: Optional[Number] = Field(None, description="smallest value")
    high: Optional[Number] = Field(None, description="largest value")
    log: StrictBool = Field(False, description="sample on a log scale (low > 0)")
    step: Optional[Number] = Field(None, gt=0, description="a grid: low, low + step, ...")
    choices: Optional[tuple[Union[StrictBool, StrictInt, StrictFloat, StrictStr], ...]] = Field(
        None, description="the values to choose from (instead of low .. high)")

    @model_validator(mode="after")
    def _a_range(self) -> "KnobRange":
        if self.choices is not None:
            if self.low is not None or self.high is not None:
                raise ValueError("give either choices or low and high, not both")
            if not self.choices:
                raise ValueError("choices is empty")
            if len(set(map(repr, self.choices))) != len(self.choices):
                raise ValueError("choices holds a value twice")
            return self
        if self.low is None or self.high is None:
            raise ValueError("give low and high (or choices)")
        if self.low >= self.high:
            raise ValueError(f"empty or inverted range: low {self.low} is not below high {self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log: low {self.low} must be above 0")
        if self.step is not None and self.log:
            raise ValueError("give step or log, not both")
        if self.step is not None and self.step > self.high - self.low:
            raise ValueError(f"step {self.step} is wider than the range {self.low} .. {self.high}")
        return self


class AutomlConfig(BaseModel):
    """The ``automl`` section: what ``mlhpc automl`` searches, for how long, and what makes the
    search valid (docs/automl.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    space: dict[str, KnobRange] = Field(..., min_length=1, description=(
        "the search space: a knob the workload declares (`mlhpc automl CONFIG --knobs` lists "
        "them; e.g. train.global_batch_size) -> its range or choices"))
    budget_s: float = Field(..., gt=0, description=(
        "the search's time budget; a trial still running when it ends is stopped (SIGTERM)"))
    mark_every_s: float = Field(3600.0, gt=0, description=(
        "the score's time marks (AIPerf: every hour), at most budget_s"))
    storage: Optional[StrictStr] = Field(None, min_length=1, description=(
        "Optuna storage: a journal file on a shared file system, or an RDB URL "
        "(postgresql://..., sqlite:///...); null: <output.dir>/study.journal"))
    study_name: Optional[StrictStr] = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
                                            description="the study's name; null: output.dir's folder name")
    seed_trial: StrictBool = Field(True, description=(
        "the first trial trains the config's own values of the knobs (AIPerf's seed network), "
        "when they lie in the space"))
    sampler: Literal["tpe", "random"] = Field("tpe", description=(
        "Optuna sampler: tpe (AIPerf's hyperparameter search) or random"))
    startup_trials: StrictInt = Field(10, ge=0, le=100_000, description=(
        "trials sampled at random before TPE models the results"))
    pruner: Literal["patient", "median", "none"] = Field("patient", description=(
        "patient: stop a trial whose metric has not improved for patience_epochs evaluations "
        "(AIPerf's early stop); median: also below the median of earlier trials; none"))
    patience_epochs: StrictInt = Field(6, ge=1, le=100_000, description=(
        "evaluations without improvement before a trial is stopped (AIPerf's first round: 6 "
        "epochs, min(6 + 2 x round, 20) later)"))
    min_improvement: float = Field(0.0, ge=0, description=(
        "an evaluation better than the trial's best by no more than this counts as no "
        "improvement (the metric's units)"))
    min_duration_s: float = Field(3600.0, ge=0, description=(
        "validity gate: the search ran at least this long (AIPerf: 1 hour)"))
    min_quality: Optional[float] = Field(None, description=(
        "validity gate: the best quality reaches this (the metric's direction); null: the "
        "run's quality target (AIPerf: accuracy above 70%)"))
    ranks_per_trial: StrictInt = Field(1, ge=1, le=65536, description=(
        "ranks of each trial: 1, a single process; more, torchrun --standalone with this many "
        "processes on the worker's node (one per GPU of a node, say)"))
    trial_threads: Optional[StrictInt] = Field(None, ge=1, le=65536, description=(
        "torch threads of each trial; null: this worker's cores / workers on the node"))
    heartbeat_s: float = Field(30.0, gt=0, le=3600, description=(
        "a worker's heartbeat on its running trial; a trial silent 4 x this long is marked "
        "failed (its worker was killed)"))

    @model_validator(mode="after")
    def _marks_fit(self) -> "AutomlConfig":
        if self.mark_every_s > self.budget_s:
            raise ValueError(f"mark_every_s {self.mark_every_s:g} s is longer than budget_s "
                             f"{self.budget_s:g} s (no mark would fall inside the search)")
        return self
