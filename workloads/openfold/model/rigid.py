"""Rigid transformations (frames) as plain tensors: a frame is ``(rot [*, 3, 3], trans [*, 3])``
mapping local coordinates x to global ``rot @ x + trans`` (Angstrom or nm as the caller uses).

Source followed: AlphaFold 2 supplement section 1.1 (frames), Algorithm 21 (frames from three
points), Algorithm 23 (quaternion backbone update); written for this project.
"""

from __future__ import annotations

import torch

Frame = tuple[torch.Tensor, torch.Tensor]


def identity(shape: tuple[int, ...], like: torch.Tensor) -> Frame:
    """Identity frames of batch ``shape`` with ``like``'s dtype and device."""
    rot = torch.eye(3, dtype=like.dtype, device=like.device).expand(*shape, 3, 3).clone()
    return rot, like.new_zeros(*shape, 3)


def apply(frame: Frame, points: torch.Tensor) -> torch.Tensor:
    """Local -> global: ``rot @ p + trans`` for points [*, 3] broadcast against the frames."""
    rot, trans = frame
    return torch.einsum("...ij,...j->...i", rot, points) + trans


def invert_apply(frame: Frame, points: torch.Tensor) -> torch.Tensor:
    """Global -> local: ``rot^T @ (p - trans)``."""
    rot, trans = frame
    return torch.einsum("...ji,...j->...i", rot, points - trans)


def compose(a: Frame, b: Frame) -> Frame:
    """The frame ``a o b`` (first b, then a)."""
    return a[0] @ b[0], torch.einsum("...ij,...j->...i", a[0], b[1]) + a[1]


def invert(frame: Frame) -> Frame:
    rot_t = frame[0].transpose(-1, -2)
    return rot_t, -torch.einsum("...ij,...j->...i", rot_t, frame[1])


def unsqueeze(frame: Frame, dim: int) -> Frame:
    """Insert a batch dim (negative ``dim`` counts over the batch dims only)."""
    return frame[0].unsqueeze(dim - 2 if dim < 0 else dim), frame[1].unsqueeze(dim - 1 if dim < 0 else dim)


def from_4x4(m: torch.Tensor) -> Frame:
    return m[..., :3, :3], m[..., :3, 3]


def to_4x4(frame: Frame) -> torch.Tensor:
    rot, trans = frame
    top = torch.cat([rot, trans.unsqueeze(-1)], dim=-1)
    bottom = rot.new_zeros(rot.shape[:-2] + (1, 4))
    bottom[..., 0, 3] = 1.0
    return torch.cat([top, bottom], dim=-2)


def from_three_points(p_neg_x: torch.Tensor, origin: torch.Tensor, p_xy: torch.Tensor,
                      eps: float = 1e-8) -> Frame:
    """Gram-Schmidt frame (Algorithm 21): x axis from ``p_neg_x`` towards ``origin``, the xy
    plane through ``p_xy``, origin at ``origin``. Inputs [*, 3]."""
    e0 = origin - p_neg_x
    e0 = e0 / torch.sqrt((e0 * e0).sum(-1, keepdim=True) + eps)
    e1 = p_xy - origin
    e1 = e1 - e0 * (e0 * e1).sum(-1, keepdim=True)
    e1 = e1 / torch.sqrt((e1 * e1).sum(-1, keepdim=True) + eps)
    e2 = torch.cross(e0, e1, dim=-1)
    return torch.stack([e0, e1, e2], dim=-1), origin


def backbone_frame(n: torch.Tensor, ca: torch.Tensor, c: torch.Tensor, eps: float = 1e-8) -> Frame:
    """Residue frame of Algorithm 21: origin CA, x along CA->C, N in the xy plane (y > 0)."""
    return from_three_points(2 * ca - c, ca, n, eps)


def quaternion_update(update: torch.Tensor) -> Frame:
    """Backbone update of Algorithm 23: [*, 6] (b, c, d, t) -> frame with rotation from the
    unnormalised quaternion (1, b, c, d) and translation t."""
    b, c, d = update[..., 0], update[..., 1], update[..., 2]
    norm = torch.sqrt(1 + b * b + c * c + d * d)
    a, b, c, d = 1 / norm, b / norm, c / norm, d / norm
    rot = torch.stack([
        a * a + b * b - c * c - d * d, 2 * (b * c - a * d), 2 * (b * d + a * c),
        2 * (b * c + a * d), a * a - b * b + c * c - d * d, 2 * (c * d - a * b),
        2 * (b * d - a * c), 2 * (c * d + a * b), a * a - b * b - c * c + d * d,
    ], dim=-1).view(update.shape[:-1] + (3, 3))
    return rot, update[..., 3:]
