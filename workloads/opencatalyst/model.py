"""DimeNet++ for OC20 S2EF in plain PyTorch: energy per structure and forces as its negative
gradient with respect to the positions.

Source: the MLPerf HPC OpenCatalyst reference, mlcommons/hpc ``open_catalyst/``:
``ocpmodels/models/dimenet_plus_plus.py`` (``DimeNetPlusPlusWrap``, ``InteractionPPBlock``,
``OutputPPBlock``) on torch-geometric's DimeNet layers, with the ``model`` section of
``configs/mlperf_hpc.yml``; the model of Gasteiger et al., "Fast and Uncertainty-Aware Directional
Message Passing for Non-Equilibrium Molecules" (DimeNet++, arXiv:2011.14115) on DimeNet
(arXiv:2003.03123). Parameter names are the reference's, so an OCP checkpoint's state dict (less
its ``module.`` prefix) loads into `DimeNetPlusPlus`.

What the reference does that a reader might not expect, kept here:

- the angles of the triplets are computed from **detached** positions (``pos[idx].detach()``), so
  its forces flow through the edge lengths only and are not exactly ``-dE/dpos``;
  ``ModelConfig.detach_angles`` (default ``True``, the reference) turns this off for exact
  gradients;
- the angle is the one between v_ji = j - i and v_kj = k - j (pi minus the bond angle k-j-i);
- triplets with k == i by atom index are dropped, also when k is another periodic image of i;
- edges of zero length are dropped from stored graphs (``get_pbc_distances``);
- the output blocks' up-projection has a bias (torch-geometric 2.x's has none: 768 parameters
  fewer at the reference size);
- with ``use_pbc: False`` the reference builds torch-cluster's radius graph (at most 32
  neighbours, not necessarily the nearest); here the same nearest-``max_neighbors`` graph as the
  periodic one, without images.
"""

from __future__ import annotations

import torch
from pydantic import Field
from torch import nn

from mlhpc.config import Section

from .basis import BesselBasisLayer, SphericalBasisLayer
from .graph import edge_vectors, radius_graph_pbc, scatter_sum, triplet_angles, triplets

NUM_ELEMENTS = 95  # embedding rows: atomic numbers 0..94 (torch-geometric's EmbeddingBlock)


class ModelConfig(Section):
    """DimeNet++ hyperparameters: the reference's ``model`` section (``mlperf_hpc.yml``) and the
    ``DimeNetPlusPlusWrap`` arguments it leaves at their defaults (``int_emb_size`` 64,
    ``basis_emb_size`` 8, ``envelope_exponent`` 5, ``otf_graph`` False, 50 neighbours in its
    on-the-fly graph and in the OCP preprocessing)."""

    hidden_channels: int = Field(192, ge=1, le=4096, description="edge embedding size")
    out_emb_channels: int = Field(192, ge=1, le=4096, description="output-block embedding size")
    num_blocks: int = Field(3, ge=1, le=16, description="interaction blocks")
    int_emb_size: int = Field(64, ge=1, le=4096, description="triplet (interaction) embedding size")
    basis_emb_size: int = Field(8, ge=1, le=1024, description="basis embedding size")
    num_spherical: int = Field(7, ge=1, le=10, description="spherical harmonics degrees l = 0..L-1")
    num_radial: int = Field(6, ge=1, le=64, description="radial basis functions")
    cutoff: float = Field(6.0, gt=0.0, le=20.0, description="interaction cutoff, Angstrom")
    envelope_exponent: int = Field(5, ge=1, le=16, description="exponent of the smooth cutoff polynomial")
    num_before_skip: int = Field(1, ge=0, le=8, description="residual layers before the skip connection")
    num_after_skip: int = Field(2, ge=0, le=8, description="residual layers after the skip connection")
    num_output_layers: int = Field(3, ge=0, le=8, description="dense layers in each output block")
    max_neighbors: int = Field(50, ge=1, le=1000, description=(
        "neighbours kept per atom, the nearest, when the graph is built here"))
    use_pbc: bool = Field(True, description="periodic boundary conditions (images of the cell)")
    otf_graph: bool = Field(False, description=(
        "build the graph here even when the batch holds stored edges; without stored edges it "
        "is always built here"))
    detach_angles: bool = Field(True, description=(
        "angles from detached positions, as the reference (forces then not exactly -dE/dpos); "
        "false for exact gradients"))


def swish(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), the reference's activation."""
    return x * torch.sigmoid(x)


def glorot_orthogonal(weight: torch.Tensor, scale: float = 2.0) -> None:
    """torch-geometric's ``glorot_orthogonal``: an orthogonal matrix rescaled to variance
    ``scale / (fan_in + fan_out)``, in place."""
    with torch.no_grad():
        nn.init.orthogonal_(weight)
        weight.mul_((scale / ((weight.shape[-2] + weight.shape[-1]) * weight.var())).sqrt())


def _reset_linear(layer: nn.Linear) -> None:
    glorot_orthogonal(layer.weight)
    if layer.bias is not None:
        nn.init.zeros_(layer.bias)


class ResidualLayer(nn.Module):
    """x + act(W2 act(W1 x + b1) + b2), width H."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-orthogonal weights, zero biases."""
        _reset_linear(self.lin1)
        _reset_linear(self.lin2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(E, H) -> (E, H)."""
        return x + swish(self.lin2(swish(self.lin1(x))))


class EmbeddingBlock(nn.Module):
    """Initial edge embedding m_ji = act(W [h_i, h_j, act(W_rbf e(d_ji))]) with h an atom-type
    embedding (95 rows, uniform in +-sqrt(3)); torch-geometric's ``EmbeddingBlock``."""

    def __init__(self, num_radial: int, hidden: int) -> None:
        super().__init__()
        self.emb = nn.Embedding(NUM_ELEMENTS, hidden)
        self.lin_rbf = nn.Linear(num_radial, hidden)
        self.lin = nn.Linear(3 * hidden, hidden)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embedding uniform in +-sqrt(3); linear layers torch's default."""
        with torch.no_grad():
            self.emb.weight.uniform_(-3 ** 0.5, 3 ** 0.5)
        self.lin_rbf.reset_parameters()
        self.lin.reset_parameters()

    def forward(self, z: torch.Tensor, rbf: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """z (N,) int64, rbf (E, R), i/j (E,) int64 centre/neighbour -> (E, H)."""
        h = self.emb(z)
        rbf = swish(self.lin_rbf(rbf))
        return swish(self.lin(torch.cat([h[i], h[j], rbf], dim=-1)))


class InteractionPPBlock(nn.Module):
    """DimeNet++ interaction (arXiv:2011.14115 fig. 2): messages m_kj down-projected to
    ``int_emb_size``, multiplied by the embedded 2-D basis of each triplet, summed into m_ji,
    up-projected, then residual layers around a skip connection."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        hidden, basis, inner = cfg.hidden_channels, cfg.basis_emb_size, cfg.int_emb_size
        self.lin_rbf1 = nn.Linear(cfg.num_radial, basis, bias=False)
        self.lin_rbf2 = nn.Linear(basis, hidden, bias=False)
        self.lin_sbf1 = nn.Linear(cfg.num_spherical * cfg.num_radial, basis, bias=False)
        self.lin_sbf2 = nn.Linear(basis, inner, bias=False)
        self.lin_kj, self.lin_ji = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.lin_down = nn.Linear(hidden, inner, bias=False)
        self.lin_up = nn.Linear(inner, hidden, bias=False)
        self.layers_before_skip = nn.ModuleList(ResidualLayer(hidden) for _ in range(cfg.num_before_skip))
        self.lin = nn.Linear(hidden, hidden)
        self.layers_after_skip = nn.ModuleList(ResidualLayer(hidden) for _ in range(cfg.num_after_skip))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-orthogonal weights, zero biases (the reference's)."""
        for layer in (self.lin_rbf1, self.lin_rbf2, self.lin_sbf1, self.lin_sbf2, self.lin_kj,
                      self.lin_ji, self.lin_down, self.lin_up, self.lin):
            _reset_linear(layer)
        for residual in [*self.layers_before_skip, *self.layers_after_skip]:
            residual.reset_parameters()

    def forward(self, x: torch.Tensor, rbf: torch.Tensor, sbf: torch.Tensor,
                idx_kj: torch.Tensor, idx_ji: torch.Tensor) -> torch.Tensor:
        """x (E, H), rbf (E, R), sbf (T, L*R), idx_kj/idx_ji (T,) -> (E, H)."""
        x_ji = swish(self.lin_ji(x))
        x_kj = swish(self.lin_kj(x)) * self.lin_rbf2(self.lin_rbf1(rbf))
        x_kj = swish(self.lin_down(x_kj))
        x_kj = x_kj[idx_kj] * self.lin_sbf2(self.lin_sbf1(sbf))
        x_kj = swish(self.lin_up(scatter_sum(x_kj, idx_ji, x.shape[0])))
        h = x_ji + x_kj
        for layer in self.layers_before_skip:
            h = layer(h)
        h = swish(self.lin(h)) + x
        for layer in self.layers_after_skip:
            h = layer(h)
        return h


class OutputPPBlock(nn.Module):
    """Per-atom output: sum over incoming edges of W_rbf e(d_ji) * m_ji, up-projected to
    ``out_emb_channels`` (with bias, as the reference), dense layers, then one linear output
    initialised to zero."""

    def __init__(self, cfg: ModelConfig, out_channels: int = 1) -> None:
        super().__init__()
        hidden, width = cfg.hidden_channels, cfg.out_emb_channels
        self.lin_rbf = nn.Linear(cfg.num_radial, hidden, bias=False)
        self.lin_up = nn.Linear(hidden, width, bias=True)
        self.lins = nn.ModuleList(nn.Linear(width, width) for _ in range(cfg.num_output_layers))
        self.lin = nn.Linear(width, out_channels, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Glorot-orthogonal weights, zero output layer. The up-projection's bias keeps torch's
        default initialisation, as in the reference (which resets only its weight)."""
        glorot_orthogonal(self.lin_rbf.weight)
        glorot_orthogonal(self.lin_up.weight)
        for layer in self.lins:
            _reset_linear(layer)
        nn.init.zeros_(self.lin.weight)

    def forward(self, x: torch.Tensor, rbf: torch.Tensor, i: torch.Tensor, num_nodes: int) -> torch.Tensor:
        """x (E, H), rbf (E, R), i (E,) centre atoms -> (N, out_channels)."""
        x = scatter_sum(self.lin_rbf(rbf) * x, i, num_nodes)
        x = self.lin_up(x)
        for layer in self.lins:
            x = swish(layer(x))
        return self.lin(x)


def build_graph(batch: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The graph the model uses for ``batch``: the stored edges (``edge_index``, ``cell_offsets``)
    when present and ``cfg.use_pbc and not cfg.otf_graph``, else `radius_graph_pbc` with
    ``cfg.cutoff`` and ``cfg.max_neighbors`` (no images when ``cfg.use_pbc`` is false).

    Args:
        batch: the model's input (see `DimeNetPlusPlus.forward`).
        cfg: the model's configuration.

    Returns:
        ``edge_index`` int64 (2, E) and ``cell_offsets`` (E, 3).

    Raises:
        KeyError: a required key is missing. ValueError: as `radius_graph_pbc`, or ``neighbors``
        not adding up to the stored edges.
    """
    stored = "edge_index" in batch and cfg.use_pbc and not cfg.otf_graph
    if stored:
        edge_index, cell_offsets = batch["edge_index"], batch["cell_offsets"]
        neighbors = batch.get("neighbors")
        if neighbors is not None and int(neighbors.sum()) != edge_index.shape[1]:
            raise ValueError(f"neighbors adds up to {int(neighbors.sum())} edges, edge_index has "
                             f"{edge_index.shape[1]}")
        return {"edge_index": edge_index.long(), "cell_offsets": cell_offsets}
    pbc = (True, True, True) if cfg.use_pbc else (False, False, False)
    edge_index, cell_offsets, _ = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"],
                                                   cfg.cutoff, cfg.max_neighbors, pbc)
    return {"edge_index": edge_index, "cell_offsets": cell_offsets}


class DimeNetPlusPlus(nn.Module):
    """DimeNet++ (the reference's ``DimeNetPlusPlusWrap`` with one target): energy per structure
    from edge messages, forces by autograd.

    Args:
        cfg: `ModelConfig`.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.rbf = BesselBasisLayer(cfg.num_radial, cfg.cutoff, cfg.envelope_exponent)
        self.sbf = SphericalBasisLayer(cfg.num_spherical, cfg.num_radial, cfg.cutoff, cfg.envelope_exponent)
        self.emb = EmbeddingBlock(cfg.num_radial, cfg.hidden_channels)
        self.output_blocks = nn.ModuleList(OutputPPBlock(cfg) for _ in range(cfg.num_blocks + 1))
        self.interaction_blocks = nn.ModuleList(InteractionPPBlock(cfg) for _ in range(cfg.num_blocks))

    def energy(self, pos: torch.Tensor, batch: dict[str, torch.Tensor],
               graph: dict[str, torch.Tensor]) -> torch.Tensor:
        """Energy (B,) of the structures, differentiable in ``pos`` (N, 3) Angstrom, on ``graph``
        (from `build_graph`); the reference's ``_forward``."""
        vectors = edge_vectors(pos, batch["cell"], batch["batch"], graph["edge_index"], graph["cell_offsets"])
        dist = vectors.norm(dim=-1)
        edge_index = graph["edge_index"]
        nonzero = dist.detach() != 0  # the reference drops zero-length edges
        if not bool(nonzero.all()):
            edge_index, vectors, dist = edge_index[:, nonzero], vectors[nonzero], dist[nonzero]
        j, i = edge_index[0], edge_index[1]
        num_nodes = pos.shape[0]
        trip = triplets(edge_index, num_nodes)
        angle_vectors = vectors.detach() if self.cfg.detach_angles else vectors
        angle = triplet_angles(angle_vectors, trip["idx_kj"], trip["idx_ji"])
        rbf = self.rbf(dist)
        sbf = self.sbf(dist, angle, trip["idx_kj"])
        x = self.emb(batch["atomic_numbers"].long(), rbf, i, j)
        per_atom = self.output_blocks[0](x, rbf, i, num_nodes)
        for interaction, output in zip(self.interaction_blocks, self.output_blocks[1:]):
            x = interaction(x, rbf, sbf, trip["idx_kj"], trip["idx_ji"])
            per_atom = per_atom + output(x, rbf, i, num_nodes)
        return scatter_sum(per_atom, batch["batch"], batch["natoms"].shape[0])[:, 0]

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """Energy and forces of a batch of B structures, N atoms in all.

        Forces are computed also under ``torch.no_grad()`` (grad is enabled inside); the graph of
        the forces is kept for a backward pass when the module is in training mode and the caller
        records gradients (``create_graph``). Outside the caller's grad mode both outputs are
        detached.

        Args:
            batch: ``atomic_numbers`` int64 (N,) in 0..94; ``pos`` float (N, 3) Angstrom;
                ``cell`` (B, 3, 3) Angstrom, rows the lattice vectors; ``natoms`` int64 (B,);
                ``batch`` int64 (N,) structure of each atom; optionally the stored graph
                ``edge_index`` int64 (2, E) (row 0 neighbour j, row 1 centre i),
                ``cell_offsets`` (E, 3) and ``neighbors`` int64 (B,) (OCP ``--get-edges``).
                Other keys are ignored.

        Returns:
            ``(energy (B,), forces (N, 3))`` in the dtype of the parameters (float32 as built),
            in the units of the training labels (the reference trains on normalised ones).

        Raises:
            KeyError: a required key is missing. ValueError: see `build_graph`.
            IndexError: an atomic number outside 0..94.
        """
        recording = torch.is_grad_enabled()
        with torch.enable_grad():
            dtype = self.rbf.freq.dtype
            pos = batch["pos"].to(dtype)
            if not pos.requires_grad:
                pos = pos.detach().requires_grad_(True)
            graph = build_graph(batch, self.cfg)
            energy = self.energy(pos, batch, graph)
            (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=self.training and recording,
                                          retain_graph=recording)
        forces = -grad
        if not recording:
            energy, forces = energy.detach(), forces.detach()
        return energy, forces


def build_model(cfg: ModelConfig) -> DimeNetPlusPlus:
    """DimeNet++ for ``cfg``, float32 on the CPU, initialised as the reference."""
    return DimeNetPlusPlus(cfg)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters (the reference's ``num_params``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def graph_work(batch: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, int]:
    """Atoms, edges and triplets of the graph the model would use for ``batch`` (stored or built,
    as `build_graph`; zero-length edges dropped as the model drops them), for FLOP counting.

    Returns:
        ``{"atoms": N, "edges": E, "triplets": T, "structures": B}``.
    """
    with torch.no_grad():
        graph = build_graph(batch, cfg)
        pos = batch["pos"].to(torch.float64)
        dist = edge_vectors(pos, batch["cell"], batch["batch"], graph["edge_index"], graph["cell_offsets"]).norm(dim=-1)
        edge_index = graph["edge_index"][:, dist != 0]
        trip = triplets(edge_index, pos.shape[0])
    return {"atoms": int(pos.shape[0]), "edges": int(edge_index.shape[1]),
            "triplets": int(trip["idx_ji"].numel()), "structures": int(batch["natoms"].numel())}


def flops_per_batch(cfg: ModelConfig, n_atoms: int, n_edges: int, n_triplets: int) -> int:
    """Forward FLOPs of DimeNet++ on a graph of ``n_atoms``, ``n_edges``, ``n_triplets`` (as
    `graph_work` counts them): 2 per multiply-add of every linear layer, plus 1 per elementwise
    product of a basis with the messages and per scatter-add; activations, the basis functions
    themselves and gathers are not counted. Multiply-adds (H hidden, O out_emb, I int_emb,
    B basis_emb, R radial, L spherical, K blocks, S residual layers per block):

    - per edge: embedding R H + 3 H^2; each of the K + 1 output blocks R H; each interaction
      block 2 H^2 (lin_ji, lin_kj) + R B + B H + H I + I H + H^2 (1 + 2 S);
    - per triplet, each interaction block: L R B + B I;
    - per atom, each output block: H O + O^2 x layers + O;
    - products: per edge 2 H per output block and H per interaction block, per triplet 2 I per
      interaction block and L R for the 2-D basis.

    A training step with forces costs roughly 3x this (the forces are a backward pass and
    training differentiates through it); the caller applies its own factor.

    Returns:
        FLOPs, int.
    """
    h, o, i_, b_ = cfg.hidden_channels, cfg.out_emb_channels, cfg.int_emb_size, cfg.basis_emb_size
    r, sph, nb = cfg.num_radial, cfg.num_spherical, cfg.num_blocks
    residual = cfg.num_before_skip + cfg.num_after_skip
    macs_edge = r * h + 3 * h * h + (nb + 1) * (r * h)
    macs_edge += nb * (2 * h * h + r * b_ + b_ * h + h * i_ + i_ * h + h * h * (1 + 2 * residual))
    macs_triplet = nb * (sph * r * b_ + b_ * i_)
    macs_atom = (nb + 1) * (h * o + o * o * cfg.num_output_layers + o)
    products = n_edges * ((nb + 1) * 2 * h + nb * h) + n_triplets * (nb * 2 * i_ + sph * r)
    return 2 * (n_edges * macs_edge + n_triplets * macs_triplet + n_atoms * macs_atom) + products
