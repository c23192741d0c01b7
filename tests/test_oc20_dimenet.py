"""DimeNet++ for OC20 (workloads/opencatalyst/dimenet.py) against independent computations: the
parameter count of the reference configuration, torch-geometric's own DimeNetPlusPlus (pure
Python, given graphs and triplets enumerated here by brute force), finite differences, scipy's
spherical Bessel functions, a brute-force periodic neighbour search and the symmetries a
periodic energy must have. Each test fails if a basis, a block or the periodic images are wrong.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math

import numpy as np
import pytest
import torch
from scipy import special

from mlhpc_workloads.opencatalyst import dimenet

SMALL = dict(hidden_channels=16, out_emb_channels=12, num_blocks=2, int_emb_size=8, basis_emb_size=4,
             num_spherical=4, num_radial=3, cutoff=3.0, max_neighbors=50)


def structure(seed: int = 0, n: int = 6, box: float = 4.0) -> dict[str, torch.Tensor]:
    """One random periodic structure of ``n`` atoms in a skewed cell, as a collated batch."""
    g = torch.Generator().manual_seed(seed)
    cell = torch.tensor([[box, 0.0, 0.0], [0.7, box, 0.0], [0.3, -0.4, box + 1.0]], dtype=torch.float64)
    frac = torch.rand(n, 3, generator=g, dtype=torch.float64)
    return {"atomic_numbers": torch.randint(1, 30, (n,), generator=g), "pos": frac @ cell,
            "cell": cell[None], "natoms": torch.tensor([n]), "batch": torch.zeros(n, dtype=torch.long)}


def model(seed: int = 0, **overrides) -> dimenet.DimeNetPlusPlus:
    torch.manual_seed(seed)
    m = dimenet.build_model(dimenet.ModelConfig(**{**SMALL, **overrides})).double()
    for block in m.output_blocks:  # the last layer starts at zero: give it values to test
        torch.nn.init.normal_(block.lin.weight, std=0.3)
    return m.eval()


def brute_force_edges(batch, cutoff):
    """(j, i, offset) for every image j within cutoff of i, by looping over a wide image range."""
    pos, cell = batch["pos"].numpy(), batch["cell"][0].numpy()
    out = []
    for i, j in itertools.product(range(len(pos)), repeat=2):
        for off in itertools.product(range(-3, 4), repeat=3):
            d = np.linalg.norm(pos[j] + np.array(off) @ cell - pos[i])
            if 1e-8 <= d <= cutoff:
                out.append((j, i, off))
    return out


def test_reference_parameter_count():
    """1,810,182 parameters. Established two ways: counted layer by layer from OCP's
    dimenet_plus_plus.py (embedding 130,368; 3 interaction blocks of 360,512; 4 output blocks
    of 149,568; 6 Bessel frequencies), and as torch-geometric 2.x's DimeNetPlusPlus with the same
    settings plus the 4 x 192 biases of the up-projection OCP's OutputPPBlock has and
    torch-geometric's has not."""
    reference = dimenet.build_model(dimenet.ModelConfig())
    assert sum(p.numel() for p in reference.parameters()) == 1_810_182


@pytest.mark.slow
def test_reference_parameter_count_agrees_with_torch_geometric():
    """The second way of `test_reference_parameter_count` (slow: torch-geometric derives the
    reference's 7 x 6 bases with sympy in its constructor, about a minute on two cores)."""
    pyg = pytest.importorskip("torch_geometric.nn.models.dimenet")
    theirs = pyg.DimeNetPlusPlus(hidden_channels=192, out_channels=1, num_blocks=3, int_emb_size=64,
                                 basis_emb_size=8, out_emb_channels=192, num_spherical=7, num_radial=6,
                                 cutoff=6.0, envelope_exponent=5, num_before_skip=1, num_after_skip=2,
                                 num_output_layers=3)
    assert sum(p.numel() for p in theirs.parameters()) + 4 * 192 == 1_810_182


def _copy_into_pyg(ours, theirs):
    rename = {".before.": ".layers_before_skip.", ".after.": ".layers_after_skip."}
    state = {}
    for name, value in ours.state_dict().items():
        for a, b in rename.items():
            name = name.replace(a, b)
        state[name] = value
    for k in range(len(ours.output_blocks)):
        assert torch.count_nonzero(state.pop(f"output_blocks.{k}.lin_up.bias")) == 0
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if "sbf" not in m], (missing, unexpected)


@functools.lru_cache(maxsize=1)
def _their_model():
    """torch-geometric's DimeNetPlusPlus of the SMALL sizes, built once: its constructor derives
    the bases with sympy (about 10 s); each comparison copies it and loads our weights."""
    pyg = pytest.importorskip("torch_geometric.nn.models.dimenet")
    kw = {k: v for k, v in SMALL.items() if k != "max_neighbors"}
    return pyg.DimeNetPlusPlus(out_channels=1, envelope_exponent=5, num_before_skip=1, num_after_skip=2,
                               num_output_layers=3, **kw).double()


def _energy_and_torch_geometrics(monkeypatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(our energy, torch-geometric's DimeNetPlusPlus energy) with the same weights on the same
    graph; torch-geometric's radius graph and triplets need compiled companions, so they are
    replaced by brute-force enumerations written here."""
    pyg = pytest.importorskip("torch_geometric.nn.models.dimenet")
    batch = structure(1, n=7, box=6.0)
    ours = model(2, use_pbc=False)
    for block in ours.output_blocks:
        torch.nn.init.zeros_(block.lin_up.bias)  # torch-geometric 2.x has no such bias
    theirs = copy.deepcopy(_their_model())
    _copy_into_pyg(ours, theirs)
    pos = batch["pos"]
    pairs = [(j, i) for i in range(len(pos)) for j in range(len(pos))
             if i != j and (pos[i] - pos[j]).norm() <= SMALL["cutoff"]]
    edge_index = torch.tensor(pairs, dtype=torch.long).T

    def their_triplets(edge_index, num_nodes):
        row, col = edge_index
        found = [(int(col[e]), int(row[e]), int(row[f]), f, e) for e in range(row.numel())
                 for f in range(row.numel()) if col[f] == row[e] and row[f] != col[e]]
        idx = torch.tensor(found, dtype=torch.long).T
        return col, row, idx[0], idx[1], idx[2], idx[3], idx[4]

    monkeypatch.setattr(pyg, "radius_graph", lambda *a, **k: edge_index)
    monkeypatch.setattr(pyg, "triplets", their_triplets)
    expected = theirs(batch["atomic_numbers"], pos, batch["batch"]).reshape(-1)
    stored = {**batch, "edge_index": edge_index, "cell_offsets": torch.zeros(edge_index.size(1), 3)}
    energy, _ = ours(stored)
    return energy.detach(), expected.detach()


def test_energy_matches_torch_geometric(monkeypatch):
    """Same weights, same graph: our energy equals torch-geometric's DimeNetPlusPlus."""
    energy, expected = _energy_and_torch_geometrics(monkeypatch)
    # torch-geometric evaluates its bases as sympy-simplified expressions: in float64 they
    # differ from ours by about 1e-7 relative (measured); a wrong basis or block is O(1) off
    # (test_a_wrong_basis_block_or_triplet_fails_the_comparison)
    assert torch.allclose(energy, expected, rtol=1e-6, atol=1e-8), (energy, expected)
    pyg = pytest.importorskip("torch_geometric.nn.models.dimenet")
    theirs = pyg.SphericalBasisLayer(SMALL["num_spherical"], SMALL["num_radial"], SMALL["cutoff"], 5)
    ours = model(2, use_pbc=False)
    d, a, kj = (torch.tensor([1.5], dtype=torch.float64), torch.tensor([1.0], dtype=torch.float64),
                torch.tensor([0]))
    assert (ours.sbf.forward(d, a, kj) - theirs(d, a, kj)).abs().max() < 1e-5


def _legendre_of_minus_cos(order, x):
    return _REAL["legendre"](order, -x)


def _envelope_without_pole(self, x):
    return _REAL["Envelope.forward"](self, x) - 1.0 / x * (x < 1.0).to(x.dtype)


def _interaction_without_skip(self, x, rbf, sbf, idx_kj, idx_ji):
    return _REAL["InteractionPPBlock.forward"](self, x, rbf, sbf, idx_kj, idx_ji) - x


def _residual_one_layer(self, x):
    return x + torch.nn.functional.silu(self.lin1(x))


def _triplets_keeping_k_equal_i(edge_index, num_nodes):
    row, col = edge_index
    found = [(int(col[e]), int(row[e]), int(row[f]), f, e) for e in range(row.numel())
             for f in range(row.numel()) if col[f] == row[e]]
    return tuple(torch.tensor(c, dtype=torch.long) for c in zip(*found))


_REAL = {"legendre": dimenet.legendre, "Envelope.forward": dimenet.Envelope.forward,
         "InteractionPPBlock.forward": dimenet.InteractionPPBlock.forward}
MUTATIONS = {  # what is made wrong -> (where, attribute, the wrong version)
    "spherical basis: Legendre polynomials of -cos(angle)": (dimenet, "legendre", _legendre_of_minus_cos),
    "radial basis: envelope without its 1/x term": (dimenet.Envelope, "forward", _envelope_without_pole),
    "interaction block: no skip connection": (dimenet.InteractionPPBlock, "forward", _interaction_without_skip),
    "residual layer: one linear layer of two": (dimenet.ResidualLayer, "forward", _residual_one_layer),
    "triplets: k == i kept": (dimenet, "triplets", _triplets_keeping_k_equal_i),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_wrong_basis_block_or_triplet_fails_the_comparison(monkeypatch, mutation):
    """The comparison with torch-geometric catches each of these mistakes (energy off by far
    more than the 1e-6 relative the true model agrees to)."""
    where, name, wrong = MUTATIONS[mutation]
    monkeypatch.setattr(where, name, wrong)
    energy, expected = _energy_and_torch_geometrics(monkeypatch)
    assert not torch.allclose(energy, expected, rtol=1e-3, atol=1e-6), mutation


def _drop_images(real):
    def radius_graph_pbc(*args):
        edge_index, offsets = real(*args)
        home = (offsets == 0).all(dim=1)
        return edge_index[:, home], offsets[home]
    return radius_graph_pbc


def _offsets_reversed(real):
    def graph(self, batch):
        edge_index, offsets = real(self, batch)
        return edge_index, -offsets
    return graph


def test_wrong_periodic_images_fail_the_checks(monkeypatch):
    """A radius graph that misses the periodic images disagrees with the brute-force search; a
    model that drops the images' cell offsets from its distances loses the periodic energy's
    invariance to moving an atom into another image (here: the offsets added with the wrong
    sign, so each edge measures the distance to another image than the one it names)."""
    batch = structure(5, n=4, box=2.6)
    real_graph = dimenet.radius_graph_pbc
    assert _edges_agree_with_brute_force(batch)
    monkeypatch.setattr(dimenet, "radius_graph_pbc", _drop_images(real_graph))
    assert not _edges_agree_with_brute_force(batch)
    monkeypatch.setattr(dimenet, "radius_graph_pbc", real_graph)
    assert _image_gap(batch) < 1e-9
    monkeypatch.setattr(dimenet.DimeNetPlusPlus, "graph", _offsets_reversed(dimenet.DimeNetPlusPlus.graph))
    assert _image_gap(batch) > 1e-4


def _edges_agree_with_brute_force(batch) -> bool:
    edge_index, offsets = dimenet.radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 3.0, 500)
    ours = sorted((int(j), int(i), tuple(int(o) for o in off)) for (j, i), off in zip(edge_index.T, offsets))
    return ours == sorted(brute_force_edges(batch, 3.0))


def _image_gap(batch) -> float:
    """|E(one atom moved into another image) - E|: zero for a periodic energy."""
    m = model(6, max_neighbors=500)
    cell = batch["cell"][0]
    moved = batch["pos"].clone()
    moved[0] += cell[1] - cell[2]
    gap = float((m({**batch, "pos": moved})[0] - m(batch)[0]).detach().abs().max())
    assert math.isfinite(gap)
    return gap


def test_forces_are_the_negative_gradient_of_the_energy():
    """With angles differentiated too (``detach_angles: false``), forces are -dE/dpos to finite
    differences; the reference's detached angles give forces that differ from them."""
    batch = structure(3)
    exact = model(4, detach_angles=False)
    _, forces = exact(batch)
    h, fd = 1e-5, torch.zeros_like(batch["pos"])
    for a, c in itertools.product(range(batch["pos"].size(0)), range(3)):
        plus, minus = batch["pos"].clone(), batch["pos"].clone()
        plus[a, c] += h
        minus[a, c] -= h
        fd[a, c] = -(exact({**batch, "pos": plus})[0] - exact({**batch, "pos": minus})[0]).sum() / (2 * h)
    assert torch.allclose(forces, fd, atol=1e-6, rtol=1e-5)
    reference = model(4)  # same weights, the reference's detached angles
    assert not torch.allclose(reference(batch)[1], fd, atol=1e-4)


def test_bessel_and_spherical_bases_against_scipy():
    cutoff, d = 5.0, torch.tensor([0.8, 1.7, 3.3, 4.9], dtype=torch.float64)
    rbf = dimenet.BesselBasis(4, cutoff, 5).double()(d)
    x = (d / cutoff).numpy()
    p = 6
    env = 1 / x - (p + 1) * (p + 2) / 2 * x ** (p - 1) + p * (p + 2) * x**p - p * (p + 1) / 2 * x ** (p + 1)
    freq = (np.arange(1, 5) * np.pi).astype(np.float32).astype(np.float64)  # initialised in float32
    expected = env[:, None] * np.sin(np.outer(x, freq))
    assert np.allclose(rbf.detach().numpy(), expected, rtol=1e-10)
    zeros = dimenet.bessel_zeros(3, 3)
    assert np.allclose(special.spherical_jn(np.arange(3)[:, None], zeros), 0, atol=1e-9)
    assert np.allclose(zeros[0], np.pi * np.arange(1, 4))
    sbf_layer = dimenet.SphericalBasis(3, 3, cutoff, 5).double()
    angle = torch.tensor([0.3, 2.0], dtype=torch.float64)
    out = sbf_layer(d, angle, torch.tensor([1, 2])).reshape(2, 3, 3).numpy()
    for t, e in enumerate([1, 2]):
        for ell, n in itertools.product(range(3), range(3)):
            norm = 1 / math.sqrt(0.5 * special.spherical_jn(ell + 1, zeros[ell, n]) ** 2)
            radial = norm * special.spherical_jn(ell, zeros[ell, n] * x[e]) * env[e]
            y = special.sph_harm_y(ell, 0, float(angle[t]), 0.0).real
            assert out[t, ell, n] == pytest.approx(radial * y, rel=1e-8, abs=1e-12)


def test_periodic_graph_matches_brute_force_and_energy_has_the_symmetries():
    batch = structure(5, n=4, box=2.6)  # a small cell: most neighbours are periodic images
    edge_index, offsets = dimenet.radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 3.0, 500)
    ours = sorted((int(j), int(i), tuple(int(o) for o in off)) for (j, i), off in zip(edge_index.T, offsets))
    assert ours == sorted(brute_force_edges(batch, 3.0))
    assert any(any(o) for _, _, o in ours)
    m = model(6, max_neighbors=500)
    energy = m(batch)[0]
    cell = batch["cell"][0]
    moved = batch["pos"].clone()
    moved[0] += cell[1] - cell[2]  # one atom into another image: the same crystal
    assert torch.allclose(m({**batch, "pos": moved})[0], energy, atol=1e-9)
    shifted = batch["pos"] + torch.tensor([0.3, -1.1, 0.5], dtype=torch.float64)
    assert torch.allclose(m({**batch, "pos": shifted})[0], energy, atol=1e-9)
    q, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    rotated = {**batch, "pos": batch["pos"] @ q.T, "cell": batch["cell"] @ q.T}
    assert torch.allclose(m(rotated)[0], energy, atol=1e-9)
    no_pbc = model(6, max_neighbors=500, use_pbc=False)
    assert not torch.allclose(no_pbc(batch)[0], energy, atol=1e-6)


def test_max_neighbors_keeps_the_nearest():
    batch = structure(7, n=5, box=3.0)
    edge_index, offsets = dimenet.radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"], 4.0, 6)
    counts = torch.bincount(edge_index[1], minlength=5)
    assert counts.max() == 6
    everything = brute_force_edges(batch, 4.0)
    for centre in range(5):
        dists = sorted(np.linalg.norm(batch["pos"][j].numpy() + np.array(o) @ batch["cell"][0].numpy()
                                      - batch["pos"][i].numpy()) for j, i, o in everything if i == centre)
        kept = (batch["pos"][edge_index[0]] + offsets.double() @ batch["cell"][0]
                - batch["pos"][edge_index[1]]).norm(dim=-1)[edge_index[1] == centre]
        assert np.allclose(sorted(kept.tolist()), dists[:6])


def test_stored_edges_give_what_computed_edges_give():
    batch = structure(8)
    m = model(9)
    computed = m(batch)
    edge_index, offsets = dimenet.radius_graph_pbc(batch["pos"], batch["cell"], batch["natoms"],
                                                   SMALL["cutoff"], 50)
    stored = m({**batch, "edge_index": edge_index, "cell_offsets": offsets})
    assert torch.allclose(stored[0], computed[0]) and torch.allclose(stored[1], computed[1])


def test_triplets_against_enumeration():
    edge_index = torch.tensor([[1, 2, 0, 2, 0, 1, 3], [0, 0, 1, 1, 2, 2, 0]])
    got = set(zip(*[t.tolist() for t in dimenet.triplets(edge_index, 4)]))
    row, col = edge_index
    want = {(int(col[e]), int(row[e]), int(row[f]), f, e) for e in range(7) for f in range(7)
            if col[f] == row[e] and row[f] != col[e]}
    assert got == want


def test_a_training_step_of_the_reference_model_on_cpu():
    """The reference configuration (1.8 M parameters, cutoff 6, 50 neighbours) on a batch of two
    structures: forces with create_graph, the loss on free atoms, one AdamW step changes the weights."""
    m = dimenet.build_model(dimenet.ModelConfig()).train()
    a, b = structure(10, n=12, box=6.0), structure(11, n=9, box=6.0)
    batch = {"atomic_numbers": torch.cat([a["atomic_numbers"], b["atomic_numbers"]]),
             "pos": torch.cat([a["pos"], b["pos"]]).float(), "cell": torch.cat([a["cell"], b["cell"]]).float(),
             "natoms": torch.tensor([12, 9]), "batch": torch.repeat_interleave(torch.arange(2), torch.tensor([12, 9]))}
    for block in m.output_blocks:
        torch.nn.init.normal_(block.lin.weight, std=0.1)
    target = torch.randn(21, 3)
    free = torch.arange(21) % 3 != 0
    optimizer = torch.optim.AdamW(m.parameters(), lr=1e-3)
    before = [p.detach().clone() for p in m.parameters()]
    energy, forces = m(batch)
    assert energy.shape == (2,) and forces.shape == (21, 3) and forces.requires_grad
    loss = 50 * torch.nn.functional.l1_loss(forces[free], target[free])
    loss.backward()
    optimizer.step()
    changed = sum(not torch.equal(p0, p) for p0, p in zip(before, m.parameters()))
    assert changed > 0.9 * len(before)
