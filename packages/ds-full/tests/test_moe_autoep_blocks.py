"""``ds.initialize`` with DeepSpeed's AutoEP section on MoE blocks that are not transformers' fused
experts modules (no ``act_fn``): the family's blocks become AutoEPMoELayers with the same forward,
checkpoints record ``ds_autoep_layers`` and load back exactly."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import ds.full as ds
from ds.interfaces.errors import ConfigError
from ds.parallel.moe.autoep_layer import AutoEPMoELayer

H, F, E = 8, 6, 4


class _Block(nn.Module):
    """Mixtral's routing (softmax, top-2, renormalised) over all experts at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(H, E, bias=False)
        self.experts = nn.Module()
        self.experts.gate_up_proj = nn.Parameter(torch.randn(E, 2 * F, H) / 3)
        self.experts.down_proj = nn.Parameter(torch.randn(E, H, F) / 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = self.gate(x).softmax(-1)
        top, idx = probs.topk(2, dim=-1)
        weights = torch.zeros_like(probs).scatter(-1, idx, top / top.sum(-1, keepdim=True))
        g, u = torch.einsum("efh,bth->btef", self.experts.gate_up_proj, x).chunk(2, dim=-1)
        out = torch.einsum("ehf,btef->bteh", self.experts.down_proj, nn.functional.silu(g) * u)
        return (weights.unsqueeze(-1) * out).sum(-2)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.config = SimpleNamespace(model_type="mixtral", num_local_experts=E)
        self.model = nn.Module()
        self.model.layers = nn.ModuleList(nn.Module() for _ in range(2))
        for layer in self.model.layers:
            layer.mlp = _Block()
        self.head = nn.Linear(H, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.model.layers:
            x = x + layer.mlp(x)
        return self.head(x).square().mean()


def _config(**expert: object) -> dict:
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "expert_parallel": {"enabled": True, "autoep_size": 1, **expert},
    }


def test_preset_blocks_become_autoep_layers_and_checkpoint_their_layout(tmp_path) -> None:
    x = torch.randn(1, 5, H)
    want = _Net()(x)
    engine, *_ = ds.initialize(model=_Net(), config=_config(preset_model="mixtral"))
    layers = [m for m in engine.module.modules() if isinstance(m, AutoEPMoELayer)]
    assert len(layers) == 2
    torch.testing.assert_close(engine(x), want, rtol=1e-5, atol=1e-6)
    engine.backward(engine(x))
    engine.step()
    saved = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    engine.save_checkpoint(str(tmp_path), tag="t")
    objects = engine.checkpoint_engine.load(str(tmp_path), "t", [], rank_objects=False).objects
    entries = objects["ds_autoep_layers"]
    assert [(e["moe_layer_id"], e["module_path"]) for e in entries] == [
        (0, "model.layers.0.mlp"),
        (1, "model.layers.1.mlp"),
    ]
    assert all(
        (e["num_experts"], e["num_local_experts"], e["ep_size"]) == (E, E, 1) for e in entries
    )
    # The family also comes from the model's config.model_type when no preset is named.
    other, *_ = ds.initialize(model=_Net(), config=_config())
    other.load_checkpoint(str(tmp_path), tag="t")
    for name, p in other.module.named_parameters():
        assert torch.equal(p, saved[name]), name


def test_a_model_with_no_family_still_names_the_fix() -> None:
    net = _Net()
    del net.config
    with pytest.raises(ConfigError, match="model has no MoE layers"):
        ds.initialize(model=net, config=_config())
