"""DimeNet++ of the OC20 workload (mlhpc_workloads.opencatalyst.model, graph, basis) against
independent computations: torch-geometric's DimeNetPlusPlus, finite differences, a brute-force
enumeration of periodic images, scipy's Bessel and Legendre functions and hand-derived counts."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from ase.build import add_adsorbate, fcc111
from mlhpc_workloads.opencatalyst import basis
from mlhpc_workloads.opencatalyst.graph import radius_graph_pbc, triplets
from mlhpc_workloads.opencatalyst.model import (
    ModelConfig,
    build_model,
    count_parameters,
    flops_per_batch,
    graph_work,
)
from scipy import integrate, special

SMALL = {"hidden_channels": 16, "out_emb_channels": 16, "num_blocks": 2, "int_emb_size": 8,
         "basis_emb_size": 4, "num_spherical": 4, "num_radial": 4, "cutoff": 4.0, "max_neighbors": 200}


def _batch(structures: list[tuple[np.ndarray, np.ndarray, np.ndarray]], dtype=torch.float32) -> dict:
    """Model input from (atomic numbers, positions (n, 3), cell (3, 3)) per structure."""
    natoms = torch.tensor([len(z) for z, _, _ in structures])
    return {"atomic_numbers": torch.tensor(np.concatenate([z for z, _, _ in structures]), dtype=torch.int64),
            "pos": torch.tensor(np.concatenate([p for _, p, _ in structures]), dtype=dtype),
            "cell": torch.tensor(np.stack([c for _, _, c in structures]), dtype=dtype),
            "natoms": natoms, "batch": torch.repeat_interleave(torch.arange(len(structures)), natoms)}


def _slab(seed: int, metal: str = "Cu", size=(2, 2, 3)) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A rattled fcc(111) slab with an O adsorbate, as ASE builds it (periodic in x and y, vacuum in z)."""
    slab = fcc111(metal, size=size, vacuum=6.0)
    add_adsorbate(slab, "O", 1.6, "fcc")
    slab.rattle(0.05, seed=seed)
    return slab.numbers, slab.positions, np.asarray(slab.cell)


def _small_periodic(seed: int, n: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """n atoms in a small triclinic cell (edges 2.5-2.9 A): with a 4 A cutoff most neighbours are
    images, some two cells away."""
    rng = np.random.default_rng(seed)
    cell = np.array([[2.6, 0.0, 0.0], [0.4, 2.5, 0.0], [0.3, -0.2, 2.9]])
    return rng.integers(1, 30, n), rng.random((n, 3)) @ cell, cell


def _randomise(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Non-zero weights everywhere (the reference initialises the output layers to zero)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name != "rbf.freq":
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
    return model


def test_reference_parameter_count():
    """1,810,182 parameters at the reference size (mlperf_hpc.yml: hidden 192, out_emb 192, 3
    blocks, int_emb 64, basis_emb 8, 7 spherical, 6 radial, 1 + 2 residual layers, 3 output
    layers). Established two ways: by hand, 6 (Bessel frequencies) + 130,368 (embedding: 95 x
    192 + 6 x 192 + 192 + 576 x 192 + 192) + 4 x 149,568 (output blocks: 6 x 192 + 192 x 192 +
    192 + 3 x (192^2 + 192) + 192) + 3 x 360,512 (interaction blocks: 48 + 1,536 + 336 + 512 +
    2 x 37,056 + 2 x 12,288 + 6 x 37,056 + 37,056); and as torch-geometric 2.8.1's
    DimeNetPlusPlus with the same arguments (1,809,414) plus the 4 x 192 output up-projection
    biases the reference's OutputPPBlock has and torch-geometric 2.x dropped
    (tests below check the second way when torch-geometric is installed)."""
    model = build_model(ModelConfig())
    assert count_parameters(model) == 1_810_182
    assert 6 + 130_368 + 4 * 149_568 + 3 * 360_512 == 1_810_182
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())


def _pyg_model(cfg: ModelConfig):
    dimenet = pytest.importorskip("torch_geometric.nn.models.dimenet",
                                  reason="torch_geometric not installed (test extra)")
    return dimenet, dimenet.DimeNetPlusPlus(
        hidden_channels=cfg.hidden_channels, out_channels=1, num_blocks=cfg.num_blocks,
        int_emb_size=cfg.int_emb_size, basis_emb_size=cfg.basis_emb_size,
        out_emb_channels=cfg.out_emb_channels, num_spherical=cfg.num_spherical,
        num_radial=cfg.num_radial, cutoff=cfg.cutoff, envelope_exponent=cfg.envelope_exponent,
        num_before_skip=cfg.num_before_skip, num_after_skip=cfg.num_after_skip,
        num_output_layers=cfg.num_output_layers)


def test_matches_torch_geometric(monkeypatch):
    """Same weights, same graph: torch-geometric's DimeNetPlusPlus (its own bases from sympy, its
    blocks, its angles and energy sum) and ours agree on energy and exact forces of a molecule
    (no periodic image within the cutoff). torch-geometric's radius_graph and triplets need
    torch-cluster / torch-sparse, so they are replaced by a brute-force graph and our triplets
    (checked against brute force in test_triplets_match_brute_force)."""
    cfg = ModelConfig(detach_angles=False)
    dimenet, pyg = _pyg_model(cfg)
    _randomise(pyg, seed=1)
    ours = build_model(cfg)
    missing, unexpected = ours.load_state_dict(pyg.state_dict(), strict=False)
    assert not unexpected and set(missing) == {f"output_blocks.{b}.lin_up.bias" for b in range(4)}
    for block in ours.output_blocks:
        torch.nn.init.zeros_(block.lin_up.bias)
    assert count_parameters(pyg) + (cfg.num_blocks + 1) * cfg.out_emb_channels == count_parameters(ours)

    rng = np.random.default_rng(3)
    pos = rng.normal(scale=1.6, size=(12, 3))
    z = rng.integers(1, 10, 12)

    def brute_radius_graph(p, r, batch=None, max_num_neighbors=32):
        d = torch.cdist(p, p)
        i, j = torch.nonzero((d <= r) & (d > 0), as_tuple=True)
        return torch.stack([j, i])  # row 0 source j, row 1 target i

    def our_triplets(edge_index, num_nodes):
        t = triplets(edge_index, num_nodes)
        return (edge_index[1], edge_index[0], t["idx_i"], t["idx_j"], t["idx_k"], t["idx_kj"], t["idx_ji"])

    monkeypatch.setattr(dimenet, "radius_graph", brute_radius_graph)
    monkeypatch.setattr(dimenet, "triplets", our_triplets)
    # float32 energies to 1e-5; float64 energies and forces to 1e-6 (torch-geometric rounds its
    # Bessel normalisers through float32, which bounds the agreement in float64)
    for dtype, rtol in ((torch.float32, 1e-5), (torch.float64, 1e-6)):
        batch = _batch([(z, pos + 20.0, np.eye(3) * 40.0)], dtype=dtype)
        pyg.to(dtype)
        ours.to(dtype)
        pos_pyg = batch["pos"].clone().requires_grad_(True)
        energy_pyg = pyg(batch["atomic_numbers"], pos_pyg, batch["batch"])[:, 0]
        forces_pyg = -torch.autograd.grad(energy_pyg.sum(), pos_pyg)[0]
        energy, forces = ours(batch)
        assert abs(float(energy.detach())) > 1.0
        torch.testing.assert_close(energy, energy_pyg.detach(), rtol=rtol, atol=0.0)
        if dtype == torch.float64:
            scale = float(forces_pyg.abs().max())
            torch.testing.assert_close(forces, forces_pyg, rtol=0.0, atol=1e-6 * scale)


def test_triplets_match_brute_force():
    """Every (k -> j, j -> i) edge pair with k != i by atom index, counted by enumeration."""
    z, pos, cell = _small_periodic(seed=5, n=4)
    batch = _batch([(z, pos, cell)])
    edge_index, _, _ = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 4.0, 100)
    got = triplets(edge_index, 4)
    src, dst = edge_index.tolist()
    expected = sorted((kj, ji) for ji in range(len(src)) for kj in range(len(src))
                      if dst[kj] == src[ji] and src[kj] != dst[ji])
    assert sorted(zip(got["idx_kj"].tolist(), got["idx_ji"].tolist())) == expected
    assert torch.equal(got["idx_j"], edge_index[1][got["idx_kj"]])
    assert torch.equal(got["idx_k"], edge_index[0][got["idx_kj"]])


def test_forces_are_minus_the_energy_gradient():
    """Float64 copy, periodic cell, detach_angles=False: forces equal central finite differences
    of the energy (graph held fixed, as stored edges). With the reference's detached angles
    (default) they do not: its forces miss the angles' share, a quirk kept on purpose."""
    torch.manual_seed(0)
    z, pos, cell = _small_periodic(seed=2, n=4)
    batch = _batch([(z, pos, cell)], dtype=torch.float64)
    edge_index, offsets, neighbors = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 4.0, 200)
    batch.update(edge_index=edge_index, cell_offsets=offsets, neighbors=neighbors)
    exact = _randomise(build_model(ModelConfig(**SMALL, detach_angles=False))).double().eval()
    _, forces = exact(batch)
    step = 1e-5
    numeric = torch.zeros_like(forces)
    for atom, axis in itertools.product(range(4), range(3)):
        shifted = []
        for sign in (1, -1):
            moved = dict(batch, pos=batch["pos"].clone())
            moved["pos"][atom, axis] += sign * step
            shifted.append(float(exact(moved)[0].sum()))
        numeric[atom, axis] = -(shifted[0] - shifted[1]) / (2 * step)
    torch.testing.assert_close(forces, numeric, rtol=1e-6, atol=1e-8)
    reference = build_model(ModelConfig(**SMALL))
    reference.load_state_dict(exact.state_dict())
    _, forces_detached = reference.double().eval()(batch)
    assert float((forces_detached - numeric).abs().max()) > 1e-3 * float(numeric.abs().max())


def _brute_force_edges(pos: np.ndarray, cell: np.ndarray, cutoff: float) -> list[tuple]:
    found = []
    for i, j in itertools.product(range(len(pos)), repeat=2):
        for image in itertools.product(range(-4, 5), repeat=3):
            d = np.linalg.norm(pos[j] + np.array(image) @ cell - pos[i])
            if 1e-2 < d <= cutoff:
                found.append((j, i, image, round(float(d), 4)))
    return sorted(found)


def test_periodic_graph_matches_brute_force_images():
    """In a 2.5-2.9 A cell with a 4 A cutoff most neighbours exist only as periodic images
    (including the atom's own images): edges, offsets and distances equal an enumeration of
    9 x 9 x 9 images; with max_neighbors the kept ones are each atom's nearest."""
    z, pos, cell = _small_periodic(seed=0)
    batch = _batch([(z, pos, cell)], dtype=torch.float64)
    edge_index, offsets, neighbors = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 4.0, 1000)
    vec = batch["pos"][edge_index[0]] + offsets.double() @ batch["cell"][0] - batch["pos"][edge_index[1]]
    got = sorted((j, i, tuple(o), round(float(d), 4)) for j, i, o, d in
                 zip(edge_index[0].tolist(), edge_index[1].tolist(), offsets.tolist(), vec.norm(dim=1)))
    expected = _brute_force_edges(pos, cell, 4.0)
    assert got == expected and int(neighbors[0]) == len(expected)
    assert sum(1 for e in expected if e[2] == (0, 0, 0)) < len(expected) / 4
    edge_index, offsets, _ = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 4.0, 6)
    for centre in range(len(z)):
        kept = sorted(d for j, i, o, d in got if i == centre)[:6]
        mine = vec_norms = (batch["pos"][edge_index[0]] + offsets.double() @ batch["cell"][0]
                            - batch["pos"][edge_index[1]]).norm(dim=1)[edge_index[1] == centre]
        assert sorted(round(float(d), 4) for d in mine) == kept and len(vec_norms) == 6


def test_energy_invariances_and_pbc_matters():
    """Energy unchanged by translating all atoms by a lattice vector, by wrapping one atom into
    the cell, and by rotating positions with the cell; changed when periodic images are ignored."""
    model = _randomise(build_model(ModelConfig(**SMALL))).eval()
    z, pos, cell = _small_periodic(seed=4)
    energy = model(_batch([(z, pos, cell)]))[0]
    assert abs(float(energy)) > 1e-2
    translated = model(_batch([(z, pos + cell[1] - 2 * cell[2], cell)]))[0]
    wrapped_pos = pos.copy()
    wrapped_pos[2] += cell[0] - cell[1]
    wrapped = model(_batch([(z, wrapped_pos, cell)]))[0]
    rotation = _rotation(0.7, 1.1, -0.4)
    rotated = model(_batch([(z, pos @ rotation.T, cell @ rotation.T)]))[0]
    for other in (translated, wrapped, rotated):
        torch.testing.assert_close(other, energy, rtol=1e-5, atol=1e-5)
    no_pbc = build_model(ModelConfig(**SMALL, use_pbc=False))
    no_pbc.load_state_dict(model.state_dict())
    assert abs(float(no_pbc.eval()(_batch([(z, pos, cell)]))[0] - energy)) > 1e-2 * abs(float(energy))


def _rotation(a: float, b: float, c: float) -> np.ndarray:
    rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return rz @ ry @ rx


def test_bessel_rbf_hand_computed():
    """e_n(d) = u(d/c) sin(n pi d/c), u(x) = 1/x - 28 x^5 + 48 x^6 - 21 x^7 for exponent 5."""
    layer = basis.BesselBasisLayer(num_radial=6, cutoff=6.0, envelope_exponent=5)
    d = np.array([0.7, 1.9, 3.3, 5.99, 6.0, 6.5])
    x = d / 6.0
    u = np.where(x < 1, 1 / x - 28 * x ** 5 + 48 * x ** 6 - 21 * x ** 7, 0.0)
    expected = u[:, None] * np.sin(np.arange(1, 7)[None, :] * np.pi * x[:, None])
    got = layer(torch.tensor(d, dtype=torch.float32)).detach().double().numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_spherical_basis_hand_computed():
    """a_ln = u(d/c) N_ln j_l(z_ln d/c) sqrt((2l+1)/(4 pi)) P_l(cos angle), from scipy's
    spherical_jn and eval_legendre; the zeros are zeros of j_l (z_11 = 4.4934094579, the root
    of tan x = x) and N_ln makes each function unit-norm on [0, 1] with weight x^2."""
    zeros = basis.bessel_zeros(7, 6)
    np.testing.assert_allclose(zeros[0], np.arange(1, 7) * np.pi, rtol=1e-7)
    assert abs(zeros[1, 0] - 4.4934094579) < 1e-6
    np.testing.assert_allclose(special.spherical_jn(np.arange(7)[:, None], zeros), 0, atol=1e-6)
    norms = basis.bessel_normalisers(zeros)
    for order, n in [(0, 0), (3, 2), (6, 5)]:
        def weighted_square(x, order=order, n=n):
            return (norms[order, n] * special.spherical_jn(order, zeros[order, n] * x) * x) ** 2
        assert abs(integrate.quad(weighted_square, 0, 1)[0] - 1) < 1e-5
    layer = basis.SphericalBasisLayer(7, 6, cutoff=6.0, envelope_exponent=5)
    d, angle = np.array([1.1, 2.5, 4.0, 5.7]), np.array([0.3, 1.2, 2.0, 3.1])
    x = d / 6.0
    u = 1 / x - 28 * x ** 5 + 48 * x ** 6 - 21 * x ** 7
    expected = np.zeros((4, 7, 6))
    for order, n in itertools.product(range(7), range(6)):
        harmonic = math.sqrt((2 * order + 1) / (4 * math.pi)) * special.eval_legendre(order, np.cos(angle))
        expected[:, order, n] = u * norms[order, n] * special.spherical_jn(order, zeros[order, n] * x) * harmonic
    got = layer(torch.tensor(d, dtype=torch.float32), torch.tensor(angle, dtype=torch.float32), torch.arange(4))
    np.testing.assert_allclose(got.double().numpy(), expected.reshape(4, 42), rtol=1e-4, atol=1e-5)


def test_spherical_jn_accurate_near_zero_and_beyond():
    """float32 j_l within 2e-6 absolute of scipy's for x in [0, 40], l < 10, including the small
    arguments where the closed forms cancel; float64 within 1e-13; gradients finite at x = 0."""
    x = torch.cat([torch.logspace(-6, 0, 200, dtype=torch.float64), torch.linspace(0, 40, 4001, dtype=torch.float64)])
    for order in range(10):
        expected = special.spherical_jn(order, x.numpy())
        np.testing.assert_allclose(basis.spherical_jn(order, x.float()).double().numpy(), expected, atol=2e-6)
        np.testing.assert_allclose(basis.spherical_jn(order, x).numpy(), expected, atol=1e-13)
        small = torch.tensor([0.0, 1e-3], requires_grad=True)
        (grad,) = torch.autograd.grad(basis.spherical_jn(order, small).sum(), small)
        assert torch.isfinite(grad).all()


def test_stored_edges_give_the_computed_graph_results():
    """Stored edges (shuffled, offsets as float, as an LMDB may hold them) and the graph built in
    the model give the same energy and forces; two structures batched give each one's result."""
    model = _randomise(build_model(ModelConfig(**{**SMALL, "cutoff": 5.0, "max_neighbors": 30}))).eval()
    structures = [_slab(seed=1), _small_periodic(seed=3)]
    batch = _batch(structures)
    with torch.no_grad():
        energy, forces = model(batch)
    assert energy.shape == (2,) and forces.shape == (batch["pos"].shape[0], 3)
    assert energy.grad_fn is None and float(forces.abs().max()) > 0
    edge_index, offsets, neighbors = radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 5.0, 30)
    perm = torch.cat([torch.randperm(int(n), generator=torch.Generator().manual_seed(0)) + int(s)
                      for n, s in zip(neighbors, torch.cumsum(neighbors, 0) - neighbors)])
    stored = dict(batch, edge_index=edge_index[:, perm], cell_offsets=offsets[perm].float(), neighbors=neighbors)
    energy_stored, forces_stored = model(stored)
    torch.testing.assert_close(energy_stored, energy, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(forces_stored, forces, rtol=1e-4, atol=1e-5)
    first = model(_batch(structures[:1]))
    torch.testing.assert_close(first[0], energy[:1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first[1], forces[:len(structures[0][0])], rtol=1e-4, atol=1e-5)


def test_reference_model_training_step_changes_weights():
    """One AdamW step of the reference-size model on three OC20-like slabs (13-17 atoms, cutoff
    6 A, 50 neighbours), loss 50 x forces MAE on free atoms, backpropagated through the forces."""
    torch.manual_seed(0)
    model = build_model(ModelConfig()).train()
    structures = [_slab(seed=s, metal=m, size=size) for s, m, size in
                  [(0, "Cu", (2, 2, 3)), (1, "Pt", (2, 2, 4)), (2, "Ag", (2, 2, 3))]]
    batch = _batch(structures)
    work = graph_work(batch, model.cfg)
    assert work["edges"] <= 50 * work["atoms"] and work["triplets"] > work["edges"]
    assert flops_per_batch(model.cfg, work["atoms"], work["edges"], work["triplets"]) > 0
    target = torch.randn(batch["pos"].shape, generator=torch.Generator().manual_seed(1)) * 0.1
    free = torch.ones(batch["pos"].shape[0], dtype=torch.bool)
    free[[0, 1, 2, 3]] = False
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    for step in range(2):  # the first step moves the zero-initialised output layers only
        optimizer.zero_grad()
        _, forces = model(batch)
        loss = 50 * (forces[free] - target[free]).abs().mean()
        loss.backward()
        assert torch.isfinite(loss)
        grads = {k: float(p.grad.abs().sum()) for k, p in model.named_parameters()}
        assert grads["output_blocks.3.lin.weight"] > 0
        optimizer.step()
    assert all(g > 0 for g in grads.values()), [k for k, g in grads.items() if g == 0]
    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert len(changed) == len(before)


def test_flops_count_the_linear_layers():
    """flops_per_batch = 2 x the multiply-adds every nn.Linear performs in a forward pass (counted
    by hooks on a real batch) + the elementwise products its docstring lists."""
    cfg = ModelConfig(**{**SMALL, "out_emb_channels": 12, "num_output_layers": 2})
    model = build_model(cfg).eval()
    batch = _batch([_small_periodic(seed=1), _small_periodic(seed=2, n=3)])
    macs = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: macs.append(inp[0].shape[0] * mod.in_features * mod.out_features))
             for m in model.modules() if isinstance(m, torch.nn.Linear)]
    model(batch)
    for hook in hooks:
        hook.remove()
    work = graph_work(batch, cfg)
    h, i_, k = cfg.hidden_channels, cfg.int_emb_size, cfg.num_blocks
    products = work["edges"] * ((k + 1) * 2 * h + k * h) + work["triplets"] * (k * 2 * i_ + cfg.num_spherical * cfg.num_radial)
    assert flops_per_batch(cfg, work["atoms"], work["edges"], work["triplets"]) == 2 * sum(macs) + products
