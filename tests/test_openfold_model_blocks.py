"""Block-level properties of the OpenFold network that fail when a block is wrong:
structure-module equivariance, the outgoing/incoming and starting/ending distinctions,
padding invariance, chunked = unchunked, recycling."""

from __future__ import annotations

import pytest
import torch
from mlhpc_workloads.openfold.model import (
    AlphaFold,
    AlphaFoldConfig,
    geometry,
    loss,
    openfold_loss,
    recycling_iterations,
    rigid,
)
from mlhpc_workloads.openfold.model.heads import compute_plddt
from mlhpc_workloads.openfold.model.pair import (
    TriangleAttention,
    TriangleMultiplication,
)
from mlhpc_workloads.openfold.model.structure import StructureModule
from openfold_model_batch import make_batch, one_thread, rotation_about

_threads = pytest.fixture(scope="module", autouse=True)(one_thread)


def _perturb(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Give the zero-initialised output layers weight, so that every path carries signal."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return module.eval()


def _model(seed: int = 0, **overrides) -> AlphaFold:
    torch.manual_seed(seed)
    return _perturb(AlphaFold(AlphaFoldConfig.mini(**overrides)), seed)


def test_structure_module_is_equivariant():
    cfg = AlphaFoldConfig.mini()
    torch.manual_seed(1)
    sm = _perturb(StructureModule(cfg), 1)
    batch = make_batch(n_res=9, seed=1)
    n = 9
    s, z = torch.randn(1, n, cfg.c_s), torch.randn(1, n, n, cfg.c_z)
    mask, aatype = batch["seq_mask"], batch["aatype"]
    rot = rotation_about((0.3, -1.0, 0.5), 2.1)
    shift = torch.tensor([12.0, -7.0, 30.0])  # Angstrom
    start = (rot.expand(1, n, 3, 3), (shift / cfg.position_scale).expand(1, n, 3))
    with torch.no_grad():
        out = sm(s, z, mask, aatype)
        moved = sm(s, z, mask, aatype, initial_frame=start)
    expected = torch.einsum("ij,...j->...i", rot, out["sm_positions"]) + shift
    exists = geometry.atom14_ground_truth(aatype, batch["all_atom_positions"],
                                          batch["all_atom_mask"])["atom14_atom_exists"]
    expected = expected * exists[:, None, ..., None]
    assert not torch.allclose(moved["sm_positions"], out["sm_positions"], atol=1.0)
    torch.testing.assert_close(moved["sm_positions"], expected, atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(moved["sm_single"], out["sm_single"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(moved["sm_angles"], out["sm_angles"], atol=1e-4, rtol=1e-4)
    # pLDDT reads sm_single; FAPE compares frames with frames, so a rigid motion of the
    # whole prediction leaves both unchanged
    gt = geometry.ground_truth(batch)
    for key in ("sm_frames", "sm_sidechain_frames"):
        assert not torch.allclose(moved[key], out[key], atol=1.0)
    fape = [loss.backbone_fape(o, gt, torch.ones(1), cfg.loss) + loss.sidechain_fape(o, gt, cfg.loss)
            for o in (out, moved)]
    torch.testing.assert_close(fape[0], fape[1], atol=1e-4, rtol=1e-4)
    assert fape[0].item() > 0.05


def _rigid_motion(batch: dict, rot: torch.Tensor, shift: torch.Tensor) -> dict:
    moved = dict(batch)
    for key in ("template_all_atom_positions", "all_atom_positions", "template_pseudo_beta"):
        moved[key] = torch.einsum("ij,...j->...i", rot, batch[key]) + shift
    return moved


def test_whole_model_is_invariant_to_a_rigid_motion_of_its_coordinates():
    model = _model(2)
    batch = make_batch(n_res=8, seed=2)
    moved = _rigid_motion(batch, rotation_about((1.0, 2.0, -0.5), 0.9), torch.tensor([5.0, 1.0, -9.0]))
    with torch.no_grad():
        out, out_moved = model(batch, 1), model(moved, 1)
        total = openfold_loss(out, batch, model.config)[0]
        total_moved = openfold_loss(out_moved, moved, model.config)[0]
    torch.testing.assert_close(out_moved["plddt"], out["plddt"], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(total_moved, total, atol=1e-3, rtol=1e-4)


def test_triangle_updates_outgoing_and_incoming_are_transposes():
    torch.manual_seed(3)
    out_mul = _perturb(TriangleMultiplication(8, 6, outgoing=True), 3)
    in_mul = TriangleMultiplication(8, 6, outgoing=False)
    in_mul.load_state_dict(out_mul.state_dict())
    swapped = TriangleMultiplication(8, 6, outgoing=False)  # the a and b projections swapped
    swapped.load_state_dict({k.replace("_a_", "_x_").replace("_b_", "_a_").replace("_x_", "_b_"): v
                             for k, v in out_mul.state_dict().items()})
    z = torch.randn(1, 7, 7, 8)
    mask = (torch.rand(1, 7, 7) > 0.2).float()
    with torch.no_grad():
        a, b = out_mul(z, mask), in_mul(z, mask)
        b_t = swapped(z.transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
    # the two updates differ, and only by a transposition: incoming on z^T (its edges
    # ki, kj are z's ik, jk) is outgoing on z, with a and b trading roles
    assert not torch.allclose(a, b, atol=1e-3)
    torch.testing.assert_close(a, b_t, atol=1e-5, rtol=1e-5)
    # outgoing: edge ij from edges ik and jk (Algorithm 11), checked on one entry
    zn = out_mul.layer_norm_in(z)
    left = torch.sigmoid(out_mul.linear_a_g(zn)) * out_mul.linear_a_p(zn) * mask[..., None]
    right = torch.sigmoid(out_mul.linear_b_g(zn)) * out_mul.linear_b_p(zn) * mask[..., None]
    x = (left[0, 2] * right[0, 5]).sum(0)
    x = out_mul.linear_z(out_mul.layer_norm_out(x)) * torch.sigmoid(out_mul.linear_g(zn[0, 2, 5]))
    torch.testing.assert_close(a[0, 2, 5], x.detach(), atol=1e-5, rtol=1e-5)


def test_triangle_attention_starting_and_ending_are_transposes():
    torch.manual_seed(4)
    start = _perturb(TriangleAttention(8, 4, 2, starting=True, inf=1e9), 4)
    end = TriangleAttention(8, 4, 2, starting=False, inf=1e9)
    end.load_state_dict(start.state_dict())
    z = torch.randn(1, 6, 6, 8)
    mask = (torch.rand(1, 6, 6) > 0.2).float()
    with torch.no_grad():
        a, b = start(z, mask), end(z, mask)
        b_t = end(z.transpose(1, 2), mask.transpose(1, 2)).transpose(1, 2)
    assert not torch.allclose(a, b, atol=1e-3)
    torch.testing.assert_close(a, b_t, atol=1e-5, rtol=1e-5)


def _pad(batch: dict, extra_res: int, extra_rows: int) -> dict:
    """Append masked residues (junk features) and masked MSA / extra-MSA rows."""
    gen = torch.Generator().manual_seed(9)
    padded = {}
    for key, value in batch.items():
        junk = value
        if key in ("msa_feat", "msa_mask", "true_msa", "bert_mask", "extra_msa",
                   "extra_has_deletion", "extra_deletion_value", "extra_msa_mask"):
            junk = torch.cat([value, value[:, :extra_rows]], 1)
        padded[key] = junk
    n = batch["aatype"].shape[1]
    for key, value in list(padded.items()):
        dims = [d for d in range(1, value.dim()) if value.shape[d] == n][:2]
        for d in dims:
            shape = list(value.shape)
            shape[d] = extra_res
            fill = torch.randint(0, 20, shape, generator=gen) if not value.is_floating_point() \
                else torch.rand(shape, generator=gen) * 5
            value = torch.cat([value, fill.to(value.dtype)], d)
        padded[key] = value
    padded["seq_mask"][:, n:] = 0
    padded["all_atom_mask"][:, n:] = 0
    padded["template_all_atom_mask"][:, :, n:] = 0
    padded["template_pseudo_beta_mask"][:, :, n:] = 0
    s = batch["msa_mask"].shape[1]
    for key in ("msa_mask", "bert_mask"):
        padded[key][:, :, n:] = 0
        padded[key][:, s:] = 0
    e = batch["extra_msa_mask"].shape[1]
    padded["extra_msa_mask"][:, :, n:] = 0
    padded["extra_msa_mask"][:, e:] = 0
    return padded


def test_padding_a_crop_changes_nothing_on_the_real_residues():
    model = _model(5)
    batch = make_batch(n_res=8, n_seq=3, n_extra=4, seed=5)
    padded = _pad(batch, extra_res=3, extra_rows=2)
    with torch.no_grad():
        out, out_pad = model(batch, 1), model(padded, 1)
        total = openfold_loss(out, batch, model.config)[0]
        total_pad = openfold_loss(out_pad, padded, model.config)[0]
    n, s = 8, 3
    tol = {"atol": 1e-4, "rtol": 1e-4}
    torch.testing.assert_close(out_pad["single"][:, :n], out["single"], **tol)
    torch.testing.assert_close(out_pad["pair"][:, :n, :n], out["pair"], **tol)
    torch.testing.assert_close(out_pad["masked_msa_logits"][:, :s, :n], out["masked_msa_logits"], **tol)
    torch.testing.assert_close(out_pad["final_atom_positions"][:, :n], out["final_atom_positions"],
                               atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(out_pad["plddt"][:, :n], out["plddt"], atol=1e-3, rtol=1e-4)
    torch.testing.assert_close(total_pad, total, atol=1e-3, rtol=1e-4)


def test_chunked_attention_equals_unchunked():
    batch = make_batch(n_res=9, n_seq=5, n_extra=6, seed=6)
    whole, chunked = _model(6), _model(6, chunk_size=2)
    assert all(torch.equal(a, b) for a, b in zip(whole.parameters(), chunked.parameters()))
    with torch.no_grad():
        a, b = whole(batch, 0), chunked(batch, 0)
    for key in ("pair", "msa", "single", "final_atom_positions", "plddt"):
        torch.testing.assert_close(b[key], a[key], atol=1e-4, rtol=1e-4)


def test_recycling_runs_the_maximum_in_eval_and_backpropagates_through_the_last_pass_only():
    model = _model(7)
    batch = make_batch(n_res=6, n_seq=2, n_extra=2, n_templ=1, seed=7)
    with torch.no_grad():
        out = model(batch)
        zero = model(batch, 0)
    assert int(out["num_recycling_iters"]) == 3
    assert not torch.allclose(out["single"], zero["single"], atol=1e-3)  # recycling matters
    calls = []
    model.evoformer.linear.register_full_backward_hook(lambda *args: calls.append(1))
    model.train()
    out = model(batch, 2)
    openfold_loss(out, batch, model.config)[0].backward()
    assert len(calls) == 1
    draws = list(zip(range(40), recycling_iterations(3, seed=0)))
    counts = [sum(1 for _, d in draws if d == k) for k in range(4)]
    assert counts == [10, 10, 10, 10]


@pytest.mark.parametrize("seed", [0, 1])
def test_frames_from_the_true_structure_rebuild_its_atoms(seed):
    """Ground-truth torsions and backbone frames fed through the all-atom construction
    (Algorithm 24) give back the true atoms: the frame and angle conventions agree."""
    from mlhpc_workloads.openfold.model.structure import (
        frames_to_atom14,
        torsion_angles_to_frames,
    )
    batch = make_batch(n_res=7, seed=seed)
    aatype, pos, mask = batch["aatype"], batch["all_atom_positions"], batch["all_atom_mask"]
    gt = geometry.ground_truth(batch)
    torsions = geometry.torsion_angles(aatype, pos, mask)["torsion_angles_sin_cos"]
    frames = torsion_angles_to_frames(rigid.from_4x4(gt["backbone_rigid_tensor"]), torsions, aatype)
    rebuilt = frames_to_atom14(frames, aatype)
    # psi places O; pre-omega and phi place no heavy atom; residue 0 has no phi
    torch.testing.assert_close(rebuilt * gt["atom14_gt_exists"][..., None],
                               gt["atom14_gt_positions"], atol=2e-3, rtol=1e-4)
    torch.testing.assert_close(compute_plddt(torch.zeros(3, 50)), torch.full((3,), 50.0))


def test_template_torsion_features_of_missing_angles_follow_the_config():
    """The reference feeds residue 0's pre-omega and phi (no predecessor) unmasked, so they
    move with the template's position in space; zeroing missing angles removes that."""
    from mlhpc_workloads.openfold.model.template import template_angle_feat
    batch = make_batch(n_res=5, seed=8)
    moved = _rigid_motion(batch, torch.eye(3), torch.tensor([4.0, -3.0, 2.0]))
    for zero_missing, invariant in ((True, True), (False, False)):
        a, mask = template_angle_feat(batch, zero_missing)
        b, _ = template_angle_feat(moved, zero_missing)
        assert torch.allclose(a, b, atol=1e-4) is invariant
        assert mask[..., 0, :2].sum() == 0  # residue 0: no pre-omega, no phi
    assert AlphaFoldConfig.reference().zero_missing_template_angles is False
    assert AlphaFoldConfig.mini().zero_missing_template_angles is True


def _counting(forward, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)
    return wrapped


def test_checkpointed_blocks_give_the_same_loss_and_gradients():
    """Activation checkpointing recomputes each stack block in the backward pass (with the
    same dropout masks): the same loss and gradients as keeping every activation."""
    batch = make_batch(n_res=7, n_seq=3, n_extra=3, seed=10)
    results, calls = [], []
    for use in (False, True):
        model = _model(10, checkpoint_blocks=use).train()
        count, block = [], model.evoformer.blocks[0]
        block.forward = _counting(block.forward, count)  # (forward hooks skip the recompute)
        torch.manual_seed(11)
        out = model(batch, 0)
        total = openfold_loss(out, batch, model.config)[0]
        total.backward()
        results.append((total.detach(), [p.grad.clone() for p in model.parameters()]))
        calls.append(len(count))
    assert calls == [1, 2]  # the checkpointed block ran again in the backward pass
    torch.testing.assert_close(results[1][0], results[0][0])
    for a, b in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
