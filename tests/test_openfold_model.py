"""The OpenFold (AlphaFold 2) network: parameter count of the reference configuration, one
training step of a reduced copy, and block-level checks that fail when a block is wrong."""

from __future__ import annotations

import pytest
import torch
from mlhpc_workloads.openfold.model import AlphaFold, AlphaFoldConfig, openfold_loss
from openfold_model_batch import make_batch, one_thread

#: mlperf_logging 4.1, compliance_checker/hpc_3.0.0/closed_openfold.yaml:
#: ``model_parameters_count`` CHECK "v['value'] == 93229082".
REFERENCE_PARAMETER_COUNT = 93_229_082

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def test_reference_configuration_counts_the_pinned_parameters():
    """How the figure was established: closed_openfold.yaml pins 93,229,082 for the MLPerf
    HPC v3.0 OpenFold reference (mlcommons/hpc openfold/, AlphaFoldConfig stage
    "initial_training": c_m 256, c_z 128, c_e 64, c_t 64, c_s 384; 48 Evoformer, 4 extra-MSA,
    2 template pair blocks; 8 structure-module iterations of shared weights; template angle
    embedder 57 -> 256 -> 256; heads pLDDT, distogram, masked MSA, experimentally resolved;
    the TM-score head disabled). Building that reference module tree on the meta device gives
    93,229,082 with the same per-module split as below (evoformer 87,936,384, extra-MSA stack
    2,805,248, structure module 2,019,116, templates 329,408, heads 101,422), so the split
    pins where each parameter lives, not only the total. Built on the meta device: no memory,
    no initialisation."""
    with torch.device("meta"):
        model = AlphaFold(AlphaFoldConfig.reference())
    count = {name: sum(p.numel() for p in child.parameters())
             for name, child in model.named_children()}
    assert sum(count.values()) == REFERENCE_PARAMETER_COUNT
    assert count == {
        "input_embedder": 33_024, "recycling_embedder": 2_816, "template_embedder": 329_408,
        "extra_msa_embedder": 1_664, "extra_msa_stack": 2_805_248, "evoformer": 87_936_384,
        "structure_module": 2_019_116, "aux_heads": 101_422,
    }
    # a TM-score head (the reference's pTM fine-tuning preset) would add c_z*64+64 parameters
    with torch.device("meta"):
        ptm = AlphaFold(AlphaFoldConfig.reference(tm_score_head=True))
    assert sum(p.numel() for p in ptm.parameters()) == REFERENCE_PARAMETER_COUNT + 128 * 64 + 64


def _step(model, batch, cfg, optimiser, recycles=1):
    optimiser.zero_grad()
    out = model(batch, num_recycling_iters=recycles)
    loss, terms = openfold_loss(out, batch, cfg)
    loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    optimiser.step()
    return loss, terms, grads


def test_training_steps_of_a_reduced_copy_on_cpu():
    torch.manual_seed(0)
    cfg = AlphaFoldConfig.mini(checkpoint_blocks=True, chunk_size=4)
    model = AlphaFold(cfg).train()
    batch = make_batch(n_res=8, batch=2)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    loss, terms, grads = _step(model, batch, cfg, optimiser)
    assert torch.isfinite(loss) and loss.item() > 0
    assert set(terms) >= {"fape", "supervised_chi", "distogram", "masked_msa", "plddt",
                          "experimentally_resolved", "weighted_total"}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # AlphaFold's zero-initialised output layers keep the pair path's gradient at zero on
    # the first step; after one update every stack must receive gradient (the extra-MSA
    # embedder only from the third step: its path runs through zero-initialised layers twice)
    loss, _, grads = _step(model, batch, cfg, optimiser)
    assert torch.isfinite(loss)
    for block in ("evoformer", "extra_msa_stack", "template_embedder",
                  "structure_module", "input_embedder", "recycling_embedder", "aux_heads"):
        assert any(g.abs().sum() > 0 for n, g in grads.items() if n.startswith(block)), block


def test_training_on_one_chain_moves_the_structure_towards_it():
    """The whole chain (features -> Evoformer -> structure module -> loss -> Adam, the
    reference's clipping at 0.1) learns: 40 steps on one 16-residue chain raise its
    lDDT-Ca well above the untrained network's (measured 0.29 -> 0.51 on CPU)."""
    from mlhpc_workloads.openfold.model.loss import lddt_ca_per_residue
    torch.manual_seed(0)
    cfg = AlphaFoldConfig.mini(evoformer_blocks=1, structure_blocks=2, msa_dropout=0.0,
                               pair_dropout=0.0, template_dropout=0.0, structure_dropout=0.0)
    model = AlphaFold(cfg)
    batch = make_batch(n_res=16, n_seq=4, n_extra=4, n_templ=1, seed=0)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-6)

    def lddt() -> float:
        model.eval()
        with torch.no_grad():
            pred = model(batch, 0)["final_atom_positions"][..., 1, :]
        return lddt_ca_per_residue(pred, batch["all_atom_positions"][..., 1, :],
                                   batch["all_atom_mask"][..., 1]).mean().item()

    before = lddt()
    losses = []
    for _ in range(40):
        model.train()
        losses.append(_step(model, batch, cfg, optimiser, recycles=0)[0].item())
    assert lddt() > before + 0.12
    assert sum(losses[-5:]) < 0.7 * sum(losses[:5])


def test_config_from_a_mapping_names_an_unknown_key():
    cfg = AlphaFoldConfig.from_mapping("mini", {"c_z": 24, "loss": {"plddt_weight": 0.0}})
    assert cfg.c_z == 24 and cfg.c_m == AlphaFoldConfig.mini().c_m
    assert cfg.loss.plddt_weight == 0.0 and cfg.loss.distogram_weight == 0.3
    assert AlphaFoldConfig.from_mapping("reference", {}) == AlphaFoldConfig.reference()
    for base, mapping, named in (("mini", {"c_q": 1}, "model.c_q"),
                                 ("mini", {"loss": {"fape": 1}}, "model.loss.fape"),
                                 ("huge", {}, "huge")):
        with pytest.raises(ValueError, match=named):
            AlphaFoldConfig.from_mapping(base, mapping)
