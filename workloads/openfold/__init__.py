"""OpenFold (MLPerf HPC benchmark ``openfold``): AlphaFold 2 in plain PyTorch, trained on PDB
chains (mmCIF) with their OpenProteinSet alignments (a3m).

Reference: mlcommons/hpc ``openfold/`` and the hpc 3.0.0 rules (``closed_openfold.yaml``).
Metric ``eval_accuracy`` = mean lDDT-Ca over the validation chains (`lddt`), logged with
``epoch_num``; target 0.8. Scored over 10 runs. The model and its loss: `model`; the data:
`data`, `features`, `mmcif`, `a3m`; embedded data: `synth`; training: `training`.
"""

from __future__ import annotations

from typing import Any

from mlhpc.errors import ConfigError, DataError
from mlhpc.workload import Knob, QualityMetric, Workload

from ..departures import training_departures
from .data import OpenFoldDataset, training_set_identity
from .features import VAL_MAX_SEQUENCE_LENGTH
from .formats import DATA_TOOLS
from .lddt import lddt_ca_stats
from .synth import SynthConfig, synthesize
from .training import (
    REFERENCE_CHECKPOINT_SHA256,
    ModelConfig,
    OptimizerConfig,
    build_loss,
    build_model,
    build_optimizer,
    checkpoint_sha256,
    feature_sizes,
    parameter_count,
)

TARGET_LDDT_CA = 0.8
REFERENCE_SAMPLES = (594_595, 180)  # PDB chains released by 2021-09-16 / CAMEO targets
REFERENCE_GLOBAL_BATCH_SIZE = 256
#: The reference's data window (closed_openfold.yaml, logged as facts).
DATA_WINDOW = {"train_max_pdb_release_date": "2021-09-16",
               "val_min_cameo_submission_date": "2021-09-17",
               "val_max_cameo_submission_date": "2021-12-11",
               "val_max_sequence_length": VAL_MAX_SEQUENCE_LENGTH}
#: The reference's evaluation cadence, optimizer steps (closed_openfold.yaml ``val_every_iters``).
REFERENCE_EVAL_EVERY_STEPS = 40

METRIC = QualityMetric(key="eval_accuracy", target=TARGET_LDDT_CA, direction="max",
                       batch_stats=lddt_ca_stats)


def build_datasets(config: Any, runtime: Any, data_dir: Any) -> tuple[OpenFoldDataset, OpenFoldDataset]:
    """The chains of ``data_dir/train`` (cropped, sampled anew at each read) and
    ``data_dir/validation`` (whole, fixed; a chain longer than ``model.val_max_sequence_length``
    refused), limited to ``data.train_samples`` / ``data.eval_samples`` when set. With
    ``model.init_checkpoint`` and ``model.init_checkpoint_data_identity``, the training chains
    must be those the checkpoint was trained on (`data.training_set_identity`, every chain of the
    split). Raises DataError (as `data.OpenFoldDataset`; the identity differs)."""
    del runtime
    sizes = feature_sizes(config.model)
    train = OpenFoldDataset(data_dir / "train", sizes, True, config.train.seed, config.data.train_samples)
    expected = config.model.init_checkpoint_data_identity
    if config.model.init_checkpoint and expected:
        found = training_set_identity(data_dir / "train")
        if found != expected:
            raise DataError(f"these training chains (identity {found[:12]}) are not those "
                            f"model.init_checkpoint {config.model.init_checkpoint} was trained on "
                            f"(model.init_checkpoint_data_identity {expected[:12]}): make the data "
                            "again as the config says (mlhpc data synth) or start from a checkpoint "
                            "trained on these", path=data_dir / "train")
    return train, OpenFoldDataset(data_dir / "validation", sizes, False, config.train.seed,
                                  config.data.eval_samples)


def init_checkpoint_hash(config: Any) -> str | None:
    """sha256 of ``model.init_checkpoint`` (None when unset).

    Raises:
        ConfigError: a closed-division run without the reference's starting checkpoint (unset,
            or a file of another hash), in one line naming the file.
    """
    path = config.model.init_checkpoint
    digest = checkpoint_sha256(path) if path else None
    if config.submission.division == "closed" and digest != REFERENCE_CHECKPOINT_SHA256:
        found = f"{path}: sha256 {digest}" if path else "model.init_checkpoint: not set"
        raise ConfigError(f"{found}; a closed OpenFold run starts from the reference's checkpoint "
                          f"(sha256 {REFERENCE_CHECKPOINT_SHA256})")
    return digest


def hyperparameters(config: Any) -> dict[str, Any]:
    """The keys of closed_openfold.yaml, as the reference's train.py logs them (the harness logs
    global_batch_size, train_samples, eval_samples). ``val_every_iters`` is ``train.eval_every_steps``,
    left out when unset (an evaluation per pass, which the closed rules do not allow). Raises
    ConfigError as `init_checkpoint_hash`."""
    model, opt, loss = config.model, config.optimizer, config.model.loss
    keys: dict[str, Any] = {
        "target_avg_lddt_ca_value": config.train.target if config.train.target is not None else TARGET_LDDT_CA,
        **DATA_WINDOW,
        "train_sequence_crop_size": model.train_sequence_crop_size,
        "num_recycling_iters": model.num_recycling_iters,
        "max_msa_clusters": model.max_msa_clusters, "max_extra_msa": model.max_extra_msa,
        "templates_enabled": model.templates_enabled, "max_templates": model.max_templates,
        "fape_loss_weight": loss.fape_weight, "fape_loss_backbone_weight": loss.fape_backbone_weight,
        "fape_loss_sidechain_weight": loss.fape_sidechain_weight,
        "supervised_chi_loss_weight": loss.chi_weight, "distogram_loss_weight": loss.distogram_weight,
        "masked_msa_loss_weight": loss.masked_msa_weight, "plddt_loss_weight": loss.plddt_weight,
        "opt_name": opt.name, "opt_base_learning_rate": opt.lr, "opt_adam_beta_1": opt.beta_1,
        "opt_adam_beta_2": opt.beta_2, "opt_adam_epsilon": opt.epsilon,
        "opt_weight_decay": opt.weight_decay, "opt_amsgrad": opt.amsgrad,
        "opt_gradient_clipping": True, "opt_gradient_clip_norm": opt.gradient_clip_norm,
        "opt_learning_rate_warmup_init": opt.warmup_init,
        "opt_learning_rate_warmup_steps": opt.warmup_steps,
        "swa_enabled": model.swa_decay_rate > 0, "swa_decay_rate": model.swa_decay_rate,
        "model_parameters_count": parameter_count(model),
        "initial_training_dataloader_type": "InitialTrainingDataloaderPT",
    }
    if config.train.eval_every_steps is not None:
        keys["val_every_iters"] = config.train.eval_every_steps
    digest = init_checkpoint_hash(config)
    if digest is not None:
        keys["init_checkpoint_sha256sum"] = digest
    return keys


def departures(config: Any) -> list[str]:
    """Every way ``config`` departs from the reference closed-division OpenFold run, one line
    each; empty for the reference on the real data."""
    notes: list[str] = []
    if config.data.synthesize_if_missing and config.synth is not None:
        synth = config.synth
        notes.append("data: embedded synthetic chains (mlhpc_workloads.openfold.synth: backbones "
                     "from local sequence motifs, co-varying homologue alignments; N, CA, C, O, "
                     "CB only, no templates) instead of PDB chains with OpenProteinSet alignments")
        notes.append(f"samples {synth.train_chains}/{synth.validation_chains} chains "
                     f"(reference {REFERENCE_SAMPLES[0]}/{REFERENCE_SAMPLES[1]})")
    if not config.model.init_checkpoint:
        notes.append("model.init_checkpoint: none, random initialisation (the reference continues "
                     "a partly trained model)")
    every = config.train.eval_every_steps
    if every != REFERENCE_EVAL_EVERY_STEPS:
        cadence = f"every {every} optimizer steps" if every else "once per pass over the training set"
        notes.append(f"evaluation {cadence} (train.eval_every_steps; the reference: every "
                     f"{REFERENCE_EVAL_EVERY_STEPS} steps)")
    return notes + training_departures(config, ModelConfig(), OptimizerConfig(),
                                       REFERENCE_GLOBAL_BATCH_SIZE, METRIC)


WORKLOAD = Workload(
    name="openfold",
    model_config=ModelConfig,
    optimizer_config=OptimizerConfig,
    synth_config=SynthConfig,
    build_model=build_model,
    build_datasets=build_datasets,
    synthesize=synthesize,
    synth_count_keys=("train_chains", "validation_chains"),
    build_loss=build_loss,
    metric=METRIC,
    build_optimizer=build_optimizer,
    hyperparameters=hyperparameters,
    reference_samples=REFERENCE_SAMPLES,
    departures=departures,
    data_tools=DATA_TOOLS,
    evaluate_at_start=True,
    search_knobs=(
        Knob("model.evoformer_blocks", "architecture", "depth: Evoformer blocks (a changed shape cannot start from model.init_checkpoint)"),
        Knob("model.c_m", "architecture", "width: MSA representation channels (as above)"),
        Knob("model.c_z", "architecture", "width: pair representation channels (as above)"),
        Knob("optimizer.lr", "hyperparameter", "base learning rate after warm-up"),
    ),
)
