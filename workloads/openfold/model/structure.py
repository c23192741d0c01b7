"""The structure module of AlphaFold 2 (Algorithm 20): invariant point attention (Algorithm
22), backbone update (Algorithm 23), torsion-angle ResNet, all-atom frames from torsion angles
(Algorithm 24) and atom coordinates from the frames and idealised positions.

Shapes: s [B, N, c_s], z [B, N, N, c_z], mask [B, N], aatype [B, N]. Frames are kept in
nanometre-scaled units inside the loop (translations x ``position_scale`` = 10 gives Angstrom)
as the supplement does; every returned position is in Angstrom.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .. import residue_constants as rc
from . import rigid
from .config import AlphaFoldConfig
from .primitives import Linear

_IPA_INF = 1e5  # the reference's structure-module mask value


class InvariantPointAttention(nn.Module):
    """Algorithm 22. forward(s, z, frame, mask) -> single update [B, N, c_s]."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        self.h, self.c, self.eps = cfg.ipa_heads, cfg.ipa_hidden, cfg.eps
        self.p_qk, self.p_v = cfg.ipa_qk_points, cfg.ipa_v_points
        hc = self.h * self.c
        self.linear_q = Linear(cfg.c_s, hc)
        self.linear_kv = Linear(cfg.c_s, 2 * hc)
        self.linear_q_points = Linear(cfg.c_s, self.h * self.p_qk * 3)
        self.linear_kv_points = Linear(cfg.c_s, self.h * (self.p_qk + self.p_v) * 3)
        self.linear_b = Linear(cfg.c_z, self.h)
        self.head_weights = nn.Parameter(torch.full((self.h,), 0.541324854612918))  # softplus^-1(1)
        self.linear_out = Linear(self.h * (cfg.c_z + self.c + 4 * self.p_v), cfg.c_s, init="final")

    def _points(self, linear: Linear, s: torch.Tensor, frame: rigid.Frame, n: int) -> torch.Tensor:
        p = linear(s)
        p = torch.stack(torch.split(p, p.shape[-1] // 3, dim=-1), dim=-1)  # [B, N, H*n, 3]
        p = rigid.apply(rigid.unsqueeze(frame, -1), p)
        return p.view(p.shape[:2] + (self.h, n, 3))

    def _logits(self, s: torch.Tensor, z: torch.Tensor, frame: rigid.Frame, mask: torch.Tensor):
        b, n = s.shape[:2]
        q = self.linear_q(s).view(b, n, self.h, self.c)
        k, v = self.linear_kv(s).view(b, n, self.h, 2 * self.c).split(self.c, dim=-1)
        q_pts = self._points(self.linear_q_points, s, frame, self.p_qk)
        kv_pts = self._points(self.linear_kv_points, s, frame, self.p_qk + self.p_v)
        k_pts, v_pts = kv_pts.split((self.p_qk, self.p_v), dim=-2)
        logits = torch.einsum("bihc,bjhc->bhij", q, k) * math.sqrt(1.0 / (3 * self.c))
        logits = logits + math.sqrt(1.0 / 3) * self.linear_b(z).permute(0, 3, 1, 2)
        d2 = ((q_pts.unsqueeze(2) - k_pts.unsqueeze(1)) ** 2).sum(-1).sum(-1)  # [B, I, J, H]
        w = F.softplus(self.head_weights) * math.sqrt(1.0 / (3 * (self.p_qk * 9.0 / 2)))
        logits = logits - 0.5 * (d2 * w).permute(0, 3, 1, 2)
        square = mask.unsqueeze(-1) * mask.unsqueeze(-2)
        logits = logits + ((square - 1.0) * _IPA_INF).unsqueeze(1)
        return torch.softmax(logits, dim=-1), v, v_pts

    def forward(self, s: torch.Tensor, z: torch.Tensor, frame: rigid.Frame,
                mask: torch.Tensor) -> torch.Tensor:
        a, v, v_pts = self._logits(s, z, frame, mask)
        b, n = s.shape[:2]
        o = torch.einsum("bhij,bjhc->bihc", a, v).reshape(b, n, -1)
        o_pt = torch.einsum("bhij,bjhpx->bihpx", a, v_pts)
        o_pt = rigid.invert_apply(rigid.unsqueeze(rigid.unsqueeze(frame, -1), -1), o_pt)
        o_pt = o_pt.reshape(b, n, self.h * self.p_v, 3)
        o_norm = torch.sqrt((o_pt ** 2).sum(-1) + self.eps)
        o_pair = torch.einsum("bhij,bijc->bihc", a, z).reshape(b, n, -1)
        cat = torch.cat([o, *torch.unbind(o_pt, dim=-1), o_norm, o_pair], dim=-1)
        return self.linear_out(cat)


class AngleResnet(nn.Module):
    """Torsion-angle prediction (Algorithm 20 lines 11-14): -> (unnormalised, normalised)
    (sin, cos) pairs [B, N, 7, 2]."""

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        c_s, c = cfg.c_s, cfg.angle_resnet_hidden
        self.eps = cfg.eps
        self.linear_in = Linear(c_s, c)
        self.linear_initial = Linear(c_s, c)
        self.layers = nn.ModuleList(
            nn.Sequential(nn.ReLU(), Linear(c, c, init="relu"), nn.ReLU(),
                          Linear(c, c, init="final"))
            for _ in range(cfg.angle_resnet_blocks))
        self.linear_out = Linear(c, 14)

    def forward(self, s: torch.Tensor, s_initial: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.linear_in(torch.relu(s)) + self.linear_initial(torch.relu(s_initial))
        for layer in self.layers:
            a = a + layer(a)
        raw = self.linear_out(torch.relu(a)).view(a.shape[:-1] + (7, 2))
        norm = torch.sqrt(torch.clamp((raw ** 2).sum(-1, keepdim=True), min=self.eps))
        return raw, raw / norm


def torsion_angles_to_frames(backbone: rigid.Frame, angles: torch.Tensor,
                             aatype: torch.Tensor) -> rigid.Frame:
    """Algorithm 24: the 8 rigid-group frames [B, N, 8] in global coordinates from the
    backbone frames [B, N] and torsion (sin, cos) [B, N, 7, 2]."""
    default = torch.as_tensor(rc.RESTYPE_RIGID_GROUP_DEFAULT_FRAME, dtype=angles.dtype,
                              device=angles.device)[aatype]
    base = rigid.from_4x4(default)
    sin_cos = torch.cat([torch.stack([torch.zeros_like(angles[..., :1, 0]),
                                      torch.ones_like(angles[..., :1, 0])], -1), angles], -2)
    sin, cos = sin_cos[..., 0], sin_cos[..., 1]
    zero, one = torch.zeros_like(sin), torch.ones_like(sin)
    rot_x = torch.stack([one, zero, zero, zero, cos, -sin, zero, sin, cos], -1)
    rot_x = rot_x.view(sin.shape + (3, 3))
    local = rigid.compose(base, (rot_x, torch.zeros_like(base[1])))
    chain = [(local[0][..., g, :, :], local[1][..., g, :]) for g in range(8)]
    for g in (5, 6, 7):  # chi2..chi4 hang off the previous chi group
        chain[g] = rigid.compose(chain[g - 1], chain[g])
    rots = torch.stack([c[0] for c in chain], dim=-3)
    trans = torch.stack([c[1] for c in chain], dim=-2)
    return rigid.compose(rigid.unsqueeze(backbone, -1), (rots, trans))


def frames_to_atom14(frames: rigid.Frame, aatype: torch.Tensor) -> torch.Tensor:
    """Idealised atom positions placed by their group's frame: [B, N, 14, 3] (zero where the
    residue has no atom)."""
    group = torch.as_tensor(rc.RESTYPE_ATOM14_TO_RIGID_GROUP, device=aatype.device)[aatype]
    lit = torch.as_tensor(rc.RESTYPE_ATOM14_RIGID_GROUP_POSITIONS, dtype=frames[1].dtype,
                          device=aatype.device)[aatype]
    exists = torch.as_tensor(rc.RESTYPE_ATOM14_MASK, dtype=frames[1].dtype,
                             device=aatype.device)[aatype]
    rot = torch.gather(frames[0], -3, group[..., None, None].expand(group.shape + (3, 3)))
    trans = torch.gather(frames[1], -2, group[..., None].expand(group.shape + (3,)))
    return rigid.apply((rot, trans), lit) * exists.unsqueeze(-1)


class StructureModule(nn.Module):
    """Algorithm 20 with ``structure_blocks`` iterations of shared weights.

    forward(s [B, N, c_s], z [B, N, N, c_z], mask [B, N], aatype [B, N]) -> dict with, per
    iteration L: sm_frames [B, L, N, 4, 4] (backbone frames, Angstrom),
    sm_sidechain_frames [B, L, N, 8, 4, 4], sm_unnormalized_angles / sm_angles [B, L, N, 7, 2],
    sm_positions [B, L, N, 14, 3] (Angstrom); and sm_single [B, N, c_s] (the last s).
    The rotation gradient is stopped between iterations (supplement 1.8.2).
    """

    def __init__(self, cfg: AlphaFoldConfig):
        super().__init__()
        c_s = cfg.c_s
        self.num_blocks, self.scale = cfg.structure_blocks, cfg.position_scale
        self.layer_norm_s = nn.LayerNorm(c_s)
        self.layer_norm_z = nn.LayerNorm(cfg.c_z)
        self.linear_in = Linear(c_s, c_s)
        self.ipa = InvariantPointAttention(cfg)
        self.dropout = nn.Dropout(cfg.structure_dropout)
        self.layer_norm_ipa = nn.LayerNorm(c_s)
        self.transition = nn.Sequential(
            Linear(c_s, c_s, init="relu"), nn.ReLU(), Linear(c_s, c_s, init="relu"), nn.ReLU(),
            Linear(c_s, c_s, init="final"))
        self.transition_layer_norm = nn.LayerNorm(c_s)
        self.bb_update = Linear(c_s, 6, init="final")
        self.angle_resnet = AngleResnet(cfg)

    def _iteration(self, s: torch.Tensor, s_initial: torch.Tensor, z: torch.Tensor,
                   frame: rigid.Frame, batch: tuple[torch.Tensor, torch.Tensor]):
        mask, aatype = batch
        s = self.layer_norm_ipa(self.dropout(s + self.ipa(s, z, frame, mask)))
        s = self.transition_layer_norm(self.dropout(s + self.transition(s)))
        frame = rigid.compose(frame, rigid.quaternion_update(self.bb_update(s)))
        raw, angles = self.angle_resnet(s, s_initial)
        scaled = (frame[0], frame[1] * self.scale)
        groups = torsion_angles_to_frames(scaled, angles, aatype)
        out = {"sm_frames": rigid.to_4x4(scaled), "sm_sidechain_frames": rigid.to_4x4(groups),
               "sm_unnormalized_angles": raw, "sm_angles": angles,
               "sm_positions": frames_to_atom14(groups, aatype)}
        return s, (frame[0].detach(), frame[1]), out

    def forward(self, s: torch.Tensor, z: torch.Tensor, mask: torch.Tensor,
                aatype: torch.Tensor, initial_frame: rigid.Frame | None = None) -> dict[str, torch.Tensor]:
        s = self.layer_norm_s(s)
        z = self.layer_norm_z(z)
        s_initial = s
        s = self.linear_in(s)
        # the "black hole" start: every residue at the origin (translation in position_scale
        # units); another start frame moves every output frame and atom rigidly with it
        frame = rigid.identity(s.shape[:-1], s) if initial_frame is None else initial_frame
        outs = []
        for _ in range(self.num_blocks):
            s, frame, out = self._iteration(s, s_initial, z, frame, (mask, aatype))
            outs.append(out)
        result = {k: torch.stack([o[k] for o in outs], dim=1) for k in outs[0]}
        result["sm_single"] = s
        return result
