"""DeepSpeed-layout AutoEP: detection, repacking and the replaced layer against the source block
(EP=1, and EP=2 with two threads exchanging through a stand-in communicator)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from ds.parallel.moe.autoep_blocks import autoep_layers_metadata, replace_autoep_blocks
from ds.parallel.moe.autoep_config import AutoEPConfig
from ds.parallel.moe.autoep_layer import AutoEPMoELayer, detect_moe_layers, repack_experts

HIDDEN, FFN, EXPERTS, TOP_K = 8, 6, 4, 2


class FusedExperts(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(EXPERTS, 2 * FFN, HIDDEN) / 3)
        self.down_proj = nn.Parameter(torch.randn(EXPERTS, HIDDEN, FFN) / 3)


class Block(nn.Module):
    """transformers' sparse MoE block: softmax top-k, renormalised, gated-SiLU experts."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = FusedExperts()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, HIDDEN)
        top, idx = self.gate(flat).softmax(-1).topk(TOP_K, dim=-1)
        top = top / top.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for t in range(flat.shape[0]):
            for j in range(TOP_K):
                e = int(idx[t, j])
                g, u = (self.experts.gate_up_proj[e] @ flat[t]).chunk(2)
                out[t] += top[t, j] * (self.experts.down_proj[e] @ (nn.functional.silu(g) * u))
        return out.reshape(x.shape)


def model() -> nn.Module:
    torch.manual_seed(0)
    m = nn.Module()
    m.config = SimpleNamespace(
        model_type="mixtral", num_local_experts=EXPERTS, num_experts_per_tok=TOP_K
    )
    m.model = nn.Module()
    m.model.layers = nn.ModuleList([nn.Module()])
    m.model.layers[0].mlp = Block()
    return m


def test_replaced_block_matches_the_source() -> None:
    m = model()
    (spec,) = detect_moe_layers(m, AutoEPConfig(enabled=True))
    assert (spec.model_family, spec.expert_storage, spec.ffn_hidden_size) == (
        "mixtral",
        "fused_3d",
        FFN,
    )
    source = m.model.layers[0].mlp
    layer = AutoEPMoELayer(spec, source, 1, 0, AutoEPConfig(enabled=True))
    x = torch.randn(2, 5, HIDDEN)
    torch.testing.assert_close(layer(x), source(x), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="load_balance_coeff/expert_bias"):
        AutoEPMoELayer(spec, source, 1, 0, AutoEPConfig(load_balance_coeff=0.1))


class ThreadComm:
    """``all_to_all_single`` between threads, one per expert-parallel rank."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.slots: list[list[torch.Tensor]] = [[] for _ in range(world)]
        self.barrier = threading.Barrier(world)
        self.rank = threading.local()

    def all_to_all_single(self, out, inp, out_splits=None, in_splits=None, group=None) -> None:
        me = self.rank.value
        self.slots[me] = list(inp.split(in_splits or [inp.shape[0] // self.world] * self.world))
        self.barrier.wait()
        out.copy_(torch.cat([self.slots[src][me] for src in range(self.world)]))
        self.barrier.wait()


def test_two_expert_ranks_match_the_source_on_their_tokens() -> None:
    m = model()
    (spec,) = detect_moe_layers(m, AutoEPConfig(enabled=True, autoep_size=2))
    source = m.model.layers[0].mlp
    comm = ThreadComm(2)
    layers = [
        AutoEPMoELayer(spec, source, 2, r, AutoEPConfig(enabled=True, autoep_size=2))
        for r in (0, 1)
    ]
    inputs = [torch.randn(1, 7, HIDDEN), torch.randn(1, 3, HIDDEN)]
    outputs: list[torch.Tensor | None] = [None, None]

    def run(r: int) -> None:
        comm.rank.value = r
        layers[r].bind(comm, ep_group="ep")
        outputs[r] = layers[r](inputs[r])

    threads = [threading.Thread(target=run, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert layers[1].experts.w1.shape[0] == 2  # experts 2 and 3
    for r in (0, 1):
        torch.testing.assert_close(outputs[r], source(inputs[r]), rtol=1e-5, atol=1e-6)


def test_module_list_experts_are_stacked_and_checked() -> None:
    experts = nn.ModuleList(
        nn.ModuleDict(
            {
                n: nn.Linear(*d, bias=False)
                for n, d in (("gate_proj", (4, 3)), ("up_proj", (4, 3)), ("down_proj", (3, 4)))
            }
        )
        for _ in range(4)
    )
    spec = SimpleNamespace(
        num_experts=4,
        expert_storage="module_list",
        expert_w1_name="gate_proj",
        expert_w2_name="down_proj",
        expert_w3_name="up_proj",
    )
    w1, w2, w3 = repack_experts(experts, spec, ep_rank=1, ep_size=2)
    assert (
        torch.equal(w1[0], experts[2]["gate_proj"].weight)
        and w2.shape == (2, 4, 3)
        and w3.shape == (2, 3, 4)
    )
    experts[1]["gate_proj"].weight.requires_grad_(False)
    with pytest.raises(ValueError, match="mixed requires_grad"):
        repack_experts(experts, spec, ep_rank=0, ep_size=2)


def test_blocks_replaced_keep_the_forward_and_are_described() -> None:
    m = model()
    source = m.model.layers[0].mlp
    x = torch.randn(2, 5, HIDDEN)
    expected = source(x)
    (layer,) = replace_autoep_blocks(m, {"autoep_size": 1, "preset_model": "mixtral"}, None)
    assert isinstance(m.model.layers[0].mlp, AutoEPMoELayer) and m.model.layers[0].mlp is layer
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-6)
    assert autoep_layers_metadata(m) == [
        {
            "moe_layer_id": 0,
            "module_path": "model.layers.0.mlp",
            "num_experts": 4,
            "num_local_experts": 4,
            "ep_size": 1,
            "ep_rank": 0,
            "ep_group_name": "ep_size_1",
            "expert_key_prefix": "model.layers.0.mlp.experts",
        }
    ]


def test_expert_count_must_split_over_autoep_size() -> None:
    with pytest.raises(ValueError, match="not divisible by autoep_size=3"):
        replace_autoep_blocks(model(), {"autoep_size": 3}, None)
