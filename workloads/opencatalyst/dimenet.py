"""DimeNet++ for OC20 S2EF in plain PyTorch (no torch-geometric, torch-scatter or torch-sparse).

Follows the reference the MLPerf HPC OpenCatalyst benchmark trains: OCP's
``ocpmodels/models/dimenet_plus_plus.py`` (``DimeNetPlusPlusWrap``, its ``InteractionPPBlock`` and
``OutputPPBlock``) over torch-geometric 1.x's DimeNet layers (``BesselBasisLayer``,
``SphericalBasisLayer``, ``EmbeddingBlock``, ``ResidualLayer``, ``Envelope``); the model of
Gasteiger et al., "Fast and Uncertainty-Aware Directional Message Passing for Non-Equilibrium
Molecules" (DimeNet++, arXiv:2011.14115) on DimeNet (arXiv:2003.03123).

- Graph: the stored edges (OCP preprocessing ``--get-edges``: ``edge_index`` row 0 the neighbour
  j, row 1 the centre i, ``cell_offsets`` the image of j) or, without them, the periodic radius
  graph built here (`radius_graph_pbc`: ``cutoff``, at most ``max_neighbors`` nearest per centre,
  as OCP's ``radius_graph_pbc(data, cutoff, 50)``); distances |pos_j + offsets - pos_i| with
  gradients through the positions (``get_pbc_distances``).
- Triplets k -> j -> i over edges kj and ji, i != k by atom index (the reference's mask).
- Angles between ji and kj computed from positions **detached** from the graph, as the reference
  does (``pos[idx_i].detach()``): forces then flow through the distances only, so they are not
  exactly ``-dE/dpos``. `ModelConfig.detach_angles` keeps this quirk (the default, faithful);
  ``False`` gives exact gradients (the finite-difference test uses it).
- Bases: the Bessel radial basis ``sqrt(2/c) sin(n pi d/c) / (d/c)``-shaped
  ``envelope(d/c) * sin(freq_n d/c)`` with learnable frequencies ``n pi``; the spherical basis
  ``N_ln j_l(z_ln d/c) * envelope(d/c) * Y_l^0(angle)`` with z_ln the n-th zero of the spherical
  Bessel function j_l and N_ln = 1 / sqrt(j_{l+1}(z_ln)^2 / 2) (torch-geometric's
  ``bessel_basis`` and ``real_sph_harm`` with m = 0), zeros found with scipy.
- Energy: the sum over atoms of the output blocks' sums; forces ``-d(energy)/d(pos)`` by autograd.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from pydantic import Field
from scipy import optimize, special
from torch import nn

from mlhpc.config import Section

from .images import check_images


class ModelConfig(Section):
    """DimeNet++ hyperparameters (the reference ``model`` section of ``mlperf_hpc.yml`` and the
    ``DimeNetPlusPlusWrap`` defaults it does not set)."""

    hidden_channels: int = Field(192, ge=1, le=4096, description="hidden embedding size")
    out_emb_channels: int = Field(192, ge=1, le=4096, description="output-block embedding size")
    num_blocks: int = Field(3, ge=1, le=16, description="interaction blocks")
    int_emb_size: int = Field(64, ge=1, le=4096, description="triplet embedding size")
    basis_emb_size: int = Field(8, ge=1, le=1024, description="basis embedding size")
    num_spherical: int = Field(7, ge=1, le=10, description="spherical harmonics degrees l")
    num_radial: int = Field(6, ge=1, le=32, description="radial basis functions")
    cutoff: float = Field(6.0, gt=0, le=20, description="interaction cutoff, Angstrom")
    envelope_exponent: int = Field(5, ge=1, le=16, description="smooth cutoff polynomial exponent")
    num_before_skip: int = Field(1, ge=0, le=8, description="residual layers before the skip")
    num_after_skip: int = Field(2, ge=0, le=8, description="residual layers after the skip")
    num_output_layers: int = Field(3, ge=0, le=8, description="dense layers per output block")
    max_neighbors: int = Field(50, ge=1, le=1000, description="neighbours kept per atom when "
                               "the graph is built here (no stored edges)")
    use_pbc: bool = Field(True, description="periodic boundary conditions")
    detach_angles: bool = Field(True, description="angles from detached positions, as the "
                                "reference (forces through distances only)")


# ---- bases ------------------------------------------------------------------------------------


def _spherical_jn_np(order: int, x: float) -> float:
    return float(special.spherical_jn(order, x))


@lru_cache(maxsize=None)
def bessel_zeros(num_spherical: int, num_radial: int) -> np.ndarray:
    """float64 (num_spherical, num_radial): the first ``num_radial`` positive zeros of the
    spherical Bessel functions j_0 .. j_{num_spherical-1} (j_0's are n pi), found by bracketing
    between the zeros of j_{l-1} (they interlace), as torch-geometric's ``Jn_zeros``."""
    zeros = np.zeros((num_spherical, num_radial))
    points = np.arange(1, num_radial + num_spherical) * np.pi
    zeros[0] = points[:num_radial]
    for order in range(1, num_spherical):
        roots = [optimize.brentq(lambda x: _spherical_jn_np(order, x), points[j], points[j + 1])
                 for j in range(len(points) - 1)]
        points = np.array(roots)
        zeros[order] = points[:num_radial]
    return zeros


def spherical_jn(order: int, x: torch.Tensor) -> torch.Tensor:
    """j_order(x) for a tensor x > 0 (any float dtype), by the closed forms' upward recurrence
    j_{l+1} = (2l+1)/x j_l - j_{l-1} from j_0 = sin x / x, j_1 = sin x / x^2 - cos x / x: the
    same arithmetic as torch-geometric's sympy expressions, differentiable."""
    j_prev = torch.sin(x) / x
    if order == 0:
        return j_prev
    j_cur = torch.sin(x) / x**2 - torch.cos(x) / x
    for ell in range(1, order):
        j_prev, j_cur = j_cur, (2 * ell + 1) / x * j_cur - j_prev
    return j_cur


def legendre(order: int, x: torch.Tensor) -> torch.Tensor:
    """The Legendre polynomial P_order(x) by Bonnet's recurrence."""
    p_prev, p_cur = torch.ones_like(x), x
    if order == 0:
        return p_prev
    for ell in range(1, order):
        p_prev, p_cur = p_cur, ((2 * ell + 1) * x * p_cur - ell * p_prev) / (ell + 1)
    return p_cur


class Envelope(nn.Module):
    """DimeNet's smooth cutoff u(x) = 1/x + a x^(p-1) + b x^p + c x^(p+1) for x < 1, else 0, with
    p = exponent + 1, a = -(p+1)(p+2)/2, b = p(p+2), c = -p(p+1)/2."""

    def __init__(self, exponent: int) -> None:
        super().__init__()
        self.p = exponent + 1
        self.a = -(self.p + 1) * (self.p + 2) / 2
        self.b = self.p * (self.p + 2)
        self.c = -self.p * (self.p + 1) / 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x0 = x.pow(self.p - 1)
        x1, x2 = x0 * x, x0 * x * x
        value = 1.0 / x + self.a * x0 + self.b * x1 + self.c * x2
        return value * (x < 1.0).to(x.dtype)


class BesselBasis(nn.Module):
    """(E,) distances in Angstrom -> (E, num_radial): envelope(d/c) sin(f_n d/c), f_n = n pi
    learnable (torch-geometric ``BesselBasisLayer``)."""

    def __init__(self, num_radial: int, cutoff: float, envelope_exponent: int) -> None:
        super().__init__()
        self.cutoff = cutoff
        self.envelope = Envelope(envelope_exponent)
        self.freq = nn.Parameter(torch.arange(1, num_radial + 1, dtype=torch.float32) * math.pi)

    def forward(self, dist: torch.Tensor) -> torch.Tensor:
        x = dist.unsqueeze(-1) / self.cutoff
        return self.envelope(x) * torch.sin(self.freq * x)


class SphericalBasis(nn.Module):
    """(E,) distances, (T,) angles, (T,) triplet -> kj edge -> (T, num_spherical * num_radial):
    N_ln j_l(z_ln d_kj/c) envelope(d_kj/c) Y_l^0(angle) (torch-geometric ``SphericalBasisLayer``,
    ``zero_m_only``), flattened l-major."""

    def __init__(self, num_spherical: int, num_radial: int, cutoff: float,
                 envelope_exponent: int) -> None:
        super().__init__()
        self.num_spherical, self.num_radial, self.cutoff = num_spherical, num_radial, cutoff
        self.envelope = Envelope(envelope_exponent)
        zeros = bessel_zeros(num_spherical, num_radial)
        norm = np.array([[1.0 / math.sqrt(0.5 * _spherical_jn_np(l + 1, z) ** 2) for z in row]
                         for l, row in enumerate(zeros)])
        # kept in float64 and cast to the distances' dtype at use: a model cast with .double()
        # then evaluates the basis as exactly as torch-geometric's sympy expressions do
        self.zeros64 = torch.tensor(zeros, dtype=torch.float64)
        self.norm64 = torch.tensor(norm, dtype=torch.float64)

    def forward(self, dist: torch.Tensor, angle: torch.Tensor, idx_kj: torch.Tensor) -> torch.Tensor:
        x = (dist / self.cutoff).unsqueeze(-1)  # (E, 1)
        zeros = self.zeros64.to(device=dist.device, dtype=dist.dtype)
        norm = self.norm64.to(device=dist.device, dtype=dist.dtype)
        radial = [norm[l] * spherical_jn(l, zeros[l] * x) for l in range(self.num_spherical)]
        rbf = torch.stack(radial, dim=1) * self.envelope(x).unsqueeze(-1)  # (E, L, R)
        cos = torch.cos(angle)
        cbf = torch.stack([math.sqrt((2 * l + 1) / (4 * math.pi)) * legendre(l, cos)
                           for l in range(self.num_spherical)], dim=1)  # (T, L)
        return (rbf[idx_kj] * cbf.unsqueeze(-1)).reshape(-1, self.num_spherical * self.num_radial)


# ---- graph ------------------------------------------------------------------------------------


def scatter_sum(src: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Sum of the rows of ``src`` (M, ...) into ``size`` rows by ``index`` (M,) int64."""
    out = src.new_zeros((size,) + tuple(src.shape[1:]))
    return out.index_add(0, index, src)


@torch.no_grad()
def radius_graph_pbc(pos: torch.Tensor, cell: torch.Tensor, natoms: torch.Tensor,
                     cutoff: float, max_neighbors: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The periodic radius graph of a batch (OCP ``radius_graph_pbc``): for each structure, every
    image of every atom within ``cutoff`` Angstrom of a centre (self pairs excluded), at most
    ``max_neighbors`` nearest per centre. Positions are wrapped into the cell for the search (so
    the image range ``ceil(cutoff / interplanar spacing)`` suffices for atoms anywhere) and the
    offsets returned are those of the positions as given.

    Args: pos float (N, 3); cell float (B, 3, 3), rows the lattice vectors; natoms int64 (B,).

    Returns:
        ``edge_index`` int64 (2, E) (row 0 neighbour j, row 1 centre i, batch-global atom
        indices, grouped by centre) and ``cell_offsets`` int64 (E, 3), the image of j.

    Raises:
        DataError: a structure's periodic images or distances exceed the bounds of
            `images.check_images` (counted from its cell before any image is built).
    """
    edges, offsets, start = [], [], 0
    for b, n in enumerate(natoms.tolist()):
        c = cell[b].double()
        shift = torch.floor(pos[start:start + n].double() @ torch.linalg.inv(c))  # wrap into the cell
        p = pos[start:start + n].double() - shift @ c
        reach = check_images(c.cpu().numpy(), np.ones(3, dtype=bool), n, cutoff,  # before building any
                             f"structure {b} of the batch").tolist()
        axes = [torch.arange(-r, r + 1, dtype=torch.float64) for r in reach]
        grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), -1).reshape(-1, 3)
        delta = p[None, None, :, :] + (grid @ c)[:, None, None, :] - p[None, :, None, :]
        dist = delta.norm(dim=-1)  # (images, i, j)
        image, centre, neighbour = torch.nonzero((dist <= cutoff) & (dist >= 1e-8), as_tuple=True)
        d = dist[image, centre, neighbour]
        order = torch.argsort(centre.double() * (cutoff + 1.0) + d)  # by centre, then distance
        image, centre, neighbour = image[order], centre[order], neighbour[order]
        first = torch.searchsorted(centre, centre, right=False)
        keep = (torch.arange(len(centre)) - first) < max_neighbors
        neighbour, centre, image = neighbour[keep], centre[keep], image[keep]
        edges.append(torch.stack([neighbour, centre]) + start)
        # the image of j for the unwrapped positions: off = off_wrapped - shift_j + shift_i
        offsets.append((grid[image] - shift[neighbour] + shift[centre]).long())
        start += n
    return torch.cat(edges, dim=1), torch.cat(offsets)


def triplets(edge_index: torch.Tensor, num_nodes: int) -> tuple[torch.Tensor, ...]:
    """Triplets k -> j -> i for edges ``(j, i)`` = ``edge_index`` columns: every edge kj into j
    for every edge ji out of it, with k != i by atom index (the reference's mask).

    Returns:
        ``(idx_i, idx_j, idx_k, idx_kj, idx_ji)`` int64 (T,) each: atoms and edge indices.
    """
    row, col = edge_index  # j -> i
    order = torch.argsort(col, stable=True)  # edges sorted by their centre
    degree = torch.bincount(col, minlength=num_nodes)
    first = torch.cumsum(degree, 0) - degree
    count = degree[row]  # edges into j, for each edge j -> i
    idx_ji = torch.repeat_interleave(torch.arange(row.numel(), device=row.device), count)
    starts = torch.repeat_interleave(first[row], count)
    local = torch.arange(idx_ji.numel(), device=row.device) - torch.repeat_interleave(
        torch.cumsum(count, 0) - count, count)
    idx_kj = order[starts + local]
    idx_i, idx_j, idx_k = col[idx_ji], row[idx_ji], row[idx_kj]
    mask = idx_i != idx_k
    return idx_i[mask], idx_j[mask], idx_k[mask], idx_kj[mask], idx_ji[mask]


# ---- blocks -----------------------------------------------------------------------------------


def _glorot_orthogonal(weight: torch.Tensor, scale: float = 2.0) -> None:
    """torch-geometric's ``glorot_orthogonal``: an orthogonal matrix rescaled to variance
    ``scale / (fan_in + fan_out)``."""
    nn.init.orthogonal_(weight)
    weight.data *= math.sqrt(scale / ((weight.size(0) + weight.size(1)) * weight.data.var().item()))


class ResidualLayer(nn.Module):
    """x + act(W2 act(W1 x + b1) + b2)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        for lin in (self.lin1, self.lin2):
            _glorot_orthogonal(lin.weight)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.lin2(nn.functional.silu(self.lin1(x))))


class EmbeddingBlock(nn.Module):
    """Edge embeddings from the atom types of both ends and the radial basis (torch-geometric
    ``EmbeddingBlock``: ``Embedding(95, hidden)`` uniform in +-sqrt(3))."""

    def __init__(self, num_radial: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(95, hidden)
        nn.init.uniform_(self.emb.weight, -math.sqrt(3), math.sqrt(3))
        self.lin_rbf = nn.Linear(num_radial, hidden)
        self.lin = nn.Linear(3 * hidden, hidden)

    def forward(self, z: torch.Tensor, rbf: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        x = self.emb(z)
        rbf = nn.functional.silu(self.lin_rbf(rbf))
        return nn.functional.silu(self.lin(torch.cat([x[i], x[j], rbf], dim=-1)))


class InteractionPPBlock(nn.Module):
    """DimeNet++'s interaction block (OCP ``InteractionPPBlock``): messages of edges kj, scaled
    by the radial and spherical bases in low dimension, summed into edges ji."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, r = cfg.hidden_channels, cfg.num_radial
        self.lin_rbf1 = nn.Linear(r, cfg.basis_emb_size, bias=False)
        self.lin_rbf2 = nn.Linear(cfg.basis_emb_size, h, bias=False)
        self.lin_sbf1 = nn.Linear(cfg.num_spherical * r, cfg.basis_emb_size, bias=False)
        self.lin_sbf2 = nn.Linear(cfg.basis_emb_size, cfg.int_emb_size, bias=False)
        self.lin_kj, self.lin_ji = nn.Linear(h, h), nn.Linear(h, h)
        self.lin_down = nn.Linear(h, cfg.int_emb_size, bias=False)
        self.lin_up = nn.Linear(cfg.int_emb_size, h, bias=False)
        self.before = nn.ModuleList(ResidualLayer(h) for _ in range(cfg.num_before_skip))
        self.lin = nn.Linear(h, h)
        self.after = nn.ModuleList(ResidualLayer(h) for _ in range(cfg.num_after_skip))
        for lin in (self.lin_rbf1, self.lin_rbf2, self.lin_sbf1, self.lin_sbf2, self.lin_kj,
                    self.lin_ji, self.lin_down, self.lin_up, self.lin):
            _glorot_orthogonal(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor, rbf: torch.Tensor, sbf: torch.Tensor,
                idx_kj: torch.Tensor, idx_ji: torch.Tensor) -> torch.Tensor:
        act = nn.functional.silu
        x_ji, x_kj = act(self.lin_ji(x)), act(self.lin_kj(x))
        x_kj = act(self.lin_down(x_kj * self.lin_rbf2(self.lin_rbf1(rbf))))
        x_kj = x_kj[idx_kj] * self.lin_sbf2(self.lin_sbf1(sbf))
        x_kj = act(self.lin_up(scatter_sum(x_kj, idx_ji, x.size(0))))
        h = x_ji + x_kj
        for layer in self.before:
            h = layer(h)
        h = act(self.lin(h)) + x
        for layer in self.after:
            h = layer(h)
        return h


class OutputPPBlock(nn.Module):
    """Per-atom outputs from edge embeddings (OCP ``OutputPPBlock``: ``lin_up`` with a bias; the
    last layer starts at zero, so an untrained model predicts zero energy)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        h, o = cfg.hidden_channels, cfg.out_emb_channels
        self.lin_rbf = nn.Linear(cfg.num_radial, h, bias=False)
        self.lin_up = nn.Linear(h, o, bias=True)
        self.lins = nn.ModuleList(nn.Linear(o, o) for _ in range(cfg.num_output_layers))
        self.lin = nn.Linear(o, 1, bias=False)
        for lin in (self.lin_rbf, self.lin_up, *self.lins):
            _glorot_orthogonal(lin.weight)
        for lin in self.lins:
            nn.init.zeros_(lin.bias)
        nn.init.zeros_(self.lin.weight)

    def forward(self, x: torch.Tensor, rbf: torch.Tensor, i: torch.Tensor, num_nodes: int) -> torch.Tensor:
        x = scatter_sum(self.lin_rbf(rbf) * x, i, num_nodes)
        x = self.lin_up(x)
        for lin in self.lins:
            x = nn.functional.silu(lin(x))
        return self.lin(x)


# ---- the model --------------------------------------------------------------------------------


class DimeNetPlusPlus(nn.Module):
    """DimeNet++ with periodic boundary conditions and forces (OCP ``DimeNetPlusPlusWrap``).

    ``forward(batch)`` takes the dict a collated OC20 batch holds (``atomic_numbers`` int64 (N,),
    ``pos`` float (N, 3) Angstrom, ``cell`` float (B, 3, 3), ``natoms`` int64 (B,), ``batch``
    int64 (N,); optionally ``edge_index`` int64 (2, E) and ``cell_offsets`` (E, 3)) and returns
    ``(energy float (B,), forces float (N, 3))`` in the units of its training targets. Forces
    are computed under ``torch.enable_grad()`` (also when called under ``no_grad``), with
    ``create_graph`` while training so the loss can differentiate them.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.rbf = BesselBasis(cfg.num_radial, cfg.cutoff, cfg.envelope_exponent)
        self.sbf = SphericalBasis(cfg.num_spherical, cfg.num_radial, cfg.cutoff, cfg.envelope_exponent)
        self.emb = EmbeddingBlock(cfg.num_radial, cfg.hidden_channels)
        self.output_blocks = nn.ModuleList(OutputPPBlock(cfg) for _ in range(cfg.num_blocks + 1))
        self.interaction_blocks = nn.ModuleList(InteractionPPBlock(cfg) for _ in range(cfg.num_blocks))

    def graph(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(edge_index (2, E), offsets float (E, 3) Angstrom)``: stored edges when the batch has
        them, else `radius_graph_pbc`; offsets are ``cell_offsets @ cell`` of each edge's structure."""
        pos, cell = batch["pos"], batch["cell"]
        if "edge_index" in batch:
            edge_index, cell_offsets = batch["edge_index"], batch["cell_offsets"]
        elif self.cfg.use_pbc:
            edge_index, cell_offsets = radius_graph_pbc(pos.detach(), cell, batch["natoms"],
                                                        self.cfg.cutoff, self.cfg.max_neighbors)
        else:
            huge = torch.eye(3, dtype=cell.dtype, device=cell.device).expand_as(cell) * 1e6
            edge_index, cell_offsets = radius_graph_pbc(pos.detach(), huge, batch["natoms"],
                                                        self.cfg.cutoff, self.cfg.max_neighbors)
        if not self.cfg.use_pbc:
            return edge_index, pos.new_zeros((edge_index.size(1), 3))
        structure = batch["batch"][edge_index[1]]
        offsets = torch.bmm(cell_offsets.to(pos.dtype).unsqueeze(1), cell[structure]).squeeze(1)
        return edge_index, offsets

    def energy(self, batch: dict[str, torch.Tensor], pos: torch.Tensor) -> torch.Tensor:
        """float (B,): the energy of each structure at positions ``pos`` (N, 3)."""
        edge_index, offsets = self.graph({**batch, "pos": pos})
        j, i = edge_index
        dist = (pos[j] - pos[i] + offsets).norm(dim=-1)
        idx_i, idx_j, idx_k, idx_kj, idx_ji = triplets(edge_index, pos.size(0))
        base = pos.detach() if self.cfg.detach_angles else pos
        pos_ji = base[idx_j] - base[idx_i] + offsets[idx_ji]
        pos_kj = base[idx_k] - base[idx_j] + offsets[idx_kj]
        angle = torch.atan2(torch.linalg.cross(pos_ji, pos_kj).norm(dim=-1), (pos_ji * pos_kj).sum(-1))
        rbf, sbf = self.rbf(dist), self.sbf(dist, angle, idx_kj)
        x = self.emb(batch["atomic_numbers"].long(), rbf, i, j)
        per_atom = self.output_blocks[0](x, rbf, i, pos.size(0))
        for interaction, output in zip(self.interaction_blocks, self.output_blocks[1:]):
            x = interaction(x, rbf, sbf, idx_kj, idx_ji)
            per_atom = per_atom + output(x, rbf, i, pos.size(0))
        return scatter_sum(per_atom, batch["batch"], int(batch["natoms"].numel())).squeeze(-1)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.enable_grad():
            pos = batch["pos"].detach().requires_grad_(True)
            energy = self.energy(batch, pos)
            (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=self.training)
        return energy, -grad


def build_model(cfg: ModelConfig) -> DimeNetPlusPlus:
    """DimeNet++ of ``cfg`` (float32, CPU)."""
    return DimeNetPlusPlus(cfg)
