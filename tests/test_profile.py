import json

from mlhpc import config as cfg
from mlhpc.profile import profile
from test_run_e2e import TINY, tiny_data  # noqa: F401 (fixture)


def test_profile_reports_phases_operators_memory_and_trace(tmp_path, repo, tiny_data):
    overrides = tuple(v for v in TINY if v != "--set") + (f"data.path={tiny_data}", "optimizer.name=sgd")
    config = cfg.load(repo / "configs" / "cosmoflow-mini.yaml", overrides)
    result = profile(config, steps=2, warmup=1, trace_path=tmp_path / "trace.json")
    assert set(result.phase_ms) == {"data", "forward", "backward", "optimizer"}
    assert result.phase_ms["backward"] > 0 and result.phase_ms["forward"] > 0
    names = [row["name"] for row in result.operators]
    assert any("conv" in name for name in names)
    mem = result.memory
    assert mem["parameters_bytes"] == mem["gradients_bytes"]  # fp32 weights and grads
    assert mem["optimizer_state_bytes"] == mem["parameters_bytes"]  # SGD momentum: one buffer
    assert mem["saved_activations_bytes"] > 0
    assert result.flops["train_flops"] > 2 * result.flops["forward_flops"]
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["traceEvents"]
