"""The MoE gate against a float64 reference written from the formulas (capacity, which tokens are
kept, combine weights, the auxiliary loss), in one process."""

from __future__ import annotations

import math

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.parallel.moe import MoE, TopKGate, capacity, top1gating, top2gating


def _reference(logits: torch.Tensor, k: int, factor: float, min_cap: int, drop: bool):
    """Loops over tokens in order: expert e keeps the first C assignments that reach it (k=2:
    all first choices queue before second choices)."""
    p = torch.softmax(logits.double(), dim=1)
    s, e = p.shape
    first = p.argmax(dim=1)
    choices = [first.tolist()]
    if k == 2:
        choices.append(
            p.masked_fill(torch.nn.functional.one_hot(first, e).bool(), -1).argmax(1).tolist()
        )
    counts = [0] * e
    for ch in choices:
        for x in ch:
            counts[x] += 1
    cap = max(math.ceil(s / e * factor * k), min_cap) if drop else max(counts)
    combine = torch.zeros(s, e, cap, dtype=torch.float64)
    fill = [0] * e
    kept = []
    for ch in choices:
        row = []
        for x in ch:
            row.append(fill[x] if fill[x] < cap else None)
            fill[x] += 1
        kept.append(row)
    for t in range(s):
        picks = [(ch[t], kp[t]) for ch, kp in zip(choices, kept) if kp[t] is not None]
        denom = sum(p[t, x] for x, _ in picks) if k == 2 else 1.0
        for x, slot in picks:
            combine[t, x, slot] = p[t, x] / (
                max(denom, torch.finfo(torch.float32).eps) if k == 2 else 1.0
            )
    me = p.mean(0)
    ce = torch.bincount(first, minlength=e).double() / s
    l_aux = e * (me * ce).sum()
    return l_aux, combine, torch.tensor(counts)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("factor,min_cap,drop", [(0.5, 1, True), (1.0, 4, True), (1.0, 1, False)])
def test_gate_matches_float64_reference(k: int, factor: float, min_cap: int, drop: bool) -> None:
    torch.manual_seed(k)
    logits = torch.randn(20, 4) * 2
    fn = (
        (lambda lg: top1gating(lg, factor, min_cap, drop_tokens=drop, use_rts=False))
        if k == 1
        else (
            lambda lg: top2gating(
                lg, factor, min_cap, drop_tokens=drop, top2_2nd_expert_sampling=False
            )
        )
    )
    l_aux, combine, dispatch, counts = fn(logits)
    want_aux, want_combine, want_counts = _reference(logits, k, factor, min_cap, drop)
    assert combine.shape == want_combine.shape
    torch.testing.assert_close(combine.double(), want_combine, rtol=1e-6, atol=1e-7)
    assert torch.equal(dispatch, want_combine > 0)
    torch.testing.assert_close(l_aux.double(), want_aux, rtol=1e-6, atol=0)
    assert torch.equal(counts, want_counts)
    if drop and factor == 0.5:
        assert int(dispatch.sum()) < 20 * k  # this case does drop tokens


def test_capacity_formula() -> None:
    assert capacity(20, 4, 0.5, 1) == 3  # ceil(2.5)
    assert capacity(20, 4, 0.5, 4) == 4  # min_capacity wins
    assert capacity(8, 4, 1.25, 1) == 3


def test_random_token_selection_keeps_capacity_and_only_routed_tokens() -> None:
    torch.manual_seed(3)
    logits = torch.randn(32, 4)
    _, _, dispatch, counts = top1gating(logits, 0.5, 1, use_rts=True)
    per_expert = dispatch.any(dim=2).sum(dim=0)
    cap = capacity(32, 4, 0.5, 1)
    assert torch.equal(per_expert, torch.minimum(counts, torch.tensor(cap)))
    first = torch.softmax(logits, 1).argmax(1)
    assert bool(
        (
            dispatch.any(2).float().argmax(1)[dispatch.any(dim=(1, 2))]
            == first[dispatch.any(dim=(1, 2))]
        ).all()
    )


def test_noise_policies_change_routing_only_while_training() -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8)
    for policy in ("Jitter", "RSample"):
        gate = TopKGate(8, 4, k=1, min_capacity=64, noisy_gate_policy=policy, use_rts=False)
        gate.eval()
        a = gate(x)[1]
        assert torch.equal(a, gate(x)[1])  # deterministic in eval
        gate.train()
        torch.manual_seed(1)
        assert not torch.equal(gate(x)[1], a)


def test_moe_residual_and_return_values() -> None:
    torch.manual_seed(0)
    expert = torch.nn.Linear(8, 8)
    moe = MoE(8, expert, num_experts=2, k=1, use_residual=True, min_capacity=16, use_rts=False)
    x = torch.randn(2, 8, 8)
    out, l_aux, counts = moe(x)
    assert out.shape == x.shape and l_aux.dim() == 0 and counts.tolist() and int(counts.sum()) == 16
    # By hand: gate weights times the routed expert, mixed with the dense MLP by the coefficient.
    flat = x.reshape(-1, 8)
    p = torch.softmax(flat @ moe.deepspeed_moe.gate.wg.weight.T, dim=1)
    e = p.argmax(1)
    experts = list(moe.deepspeed_moe.experts.deepspeed_experts.values())
    moe_out = torch.stack([p[t, e[t]] * experts[int(e[t])](flat[t]) for t in range(16)])
    coef = torch.softmax(moe.coefficient(flat), dim=-1)
    want = moe_out * coef[:, :1] + expert(flat) * coef[:, 1:]
    torch.testing.assert_close(out.reshape(-1, 8), want, rtol=1e-5, atol=1e-6)
    assert all(
        p.allreduce is False and p.group_name == "ep_size_1"
        for p in moe.deepspeed_moe.experts.parameters()
    )


def test_bad_input_is_one_line() -> None:
    with pytest.raises(ConfigError, match=r"num_experts=6 is not divisible by ep_size=4"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=6, ep_size=4)
    with pytest.raises(ConfigError, match=r"k=5"):
        MoE(8, torch.nn.Linear(8, 8), num_experts=4, k=5)
    from ds.parallel.moe import expert_layout

    with pytest.raises(ConfigError, match=r"ep_size=4 does not divide the data-parallel size 6"):
        expert_layout(6, 4)
    assert expert_layout(4, 2) == ([(0, 1), (2, 3)], [(0, 2), (1, 3)])


def test_split_params_into_moe_groups_as_deepspeed() -> None:
    from ds.parallel.moe import is_moe_param, split_params_into_different_moe_groups_for_optimizer

    net = torch.nn.ModuleDict(
        {"dense": torch.nn.Linear(4, 4), "moe": MoE(4, torch.nn.Linear(4, 4), num_experts=2)}
    )
    groups = split_params_into_different_moe_groups_for_optimizer(
        {"params": list(net.parameters()), "name": "all", "lr": 0.1}
    )
    assert [sorted(k for k in g if k != "params") for g in groups] == [
        ["lr", "name"],
        ["lr", "moe", "name"],
    ]
    assert groups[1]["moe"] is True and groups[1]["name"] == "ep_size_1"
    assert all(not is_moe_param(p) for p in groups[0]["params"])
    experts = list(net["moe"].deepspeed_moe.experts.parameters())
    assert [id(p) for p in groups[1]["params"]] == [id(p) for p in experts]
    small = split_params_into_different_moe_groups_for_optimizer(
        [{"params": list(net.parameters()), "name": "all"}], max_group_size=4
    )
    assert [len(g["params"]) for g in small[1:]] == [1, 1, 1, 1]  # 16- and 4-element tensors
