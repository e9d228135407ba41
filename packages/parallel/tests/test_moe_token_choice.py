"""Token-choice routing (group-limited, scaled) and grouped experts."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ds.parallel.moe import autoep_config
from ds.parallel.moe.token_choice import (
    GroupedExperts,
    TokenChoiceTopKRouter,
    apply_scores_before_experts,
    resolve_route_scale,
)


def test_router_keeps_top_k_within_the_best_groups_and_scales_weights() -> None:
    torch.manual_seed(0)
    router = TokenChoiceTopKRouter(16, 8, 4, 1, 2, "softmax", False, 2.0, False)
    x = torch.randn(20, 16)
    scores, experts, counts = router(x)
    # one group of two experts allowed per token: both choices fall in the same group
    assert torch.equal(experts[:, 0] // 2, experts[:, 1] // 2)
    probs = router.gate(x).softmax(dim=1)
    torch.testing.assert_close(scores, probs.gather(1, experts) * 2.0)
    assert counts.dtype == torch.int32 and int(counts.sum()) == 40
    normed = TokenChoiceTopKRouter(16, 8, None, None, 3, "sigmoid", True, 1.0, True)
    assert torch.allclose(normed(x)[0].sum(dim=1), torch.ones(20))


def test_grouped_experts_run_each_experts_rows() -> None:
    torch.manual_seed(0)
    experts = GroupedExperts(dim=6, hidden_dim=4, num_experts=3, use_grouped_mm=False)
    x = torch.randn(5, 6)
    out = experts(x, torch.tensor([2, 0, 3]))
    row = x[4]
    want = F.linear(
        F.silu(F.linear(row, experts.w1[2])) * F.linear(row, experts.w3[2]), experts.w2[2]
    )
    torch.testing.assert_close(out[4], want)
    with pytest.raises(ValueError, match="expert activation"):
        GroupedExperts(6, 4, 3, activation="relu")


def test_route_scale_and_score_application() -> None:
    class HF:
        routed_scaling_factor = 2.5

    assert resolve_route_scale(autoep_config.AutoEPConfig(route_scale=3.0), None) == 3.0
    assert resolve_route_scale(autoep_config.AutoEPConfig(), HF()) == 2.5
    assert resolve_route_scale(autoep_config.AutoEPConfig(routed_scaling_factor=4), HF()) == 4.0
    for bad in ("2.5", True, math.inf):
        with pytest.raises(ValueError, match="routed_scaling_factor"):
            resolve_route_scale(autoep_config.AutoEPConfig(routed_scaling_factor=bad), None)
    rows = torch.ones(2, 3)
    assert torch.equal(
        apply_scores_before_experts(rows, torch.tensor([2.0, 3.0]), "pre")[:, 0],
        torch.tensor([2.0, 3.0]),
    )
    assert apply_scores_before_experts(rows, torch.tensor([2.0, 3.0]), "post") is rows
    assert autoep_config.preset_name_for_hf_model_type("qwen2_moe") == "qwen3_moe"
    assert autoep_config.unsupported_preset_for_hf_model_type("qwen3_5_moe")[0] == "qwen3_5_moe"
