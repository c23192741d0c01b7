"""The model comparison of benchmarks/side_by_side.py for OC20: mlhpc's DimeNet++
(`mlhpc_workloads.opencatalyst.dimenet`) against torch-geometric's ``DimeNetPlusPlus``, the
model the reference trains (OCP's ``DimeNetPlusPlusWrap`` subclasses it).

Same widths (the config's model section), same weights (ours copied into theirs; the check
below compares energies and forces before timing), same batches, same edges, same triplets. Both
sides run one training step per batch: energy, forces ``-dE/dpos`` by autograd with
``create_graph``, the workload's loss, backward, AdamW step.

torch-geometric's DimeNet++ builds its graph with ``radius_graph`` (torch-cluster) and its
triplets with ``SparseTensor`` (torch-sparse), compiled companions with no build for the torch
this project pins; its forward has no periodic images either. The reference side is therefore
OCP's periodic forward (``DimeNetPlusPlusWrap.forward``: distances through the stored cell
offsets, angles from detached positions, as ours) written here over torch-geometric's own
layers (``rbf``, ``sbf``, ``emb``, ``interaction_blocks``, ``output_blocks``, its ``scatter``),
with the stored edges and with triplets from mlhpc's `dimenet.triplets` (the same function and
cost as ours). Batches without stored edges get them once, before timing, from
`dimenet.radius_graph_pbc`, so neither side builds a graph while timed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from side_by_side_core import LoadWatch, Measured, Skipped, calibrate, interleave

RTOL_FORCES = 1e-4  # float32: relative to the largest force component


def _pyg() -> Any:
    try:
        from torch_geometric.nn.models import dimenet as pyg
    except ImportError as exc:
        raise Skipped(f"torch_geometric is not installed ({exc}); pip install -e '.[test]'") from None
    return pyg


def with_edges(x: dict[str, torch.Tensor], cutoff: float, max_neighbors: int) -> dict[str, torch.Tensor]:
    """``x`` with stored edges (``edge_index``, ``cell_offsets``, ``neighbors``): its own, or
    those `dimenet.radius_graph_pbc` finds."""
    from mlhpc_workloads.opencatalyst import dimenet

    if "edge_index" in x:
        return x
    edge_index, cell_offsets = dimenet.radius_graph_pbc(x["pos"], x["cell"], x["natoms"], cutoff,
                                                        max_neighbors)
    neighbors = torch.bincount(x["batch"][edge_index[1]], minlength=x["natoms"].numel())
    return {**x, "edge_index": edge_index, "cell_offsets": cell_offsets, "neighbors": neighbors}


def twin_models(model_cfg: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, theirs) with the same weights. The output blocks' last layers get random weights
    (they start at zero, which would make every energy 0 and the check empty) and our output
    up-projection biases are zeroed (torch-geometric's block has none)."""
    from mlhpc_workloads.opencatalyst import dimenet

    pyg = _pyg()
    torch.manual_seed(0)
    ours = dimenet.build_model(dimenet.ModelConfig(**{
        k: v for k, v in model_cfg.model_dump().items() if k in dimenet.ModelConfig.model_fields}))
    for block in ours.output_blocks:
        torch.nn.init.normal_(block.lin.weight, std=0.3)
        torch.nn.init.zeros_(block.lin_up.bias)
    c = ours.cfg
    theirs = pyg.DimeNetPlusPlus(
        hidden_channels=c.hidden_channels, out_channels=1, num_blocks=c.num_blocks,
        int_emb_size=c.int_emb_size, basis_emb_size=c.basis_emb_size,
        out_emb_channels=c.out_emb_channels, num_spherical=c.num_spherical,
        num_radial=c.num_radial, cutoff=c.cutoff, max_num_neighbors=c.max_neighbors,
        envelope_exponent=c.envelope_exponent, num_before_skip=c.num_before_skip,
        num_after_skip=c.num_after_skip, num_output_layers=c.num_output_layers)
    rename = {".before.": ".layers_before_skip.", ".after.": ".layers_after_skip."}
    state = {}
    for name, value in ours.state_dict().items():
        if name.endswith("lin_up.bias") and name.startswith("output_blocks"):
            continue
        for a, b in rename.items():
            name = name.replace(a, b)
        state[name] = value
    missing, unexpected = theirs.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if "sbf" not in m]:
        raise Skipped(f"torch_geometric's DimeNetPlusPlus has other layers than ours "
                      f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    return ours.train(), theirs.train()


def reference_forward(net: torch.nn.Module, x: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """OCP's periodic DimeNet++ forward over torch-geometric's layers: (energy (B,), forces (N, 3))."""
    from mlhpc_workloads.opencatalyst import dimenet
    from torch_geometric.utils import scatter

    pos = x["pos"].detach().requires_grad_(True)
    edge_index = x["edge_index"]
    j, i = edge_index
    cells = x["cell"].repeat_interleave(x["neighbors"], dim=0)
    offsets = torch.bmm(x["cell_offsets"].to(pos.dtype).unsqueeze(1), cells).squeeze(1)
    dist = (pos[j] - pos[i] + offsets).norm(dim=-1)
    idx_i, idx_j, idx_k, idx_kj, idx_ji = dimenet.triplets(edge_index, pos.size(0))
    fixed_pos = pos.detach()
    pos_ji = fixed_pos[idx_j] - fixed_pos[idx_i] + offsets[idx_ji]
    pos_kj = fixed_pos[idx_k] - fixed_pos[idx_j] + offsets[idx_kj]
    angle = torch.atan2(torch.cross(pos_ji, pos_kj, dim=1).norm(dim=-1), (pos_ji * pos_kj).sum(-1))
    rbf, sbf = net.rbf(dist), net.sbf(dist, angle, idx_kj)
    h = net.emb(x["atomic_numbers"].long(), rbf, i, j)
    per_atom = net.output_blocks[0](h, rbf, i, num_nodes=pos.size(0))
    for interaction, output in zip(net.interaction_blocks, net.output_blocks[1:]):
        h = interaction(h, rbf, sbf, idx_kj, idx_ji)
        per_atom = per_atom + output(h, rbf, i, num_nodes=pos.size(0))
    energy = scatter(per_atom, x["batch"], dim=0, dim_size=x["natoms"].numel(), reduce="sum")
    energy = energy.squeeze(-1)
    (grad,) = torch.autograd.grad(energy.sum(), pos, create_graph=net.training)
    return energy, -grad


def agreement(ours: torch.nn.Module, theirs: torch.nn.Module,
              batches: list[tuple[Any, Any, int]]) -> dict[str, float]:
    """Largest energy and force differences over the batches, relative to the largest value.

    Raises:
        Skipped: they differ by more than `RTOL_FORCES` (not the same model: nothing to compare).
    """
    worst = {"energy": 0.0, "forces": 0.0}
    for x, _, _ in batches:
        for key, a, b in zip(("energy", "forces"), ours(x), reference_forward(theirs, x)):
            a, b = a.detach(), b.detach()
            scale = max(float(b.abs().max()), 1e-12)
            worst[key] = max(worst[key], float((a - b).abs().max()) / scale)
    if worst["forces"] > RTOL_FORCES or worst["energy"] > RTOL_FORCES:
        raise Skipped(f"the two models disagree (relative energy {worst['energy']:.2e}, forces "
                      f"{worst['forces']:.2e}); not timed")
    return worst


def step_work(forward: Callable[[Any], Any], params: Any, loss_fn: Any,
              batches: list[tuple[Any, Any, int]]) -> Callable[[], int]:
    """One training step per batch: forward (energy, forces), loss, backward, AdamW step."""
    optimizer = torch.optim.AdamW(params, lr=1e-4)

    def work() -> int:
        for x, y, _ in batches:
            loss = loss_fn(forward(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return sum(n for _, _, n in batches)
    return work


def model_comparison(config: Any, loss_fn: Any, batches: list[tuple[Any, Any, int]],
                     repeats: int, min_s: float, load: LoadWatch) -> Measured:
    """mlhpc's DimeNet++ training step vs torch-geometric's, structures/s (module docstring).

    Raises:
        Skipped: torch_geometric missing, or the two models do not agree.
    """
    ours, theirs = twin_models(config.model)
    cutoff, neighbours = ours.cfg.cutoff, ours.cfg.max_neighbors
    graphs = [(with_edges(x, cutoff, neighbours), y, n) for x, y, n in batches]
    worst = agreement(ours, theirs, graphs)
    sides = (calibrate(step_work(ours, ours.parameters(), loss_fn, graphs), min_s),
             calibrate(step_work(lambda x: reference_forward(theirs, x), theirs.parameters(),
                                 loss_fn, graphs), min_s))
    result = interleave("model", "samples/s", sides, repeats, load)
    result.goal = 1.0
    result.sides = {"mlhpc": "mlhpc_workloads.opencatalyst.dimenet.DimeNetPlusPlus",
                    "reference": "torch_geometric DimeNetPlusPlus layers in OCP's periodic forward "
                                 "(triplets: mlhpc's, as torch_sparse is absent)"}
    edges = [int(x["edge_index"].shape[1]) for x, _, _ in graphs]
    result.extra.update(relative_difference=worst, edges_per_batch=edges,
                        stored_edges=all("edge_index" in x for x, _, _ in batches),
                        parameters={"mlhpc": sum(p.numel() for p in ours.parameters()),
                                    "reference": sum(p.numel() for p in theirs.parameters())})
    result.extra["models"] = (ours, theirs, graphs)  # for `profiled`; not written to the JSON
    return result


def profiled(result: Measured, loss_fn: Any, batches: list[tuple[Any, Any, int]]) -> Measured:
    """``result`` (`model_comparison`'s) with the torch.profiler breakdown of both steps and
    the radius graph's milliseconds per batch in ``extra["profile"]``."""
    ours, theirs, graphs = result.extra.pop("models")
    result.extra["profile"] = profile(ours, theirs, loss_fn, graphs)
    result.extra["profile"]["radius_graph_ms_per_batch"] = radius_graph_ms(
        batches, ours.cfg.cutoff, ours.cfg.max_neighbors)
    return result


def radius_graph_ms(batches: list[tuple[Any, Any, int]], cutoff: float, neighbours: int) -> float:
    """Median milliseconds of `dimenet.radius_graph_pbc` on one batch: what mlhpc's step adds
    when the data store no edges (as the mini data), outside this comparison."""
    import statistics
    import time

    from mlhpc_workloads.opencatalyst import dimenet

    times = []
    for x, _, _ in batches:
        start = time.perf_counter()
        dimenet.radius_graph_pbc(x["pos"], x["cell"], x["natoms"], cutoff, neighbours)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


# ------------------------------------------------------------------------------------ profile


@contextlib.contextmanager
def _labelled(module: Any, name: str, label: str) -> Iterator[None]:
    """Wrap ``module.name`` (a function or bound method) in a profiler label while inside."""
    real = getattr(module, name)

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return real(*args, **kwargs)
    setattr(module, name, wrapped)
    try:
        yield
    finally:
        if isinstance(module, torch.nn.Module):
            delattr(module, name)  # the instance attribute set above; the class's method is back
        else:
            setattr(module, name, real)


def _phases(net: Any) -> contextlib.ExitStack:
    from mlhpc_workloads.opencatalyst import dimenet

    stack = contextlib.ExitStack()
    stack.enter_context(_labelled(dimenet, "triplets", "phase: triplets"))
    for attr, label in (("rbf", "phase: radial basis"), ("sbf", "phase: spherical basis"),
                        ("emb", "phase: embedding")):
        stack.enter_context(_labelled(getattr(net, attr), "forward", label))
    for block in net.interaction_blocks:
        stack.enter_context(_labelled(block, "forward", "phase: interaction blocks"))
    for block in net.output_blocks:
        stack.enter_context(_labelled(block, "forward", "phase: output blocks"))
    stack.enter_context(_labelled(torch.autograd, "grad", "phase: forces (autograd.grad)"))
    return stack


def profile(ours: Any, theirs: Any, loss_fn: Any, graphs: list[tuple[Any, Any, int]],
            passes: int = 2) -> dict[str, Any]:
    """Milliseconds per training step by phase (forward pieces labelled; backward, loss and
    optimizer as one) and the ten largest operators by self CPU time, for each side, from
    torch.profiler over ``passes`` passes over the batches."""
    out = {}
    steps = passes * len(graphs)
    for side, net, forward in (("mlhpc", ours, ours),
                               ("reference", theirs, lambda x: reference_forward(theirs, x))):
        work = step_work(forward, net.parameters(), loss_fn, graphs)
        work()
        with _phases(net), torch.profiler.profile() as prof:
            for _ in range(passes):
                with torch.profiler.record_function("phase: step"):
                    work()
        events = prof.key_averages()
        phases = {e.key[len("phase: "):]: e.cpu_time_total / 1e3 / steps
                  for e in events if e.key.startswith("phase: ")}
        top = sorted((e for e in events if not e.key.startswith("phase: ")),
                     key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
        out[side] = {"ms_per_step": phases,
                     "top_self_cpu_ms_per_step": {e.key: e.self_cpu_time_total / 1e3 / steps
                                                  for e in top}}
    return out
