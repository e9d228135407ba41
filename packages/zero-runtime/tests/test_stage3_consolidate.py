"""Whole weights out of a stage-3 engine have the keys and the ties of ``module.state_dict()`` of
the same model never partitioned: a tied weight is one tensor under each of its names (so
``save_pretrained`` writes it once) and non-persistent buffers are left out."""

from __future__ import annotations

import copy
from typing import Any

import torch
from _stage3 import stage3
from torch import nn


class TiedLM(nn.Module):
    """An embedding tied to the output projection, a persistent and a non-persistent buffer (a
    Llama's rotary ``inv_freq`` is the latter)."""

    def __init__(self, vocab: int = 29, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight
        self.register_buffer("scale", torch.full((d,), 0.5))
        self.register_buffer("inv_freq", torch.arange(d, dtype=torch.float32), persistent=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.head(self.norm(self.emb(idx)) * self.scale + self.inv_freq)
        return h


def _trained(gather: bool = False) -> tuple[nn.Module, nn.Module, Any]:
    torch.manual_seed(0)
    model = TiedLM()
    model.norm.bias.requires_grad_(False)
    ref = copy.deepcopy(model)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    engine = stage3(
        model,
        sgd,
        stage3_param_persistence_threshold=0,
        stage3_gather_16bit_weights_on_model_save=gather,
    )
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    idx = torch.randint(0, 29, (2, 5), generator=torch.Generator().manual_seed(1))
    engine.backward(model(idx).logsumexp(-1).mean())
    engine.step()
    ref.norm.bias.requires_grad_(False)
    ref(idx).logsumexp(-1).mean().backward()
    opt.step()
    return model, ref, engine


def test_consolidated_state_dict_keeps_ties_and_drops_non_persistent_buffers() -> None:
    model, ref, engine = _trained()
    want = ref.state_dict()
    for got in (engine.strategy.consolidated_state_dict(), model.state_dict()):
        assert set(got) == set(want)
        assert "inv_freq" not in got
        assert got["head.weight"] is got["emb.weight"]  # one tensor, gathered once
        for name, w in want.items():
            torch.testing.assert_close(got[name], w, msg=name)
    half = engine.strategy.consolidated_state_dict(torch.bfloat16)
    assert half["head.weight"] is half["emb.weight"] and half["emb.weight"].dtype == torch.bfloat16


def test_deepspeed_names_of_the_whole_weights() -> None:
    """accelerate's get_state_dict (the Trainer's save_model under a DeepSpeed config) asks
    zero_gather_16bit_weights_on_model_save() and then _zero3_consolidated_16bit_state_dict()."""
    assert _trained()[2].zero_gather_16bit_weights_on_model_save() is False
    _, ref, engine = _trained(gather=True)
    assert engine.zero_gather_16bit_weights_on_model_save() is True
    whole = engine._zero3_consolidated_16bit_state_dict()
    assert set(whole) == set(ref.state_dict()) and whole["head.weight"] is whole["emb.weight"]
    trainable = engine._zero3_consolidated_16bit_state_dict(exclude_frozen_parameters=True)
    assert set(whole) - set(trainable) == {"norm.bias"}
