"""Synthetic OpenFold batches for the model tests: random features and an ideal-geometry
structure built from random backbone frames and torsion angles (no data files needed)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from mlhpc_workloads.openfold.model import geometry, rigid
from mlhpc_workloads.openfold.model.structure import (
    frames_to_atom14,
    torsion_angles_to_frames,
)


def random_rotations(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    q = torch.randn(shape + (4,), generator=gen)
    q = q / q.norm(dim=-1, keepdim=True)
    return rigid.quaternion_update(torch.cat([q[..., 1:] / q[..., :1], torch.zeros(shape + (3,))], -1))[0]


def structure(aatype: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """atom37 positions [B, N, 37, 3] (Angstrom) and mask [B, N, 37] of a compact chain."""
    b, n = aatype.shape
    t = torch.arange(n, dtype=torch.float32)
    trans = torch.stack([2.3 * torch.cos(1.75 * t), 2.3 * torch.sin(1.75 * t), 1.5 * t], -1)
    trans = trans.expand(b, n, 3) + 0.3 * torch.randn(b, n, 3, generator=gen)
    rot = random_rotations((b, n), gen)
    angles = torch.randn(b, n, 7, 2, generator=gen)
    angles = angles / angles.norm(dim=-1, keepdim=True)
    groups = torsion_angles_to_frames((rot, trans), angles, aatype)
    pos = geometry.atom14_to_atom37(frames_to_atom14(groups, aatype), aatype)
    return pos, geometry.atom37_exists(aatype).float()


def make_batch(n_res: int = 12, n_seq: int = 5, n_extra: int = 7, n_templ: int = 2,
               batch: int = 1, seed: int = 0) -> dict[str, torch.Tensor]:
    """A batch in the agreed interface (inputs and targets) with all residues real."""
    gen = torch.Generator().manual_seed(seed)
    b, n = batch, n_res
    aatype = torch.randint(0, 20, (b, n), generator=gen)
    msa = torch.randint(0, 22, (b, n_seq, n), generator=gen)
    msa[:, 0] = aatype
    pos, mask = structure(aatype, gen)
    t_aatype = torch.randint(0, 20, (b, n_templ, n), generator=gen)
    t_pos, t_mask = structure(t_aatype.view(b * n_templ, n), gen)
    t_pos, t_mask = t_pos.view(b, n_templ, n, 37, 3), t_mask.view(b, n_templ, n, 37)
    t_pb, t_pb_mask = geometry.pseudo_beta(t_aatype, t_pos, t_mask)
    msa_feat = torch.cat([F.one_hot(msa, 23).float(), torch.rand(b, n_seq, n, 2, generator=gen),
                          torch.rand(b, n_seq, n, 24, generator=gen)], -1)
    return {
        "aatype": aatype, "residue_index": torch.arange(n).expand(b, n).clone(),
        "seq_mask": torch.ones(b, n), "target_feat": F.one_hot(aatype + 1, 22).float(),
        "msa_feat": msa_feat, "msa_mask": torch.ones(b, n_seq, n),
        "extra_msa": torch.randint(0, 23, (b, n_extra, n), generator=gen),
        "extra_has_deletion": (torch.rand(b, n_extra, n, generator=gen) < 0.1).float(),
        "extra_deletion_value": torch.rand(b, n_extra, n, generator=gen),
        "extra_msa_mask": torch.ones(b, n_extra, n),
        "template_aatype": t_aatype, "template_all_atom_positions": t_pos,
        "template_all_atom_mask": t_mask, "template_mask": torch.ones(b, n_templ),
        "template_pseudo_beta": t_pb, "template_pseudo_beta_mask": t_pb_mask,
        "all_atom_positions": pos, "all_atom_mask": mask, "true_msa": msa,
        "bert_mask": (torch.rand(b, n_seq, n, generator=gen) < 0.15).float(),
        "resolution": torch.full((b,), 2.0),
    }


def rotation_about(axis: tuple[float, float, float], angle: float) -> torch.Tensor:
    a = torch.tensor(axis, dtype=torch.float32)
    a = a / a.norm()
    k = torch.tensor([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]])
    return torch.eye(3) + math.sin(angle) * k + (1 - math.cos(angle)) * k @ k


def one_thread():
    """Generator for a module fixture: these small tensors run fastest on one thread (on a
    shared 2-core machine, two OpenMP threads per process were 25x slower under load)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def with_sequence(batch: dict[str, torch.Tensor], sequence: str, seed: int = 0) -> dict:
    """The batch (one chain, len(sequence) residues) with that sequence and a structure
    built for it."""
    from mlhpc_workloads.openfold.residue_constants import sequence_to_aatype
    aatype = torch.as_tensor(sequence_to_aatype(sequence)).unsqueeze(0)
    pos, mask = structure(aatype, torch.Generator().manual_seed(seed))
    out = dict(batch, aatype=aatype, all_atom_positions=pos, all_atom_mask=mask)
    out["target_feat"] = F.one_hot(aatype + 1, 22).float()
    return out
