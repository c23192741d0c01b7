"""What an AutoML search may vary in a workload: its knobs, declared by the workload
(`mlhpc.workload.Workload.search_knobs`) and searched by ``mlhpc automl`` (`mlhpc.automl`).

AIPerf (Ren et al., "AIPerf: Automated machine learning as an AI-HPC benchmark",
arXiv:2008.07141) searches a model family's architecture by network morphism and its
hyperparameters by TPE; mlhpc searches both by sampling the knobs a workload names here (the
model family's depth, width, kernel size, ...; the optimizer's learning rate), so that the
harness never names a workload's model field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

@dataclass(frozen=True)
class Knob:
    """One setting a search may vary.

    Attributes:
        key: the config key it sets, as ``--set`` names it (``"model.conv_channels"``).
        kind: ``"architecture"`` (the model's shape: depth, width, kernel size) or
            ``"hyperparameter"`` (how it is trained: batch size, learning rate).
        meaning: what it is, in a few words, for ``mlhpc automl --knobs`` and messages.
    """

    key: str
    kind: Literal["architecture", "hyperparameter"]
    meaning: str


#: The knobs every workload has, declared by the harness: the training loop's own settings.
COMMON_KNOBS: tuple[Knob, ...] = (
    Knob("train.global_batch_size", "hyperparameter", "samples per optimizer step over all ranks"),
)
