"""The OpenFold training pieces on the data side: the weight average the benchmark evaluates
(decay, evaluation uses it, not a DDP buffer, kept in the state dict), clipping, the schedule."""

from __future__ import annotations

from pathlib import Path

import torch
from mlhpc_workloads.openfold.training import (
    AveragedAlphaFold,
    build_model,
    build_optimizer,
)

from mlhpc import config as cfg

ROOT = Path(__file__).resolve().parents[1]


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, batch):
        return {"out": self.w * batch["x"]}


def test_the_average_follows_the_weights_and_evaluation_uses_it():
    model = AveragedAlphaFold(_Net(), decay=0.9)
    with torch.no_grad():
        model.net.w.fill_(2.0)
    model.update_average()
    assert torch.allclose(model.average["w"], torch.full((3,), 1.1))  # 0.9 * 1 + 0.1 * 2
    x = {"x": torch.ones(3)}
    assert torch.allclose(model.train()(x)["out"], torch.full((3,), 2.0))
    assert torch.allclose(model.eval()(x)["out"], torch.full((3,), 1.1))
    assert list(model.buffers()) == [] and [n for n, _ in model.named_parameters()] == ["net.w"]


def test_the_average_moves_and_is_saved_and_restored():
    model = AveragedAlphaFold(_Net(), decay=0.5)
    model.average["w"].fill_(7.0)
    state = model.state_dict()
    assert torch.equal(state["swa.w"], torch.full((3,), 7.0))
    other = AveragedAlphaFold(_Net(), decay=0.5)
    other.load_state_dict(state)
    assert torch.equal(other.average["w"], torch.full((3,), 7.0))
    assert other.double().average["w"].dtype == torch.float64
    del state["swa.w"]
    result = AveragedAlphaFold(_Net(), decay=0.5).load_state_dict(state, strict=False)
    assert result.missing_keys == ["swa.w"]


def test_gradients_are_clipped_before_each_step_and_the_average_updated_after():
    config = cfg.load(ROOT / "configs" / "openfold-mini.yaml",
                      ("model.evoformer_blocks=1", "model.structure_blocks=1", "model.init_checkpoint=null"))
    model = build_model(config.model)
    optimizer, scheduler = build_optimizer(model, config, 1)
    params = list(model.net.parameters())
    for p in params:
        p.grad = torch.full_like(p, 10.0)
    before = {n: v.clone() for n, v in model.average.items()}
    optimizer.step()
    norm = torch.sqrt(sum((p.grad ** 2).sum() for p in params))
    assert abs(float(norm) - config.optimizer.gradient_clip_norm) < 1e-4
    moved = [n for n in before if not torch.equal(before[n], model.average[n])]
    assert moved and scheduler.get_last_lr()[0] == config.optimizer.lr  # no warm-up in the reference


def test_one_training_step_on_a_real_pdb_entry(tmp_path):
    """PDB 1AKI (a real mmCIF with every side chain) and an a3m of its sequence, in the data
    layout, read by the dataset and trained on for one step by a reduced-depth network of the
    mini config: finite loss, gradients on the weights, a metric in [0, 1]."""
    import shutil

    from test_openfold_data import LYSOZYME

    from mlhpc.workload import get

    split = tmp_path / "data" / "train"
    (split / "mmcif_files").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "data" / "openfold" / "1aki.cif.gz", split / "mmcif_files")
    chain_dir = split / "alignments" / "1aki_A"
    chain_dir.mkdir(parents=True)
    mutant = LYSOZYME[:10] + "A" + LYSOZYME[11:]
    (chain_dir / "uniref90_hits.a3m").write_text(f">1aki_A\n{LYSOZYME}\n>h1\n{mutant}\n>h2\n-{LYSOZYME[1:]}\n")
    shutil.copytree(split, tmp_path / "data" / "validation")
    config = cfg.load(ROOT / "configs" / "openfold-mini.yaml",
                      ("model.evoformer_blocks=1", "model.structure_blocks=1", "model.init_checkpoint=null",
                       "model.num_recycling_iters=0", "model.max_msa_clusters=4",
                       "model.max_extra_msa=4", "train.seed=3"))
    workload = get("openfold")
    train, valid = workload.build_datasets(config, None, tmp_path / "data")
    x, y = train.collate_fn([train[0]])
    crop = config.model.train_sequence_crop_size  # the lysozyme chain (129 residues) is cropped
    assert x["aatype"].shape == (1, crop) and y["all_atom_mask"][0].sum() > crop * 5  # side chains
    model = workload.build_model(config.model)
    optimizer, _ = workload.build_optimizer(model, config, 1)
    loss = workload.build_loss(config)(model.train()(x), y)
    loss.backward()
    assert torch.isfinite(loss) and any(p.grad is not None and p.grad.abs().sum() > 0
                                        for p in model.net.parameters())
    optimizer.step()
    with torch.no_grad():
        xv, yv = valid.collate_fn([valid[0]])
        total, count = workload.metric.batch_stats(model.eval()(xv), yv)
    assert xv["aatype"].shape == (1, 129) and float(count) == 1.0 and 0.0 <= float(total) <= 1.0
