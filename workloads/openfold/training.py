"""How OpenFold trains in mlhpc: the config sections, the model with its weight average, the
optimizer with gradient clipping, the loss, and the hyperparameters the reference logs.

Reference: mlcommons/hpc ``openfold/train.py`` (MLPerf HPC v3.0) as its published logs and the
hpc 3.0.0 rules (``closed_openfold.yaml``) record it: Adam (beta 0.9 / 0.999, eps 1e-6, no
weight decay, no AMSGrad) at 1e-3 after a linear warm-up from 1e-5 (0 steps in the reference),
gradients clipped to norm 0.1, a stochastic weight average (an exponential moving average of
the weights, decay 0.9) used for evaluation, the run starting from a given checkpoint whose
sha256 is logged (``init_checkpoint_sha256sum``).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional, get_type_hints

import torch
from pydantic import Field, create_model

from mlhpc.config import Section
from mlhpc.data.inputs import InputRefused, ZipReading, input_chunks, zip_input
from mlhpc.errors import ConfigError

from .features import VAL_MAX_SEQUENCE_LENGTH, FeatureSizes
from .keys import LOSS_KEYS, MODEL_KEYS
from .model import AlphaFold, AlphaFoldConfig, LossConfig, openfold_loss

#: The largest initial checkpoint read (the reference's is about 1.1 GB with its optimizer).
CHECKPOINT_BYTES = 64 << 30
#: How model.init_checkpoint is read: a ZIP archive of stored members (as torch.save writes
#: them), at most `CHECKPOINT_BYTES` on disk and once read.
_STORED_CHECKPOINT = ZipReading(CHECKPOINT_BYTES, CHECKPOINT_BYTES, what="checkpoint", compressed=False)
#: sha256 of the reference's starting checkpoint (closed_openfold.yaml).
REFERENCE_CHECKPOINT_SHA256 = "b518be4677048f2c0f94889c91e2da73655a73b825a8aa7f8b6f5e580d8ffbed"


def _section_of(config_class: type, name: str, extra: dict[str, Any],
                meanings: dict[str, str]) -> type[Section]:
    """A pydantic section with one field per dataclass field (same default, meaning from
    ``meanings``), plus ``extra``."""
    hints = get_type_hints(config_class)
    fields: dict[str, Any] = {}
    for item in dataclasses.fields(config_class):
        if item.name == "loss":
            continue
        meaning = meanings.get(item.name, f"{config_class.__name__}.{item.name} of the network")
        fields[item.name] = (hints[item.name], Field(item.default, description=meaning))
    return create_model(name, __base__=Section, **fields, **extra)


LossSection = _section_of(LossConfig, "LossSection", {}, LOSS_KEYS)
_DATA_FIELDS: dict[str, Any] = {
    "loss": (LossSection, Field(LossSection(), description="loss weights and bins")),
    "train_sequence_crop_size": (int, Field(256, ge=1, description="residues of a training crop")),
    "max_msa_clusters": (int, Field(124, ge=1, description="MSA cluster centres (msa_feat rows)")),
    "max_extra_msa": (int, Field(1024, ge=1, description="extra MSA rows")),
    "max_templates": (int, Field(4, ge=0, description="template slots per chain")),
    "val_max_sequence_length": (int, Field(VAL_MAX_SEQUENCE_LENGTH, ge=1, description=(
        "residues of the longest validation chain, evaluated whole: a longer one is refused "
        "where the dataset is built, before the run starts (the reference's validation "
        "set, closed_openfold.yaml's val_max_sequence_length: 700; evaluated uncropped, "
        "triangle attention holds tri_heads x N^3 float32 values, 5.5 GB at N=700 with the "
        "reference's 4 heads)"))),
    "swa_decay_rate": (float, Field(0.9, ge=0, lt=1, description=(
        "decay of the weight average evaluated (0: evaluate the trained weights)"))),
    "init_checkpoint": (Optional[str], Field(None, description=(  # noqa: UP045 (shown so)
        "file the run starts from (the reference continues a partly trained model); its sha256 "
        "is logged as init_checkpoint_sha256sum; null: random initialisation"))),
    "init_checkpoint_sha256": (Optional[str], Field(REFERENCE_CHECKPOINT_SHA256, description=(  # noqa: UP045
        "sha256 the initial checkpoint must have, checked before the run starts (the "
        "reference's); null: any file"))),
    "init_checkpoint_data_identity": (Optional[str], Field(None, description=(  # noqa: UP045
        "the identity (data.training_set_identity: sha256 of the chains' names and sequences) "
        "of the training chains the initial checkpoint was trained on, checked against "
        "data.path's training chains where the datasets are built, before training: a "
        "checkpoint never continues on chains it was not trained on; null: not checked"))),
}
#: The ``model`` section: every `AlphaFoldConfig` field (reference defaults), its ``loss``, the
#: data pipeline's sizes, the weight average's decay and the initial checkpoint.
ModelConfig = _section_of(AlphaFoldConfig, "ModelConfig", _DATA_FIELDS, MODEL_KEYS)


class OptimizerConfig(Section):
    """The ``optimizer`` section: Adam, warm-up, clipping and the weight average (reference
    defaults, module docstring)."""

    name: str = Field("Adam", pattern="^Adam$", description="optimizer; the closed rules require Adam")
    lr: float = Field(1e-3, gt=0, le=1, description="base learning rate after warm-up")
    beta_1: float = Field(0.9, ge=0, lt=1, description="Adam beta 1")
    beta_2: float = Field(0.999, ge=0, lt=1, description="Adam beta 2")
    epsilon: float = Field(1e-6, gt=0, description="Adam epsilon")
    weight_decay: float = Field(0.0, ge=0, description="Adam weight decay")
    amsgrad: bool = Field(False, description="AMSGrad variant")
    gradient_clip_norm: float = Field(0.1, gt=0, description="global gradient norm clipped to")
    warmup_init: float = Field(1e-5, ge=0, description="learning rate at step 0 of the warm-up")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warm-up")


def feature_sizes(model: Any) -> FeatureSizes:
    """The data pipeline's sizes of a ``model`` section."""
    return FeatureSizes(model.train_sequence_crop_size, model.max_msa_clusters,
                        model.max_extra_msa, model.max_templates, model.val_max_sequence_length)


def alphafold_config(cfg: Any) -> AlphaFoldConfig:
    """The network's `AlphaFoldConfig` of a ``model`` section."""
    values = cfg.model_dump()
    loss = LossConfig(**values.pop("loss"))
    names = {f.name for f in dataclasses.fields(AlphaFoldConfig)}
    return AlphaFoldConfig(**{k: v for k, v in values.items() if k in names}, loss=loss)


class AveragedAlphaFold(torch.nn.Module):
    """AlphaFold with an exponential moving average of its weights (the reference's "SWA"):
    training calls the network, evaluation the averaged weights; `update_average` follows each
    optimizer step. ``forward(batch) -> dict`` as `AlphaFold`.

    The averages are neither parameters (not trained, not counted) nor buffers: DDP broadcasts
    every buffer at each step, and a copy of all weights per step would be wasted (every rank
    holds the same averages). They move with the module (``.to``) and live in its state dict
    under ``swa.<parameter name>``, so checkpoints keep them."""

    def __init__(self, net: AlphaFold, decay: float) -> None:
        super().__init__()
        self.net, self.decay = net, decay
        self.average = {name: p.detach().clone() for name, p in net.named_parameters()}

    @torch.no_grad()
    def update_average(self) -> None:
        """``average = decay * average + (1 - decay) * weight`` for every weight."""
        for name, param in self.net.named_parameters():
            self.average[name].lerp_(param.detach(), 1.0 - self.decay)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.training or self.decay == 0:
            return self.net(batch)
        return torch.func.functional_call(self.net, self.average, (batch,))

    def _apply(self, fn: Any, recurse: bool = True) -> AveragedAlphaFold:
        super()._apply(fn, recurse)
        self.average = {name: fn(value) for name, value in self.average.items()}
        return self

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self.average.items():
            destination[f"{prefix}swa.{name}"] = value if keep_vars else value.detach()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        missing, unexpected = args[2], args[3]
        for name, value in self.average.items():
            key = f"{prefix}swa.{name}"
            if key in state_dict:
                with torch.no_grad():
                    value.copy_(state_dict[key])
            else:
                missing.append(key)
        super()._load_from_state_dict(state_dict, prefix, *args)
        unexpected[:] = [k for k in unexpected if not k.startswith(f"{prefix}swa.")]


def build_model(cfg: Any) -> AveragedAlphaFold:
    """AlphaFold of the ``model`` section, its weights read from ``init_checkpoint`` when set
    (a state dict of `AlphaFold`, bare or under ``"model"``, read without running code),
    wrapped with its weight average.

    Raises:
        ConfigError: the checkpoint's sha256 is not ``init_checkpoint_sha256`` (when set), or it
            cannot be read or does not fit the network (naming it).
    """
    path = Path(cfg.init_checkpoint) if cfg.init_checkpoint else None
    if path is not None:
        digest = checkpoint_sha256(path)
        if cfg.init_checkpoint_sha256 and digest != cfg.init_checkpoint_sha256:
            raise ConfigError(f"{path}: sha256 {digest} is not model.init_checkpoint_sha256 "
                              f"{cfg.init_checkpoint_sha256} (the reference's checkpoint)")
    net = AlphaFold(alphafold_config(cfg))
    if path is not None:
        try:
            # a regular file (a FIFO never waited on), its members stored as torch.save writes
            # them: the tensors read take at most the file's bytes, never what a member inflates to
            with zip_input(path, _STORED_CHECKPOINT) as handle:
                state = torch.load(handle, map_location="cpu", weights_only=True)
            net.load_state_dict(_weights(state))
        except InputRefused as exc:  # the reader's reason, under the key that named the file
            raise ConfigError(f"{path}: model.init_checkpoint cannot be loaded "
                              f"({exc.detail[:200]})") from None
        except (OSError, RuntimeError, ValueError, KeyError, AttributeError, EOFError, TypeError,
                pickle.UnpicklingError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if isinstance(exc, EOFError):
                reason = "an empty or truncated file"
            raise ConfigError(f"{path}: model.init_checkpoint cannot be loaded ({reason[:200]})") from None
    return AveragedAlphaFold(net, cfg.swa_decay_rate)


def _weights(state: Any) -> dict[str, torch.Tensor]:
    """The state dict of a checkpoint file's contents: names to tensors, bare or under
    ``"model"``. Raises ValueError for anything else."""
    weights = state.get("model", state) if isinstance(state, dict) else state
    if not isinstance(weights, dict) or not weights or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in weights.items()):
        raise ValueError("not a state dict of the network: expected names to tensors, bare or "
                         "under 'model'")
    return weights


def build_optimizer(model: AveragedAlphaFold, config: Any, steps_per_epoch: int):
    """Adam over the network's weights, gradients clipped to ``gradient_clip_norm`` before each
    step and the weight average updated after it (optimizer hooks), and a per-step warm-up
    from ``warmup_init`` to ``lr`` over ``warmup_steps``, constant after."""
    del steps_per_epoch
    cfg: OptimizerConfig = config.optimizer
    params = list(model.net.parameters())
    optimizer = torch.optim.Adam(params, lr=cfg.lr, betas=(cfg.beta_1, cfg.beta_2),
                                 eps=cfg.epsilon, weight_decay=cfg.weight_decay, amsgrad=cfg.amsgrad)
    def clip(opt: Any, args: Any, kwargs: Any) -> None:
        torch.nn.utils.clip_grad_norm_(params, cfg.gradient_clip_norm)

    optimizer.register_step_pre_hook(clip)
    optimizer.register_step_post_hook(lambda opt, args, kwargs: model.update_average())
    start = cfg.warmup_init / cfg.lr

    def factor(step: int) -> float:
        if step >= cfg.warmup_steps:
            return 1.0
        return start + (1.0 - start) * step / cfg.warmup_steps

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def build_loss(config: Any) -> Callable[[dict, dict], torch.Tensor]:
    """``(outputs, batch) -> 0-d loss``: the reference's weighted loss (`openfold_loss`)."""
    af_config = alphafold_config(config.model)

    def loss(outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return openfold_loss(outputs, batch, af_config)[0]

    return loss


def checkpoint_sha256(path: Path) -> str:
    """Hex sha256 of a file, read through `mlhpc.data.inputs.input_chunks` (a regular file, not a
    link out of place), once per version of the file in a process: the model's build checks it and
    the log records it (``init_checkpoint_sha256sum``), and the reference's file is 1.1 GiB. A
    version is the file's device, inode, size and modification time. Raises ConfigError when it
    cannot be read (naming it)."""
    try:
        st = os.stat(path)
    except OSError:
        return _sha256(str(path), None)  # input_chunks names the problem in one line
    return _sha256(str(path), (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns))


@functools.lru_cache(maxsize=8)
def _sha256(path: str, version: tuple[int, int, int, int] | None) -> str:
    del version  # the cache's key: another version of the file is hashed again
    digest = hashlib.sha256()
    for chunk in input_chunks(Path(path), CHECKPOINT_BYTES, what="initial checkpoint", error=ConfigError):
        digest.update(chunk)
    return digest.hexdigest()


def parameter_count(cfg: Any) -> int:
    """Parameters of the network of a ``model`` section (built on the meta device: no memory)."""
    with torch.device("meta"):
        net = AlphaFold(alphafold_config(cfg))
    return sum(p.numel() for p in net.parameters())
