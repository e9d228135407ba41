"""``deepspeed.moe.sharded_moe``: the gating functions in DeepSpeed's argument order, with its
sparse-route output (backed by :mod:`ds.parallel.moe`)."""

from __future__ import annotations

import torch

from ds.full.compat.deepspeed.moe.sharded_moe import (
    _route_slots,
    _sparse_encode,
    top1gating,
    top2gating,
)


def test_gating_takes_deepspeeds_argument_order_and_sparse_routes() -> None:
    torch.manual_seed(0)
    logits = torch.randn(6, 3)
    used = torch.tensor([1, 1, 1, 0, 1, 1])
    _, _, dispatch, _ = top1gating(logits, 1.0, 0, used, None, True, False)
    assert not dispatch[3].any()  # the fourth positional argument is used_token
    _, cap, experts, indices, locations, gates, _ = top2gating(
        logits, 1.0, 0, True, None, False, sparse_routes=True
    )
    assert indices.shape == (2, 6) and experts == 3
    buffer = _sparse_encode(torch.eye(6), _route_slots(indices, locations, experts, cap), 3, cap)
    assert buffer.shape == (3, cap, 6) and gates.shape == (2, 6)


def test_autoep_surface_routes_and_names_the_family_it_lacks() -> None:
    import pytest

    from ds.full.compat.deepspeed.module_inject.auto_ep import AutoEP, _resolve_route_scale
    from ds.full.compat.deepspeed.module_inject.auto_ep_config import AutoEPConfig
    from ds.full.compat.deepspeed.moe.ep_router import TokenChoiceTopKRouter

    router = TokenChoiceTopKRouter(4, 4, None, None, 2, "softmax", True, 1.0, False)
    assert router(torch.randn(3, 4))[1].shape == (3, 2)
    assert _resolve_route_scale(AutoEPConfig(routed_scaling_factor=2.0), None) == 2.0
    with pytest.raises(ValueError, match="preset_model"):
        AutoEP(torch.nn.Linear(2, 2), AutoEPConfig(enabled=True)).ep_parser()


def test_initialize_binds_and_trains_layers_made_with_deepspeeds_autoep() -> None:
    from types import SimpleNamespace

    import pytest

    import ds.full as ds
    from ds.full.compat.deepspeed.module_inject.auto_ep import AutoEP
    from ds.full.compat.deepspeed.module_inject.auto_ep_config import AutoEPConfig
    from ds.interfaces.errors import ConfigError

    block = torch.nn.Module()
    block.gate = torch.nn.Linear(8, 4, bias=False)
    block.experts = torch.nn.Module()
    block.experts.gate_up_proj = torch.nn.Parameter(torch.randn(4, 12, 8) / 3)
    block.experts.down_proj = torch.nn.Parameter(torch.randn(4, 8, 6) / 3)
    model = torch.nn.Module()
    model.config = SimpleNamespace(model_type="mixtral", num_local_experts=4, num_experts_per_tok=2)
    model.layers = torch.nn.ModuleList([torch.nn.Module()])
    model.layers[0].mlp = block
    auto = AutoEP(model, AutoEPConfig(enabled=True))
    (spec,) = auto.ep_parser()
    model.forward = lambda x: model.layers[0].mlp(x).pow(2).mean()
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": 1},
    }
    source = model.layers[0].mlp
    auto.replace_moe_layer(spec, ep_size=2, ep_rank=0)
    with pytest.raises(ConfigError, match="autoep_size"):  # 2 expert ranks in a world of 1
        ds.initialize(model=model, config=config)
    model.layers[0].mlp = source
    auto.replace_moe_layer(spec, ep_size=1, ep_rank=0)
    engine, *_ = ds.initialize(model=model, config=config)
    before = model.layers[0].mlp.experts.w1.detach().clone()
    engine.backward(engine(torch.randn(2, 3, 8)))
    engine.step()
    assert not torch.equal(before, model.layers[0].mlp.experts.w1)


def test_autoep_folding_gradient_reduction_is_refused_by_name() -> None:
    import pytest

    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.module_inject import auto_ep_folding as F

    assert F.AUTOEP_FOLDING_GRAD_REDUCE_EXPERT_TP_CANCEL == "expert_tp_cancel"
    with pytest.raises(FeatureNotAvailableError, match="mark_autoep_folding_router_parameter"):
        F.mark_autoep_folding_router_parameter(torch.nn.Parameter(torch.ones(1)))
