"""``deepspeed.runtime.rollout``: the request/batch contract, and HybridEngineRollout generating
with the trained module (EOS applied after fixed-length decoding, nucleus sampling)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ds.full.compat.deepspeed.runtime.rollout import (
    HybridEngineRollout,
    RolloutConfig,
    RolloutRequest,
    SamplingConfig,
    build_rollout,
)


class _Counter(torch.nn.Module):
    """``generate`` appends 7, 2 (EOS), 9, ... : what follows EOS must become padding."""

    def generate(self, ids: torch.Tensor, **kw: Any) -> torch.Tensor:
        assert kw["eos_token_id"] == 2 and kw["do_sample"] is False
        tail = torch.tensor([7, 2, 9, 9][: kw["max_new_tokens"]]).expand(ids.shape[0], -1)
        return torch.cat([ids, tail], dim=1)


def test_generate_pads_after_first_eos_and_masks() -> None:
    engine = SimpleNamespace(module=_Counter())
    rollout = build_rollout(
        RolloutConfig(), engine, SimpleNamespace(pad_token_id=0, eos_token_id=2)
    )
    req = RolloutRequest(torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]]))
    out = rollout.generate(
        req, SamplingConfig(max_new_tokens=4, temperature=0.0, n_samples_per_prompt=2)
    )
    assert out.input_ids.tolist() == [[0, 5, 6, 7, 2, 0, 0]] * 2
    assert out.attention_mask.tolist() == [[0, 1, 1, 1, 1, 0, 0]] * 2
    assert out.response_start_idx.tolist() == [3, 3]
    assert rollout.sync_weights(3) is None


def test_nucleus_sampling_keeps_the_top_mass() -> None:
    torch.manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(400, -1)
    picks = HybridEngineRollout._sample_top_p(logits, temperature=1.0, top_p=0.7)
    assert set(picks.view(-1).tolist()) == {0, 1}  # 0.5 < 0.7 <= 0.5 + 0.3
    greedy = HybridEngineRollout._sample_top_p(torch.tensor([[1.0, 3.0, 2.0]]), 1e-9, 1.0)
    assert greedy.tolist() == [[1]]


def test_contract_errors() -> None:
    with pytest.raises(ValueError, match="2-D"):
        RolloutRequest(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="needs both"):
        build_rollout(RolloutConfig())
    with pytest.raises(ValueError, match="Unknown rollout engine"):
        build_rollout(RolloutConfig(engine="elsewhere"))
