import torch

from mlhpc_workloads.cosmoflow import mae_stats
from mlhpc_workloads.cosmoflow.model import ModelConfig, build_model
from mlhpc_workloads.cosmoflow.optim import OptimizerConfig, learning_rate


def test_reference_parameter_count():
    model = build_model(ModelConfig())
    assert sum(p.numel() for p in model.parameters()) == 8_907_556


def test_mini_forward_shape_and_range():
    model = build_model(ModelConfig(input_size=16, conv_channels=2, n_conv_layers=4))
    out = model(torch.randn(3, 4, 16, 16, 16) * 10)
    assert out.shape == (3, 4)
    assert out.abs().max() <= 1.2


def test_init_is_xavier_with_zero_bias():
    model = build_model(ModelConfig(input_size=16, conv_channels=2, n_conv_layers=4))
    conv = model.features[0]
    assert torch.count_nonzero(conv.bias) == 0
    fan_in, fan_out = 4 * 27, 2 * 27
    bound = (6 / (fan_in + fan_out)) ** 0.5
    assert conv.weight.abs().max() <= bound
    assert conv.weight.abs().max() > 0.8 * bound


def test_reference_schedule():
    cfg = OptimizerConfig()  # base 0.001 at batch 64, linear, 4 warm-up epochs, decays 32/64
    peak = 0.001 * 256 / 64
    assert learning_rate(cfg, 256, 0) == 0.001
    assert abs(learning_rate(cfg, 256, 2) - (0.001 + 2 * (peak - 0.001) / 4)) < 1e-12
    assert learning_rate(cfg, 256, 4) == peak
    assert learning_rate(cfg, 256, 32) == peak  # decay applies after the boundary epoch
    assert learning_rate(cfg, 256, 33) == peak * 0.25
    assert learning_rate(cfg, 256, 65) == peak * 0.125


def test_mae_stats_sum_and_count():
    s, n = mae_stats(torch.zeros(2, 4), torch.ones(2, 4) * 0.5)
    assert s.item() == 4.0 and n.item() == 8.0


def test_adam_is_an_open_division_option():
    import torch

    from mlhpc import config as cfg
    from mlhpc_workloads.cosmoflow.optim import build_optimizer, hyperparameters

    config = cfg.from_dict({"workload": "cosmoflow", "train": {"global_batch_size": 8, "max_epochs": 1},
                            "optimizer": {"name": "adam", "base_learning_rate": 0.001}})
    model = torch.nn.Linear(2, 2)
    optimizer, _ = build_optimizer(model, config, 4)
    assert isinstance(optimizer, torch.optim.Adam)
    assert optimizer.param_groups[0]["betas"] == (0.9, 0.999)
    assert hyperparameters(config)["opt_name"] == "adam"


def test_weight_decay_covers_hidden_dense_kernels_only():
    """As the reference's Keras ``kernel_regularizer=l2(l2)`` on fc1 and fc2 (mlcommons/hpc
    cosmoflow/models/cosmoflow.py): conv kernels, biases and the output layer are not decayed,
    and the decay is the gradient of ``l2 * sum(w ** 2)``, i.e. ``2 * l2 * w``."""
    from mlhpc import config as cfg
    from mlhpc_workloads.cosmoflow.optim import build_optimizer

    for name in ("sgd", "adam"):
        config = cfg.from_dict({"workload": "cosmoflow",
                                "train": {"global_batch_size": 8, "max_epochs": 1},
                                "model": {"input_size": 16, "conv_channels": 2, "n_conv_layers": 2},
                                "optimizer": {"name": name, "weight_decay": 0.01}})
        model = build_model(config.model)
        optimizer, _ = build_optimizer(model, config, 4)
        decayed = {id(p) for g in optimizer.param_groups if g["weight_decay"] > 0 for p in g["params"]}
        linears = [m for m in model.head if isinstance(m, torch.nn.Linear)]
        assert decayed == {id(linears[0].weight), id(linears[1].weight)}
        assert {g["weight_decay"] for g in optimizer.param_groups} == {0.02, 0.0}
        assert sum(len(g["params"]) for g in optimizer.param_groups) == len(list(model.parameters()))

    # One plain SGD step with zero gradients moves only the decayed kernels, by lr * 2 * l2 * w.
    config = cfg.from_dict({"workload": "cosmoflow", "train": {"global_batch_size": 8, "max_epochs": 1},
                            "model": {"input_size": 16, "conv_channels": 2, "n_conv_layers": 2},
                            "optimizer": {"name": "sgd", "momentum": 0.0, "weight_decay": 0.5,
                                          "base_learning_rate": 0.1, "base_batch_size": 8,
                                          "warmup_epochs": 0}})
    model = build_model(config.model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer, _ = build_optimizer(model, config, 4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()
    fc1, fc2 = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)][:2]
    for name, p in model.named_parameters():
        if name in (f"{fc1}.weight", f"{fc2}.weight"):
            assert torch.allclose(p, before[name] * (1 - 0.1 * 2 * 0.5))
        else:
            assert torch.equal(p, before[name]), name
