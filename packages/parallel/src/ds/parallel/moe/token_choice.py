"""Token-choice routing and grouped experts: the parts of a dropless MoE block.

:class:`TokenChoiceTopKRouter` scores every expert for each token (softmax or sigmoid, in fp32),
optionally limits the choice to the best ``num_limited_groups`` of ``num_expert_groups`` expert
groups (DeepSeek-V3's node-limited routing), picks the top k, optionally renormalises their
scores and multiplies them by ``route_scale``. There is no capacity: every route is kept.
:class:`GroupedExperts` holds all experts' gated-MLP weights stacked (``w1``/``w3`` ``[E, I, H]``,
``w2`` ``[E, H, I]``) and runs the rows of each expert, given grouped by expert.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def count_tokens_per_expert(selected: torch.Tensor, num_experts: int) -> torch.Tensor:
    """How many routes chose each expert: an int32 ``[num_experts]`` histogram."""
    return torch.bincount(selected.reshape(-1), minlength=num_experts).to(torch.int32)


class TokenChoiceTopKRouter(nn.Module):
    def __init__(
        self,
        dim: int,
        num_experts: int,
        num_expert_groups: int | None,
        num_limited_groups: int | None,
        top_k: int,
        score_func: str,
        route_norm: bool,
        route_scale: float,
        gate_bias: bool,
        group_score_func: str = "top2_sum",
    ) -> None:
        super().__init__()
        if score_func not in ("softmax", "sigmoid"):
            raise ValueError(f"score_func={score_func!r}: use 'softmax' or 'sigmoid'")
        if group_score_func not in ("max", "top2_sum"):
            raise ValueError(f"group_score_func={group_score_func!r}: use 'max' or 'top2_sum'")
        self.gate = nn.Linear(dim, num_experts, bias=gate_bias)
        self.num_experts = num_experts
        self.num_expert_groups = num_expert_groups
        self.num_limited_groups = num_limited_groups
        self.top_k = top_k
        self.score_func = score_func
        self.route_norm = route_norm
        self.route_scale = route_scale
        self.group_score_func = group_score_func
        # A learned per-expert bias that steers the choice only (DeepSeek-V3's correction bias).
        self.e_score_correction_bias: torch.Tensor | None = None

    def _limit_to_groups(self, scores: torch.Tensor) -> torch.Tensor:
        groups, keep = self.num_expert_groups, self.num_limited_groups
        assert groups is not None
        if keep is None or keep < 1:
            raise ValueError(f"num_limited_groups must be >= 1 with num_expert_groups, got {keep}")
        if self.num_experts % groups:
            raise ValueError(
                f"num_experts ({self.num_experts}) must be divisible by num_expert_groups ({groups})"
            )
        per_group = self.num_experts // groups
        grouped = scores.view(-1, groups, per_group)
        if self.group_score_func == "max":
            group_score = grouped.amax(dim=-1)
        else:
            if per_group < 2:
                raise ValueError(
                    f"top2_sum group scores need >= 2 experts per group, got {per_group}"
                )
            group_score = grouped.topk(2, dim=-1).values.sum(dim=-1)
        best = group_score.topk(keep, dim=-1).indices
        dropped = torch.ones_like(group_score, dtype=torch.bool).scatter_(1, best, False)
        return grouped.masked_fill(dropped.unsqueeze(-1), float("-inf")).view_as(scores)

    def forward(
        self, x: torch.Tensor, expert_bias: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(top_scores [T, k], selected_experts [T, k], tokens_per_expert [E])``."""
        out = self.gate(x)
        logits = (
            out[0] if isinstance(out, tuple) else out
        ).float()  # a model's router: logits first
        scores = torch.sigmoid(logits) if self.score_func == "sigmoid" else logits.softmax(dim=1)
        choice = scores if expert_bias is None else scores + expert_bias
        if self.e_score_correction_bias is not None:
            choice = choice + self.e_score_correction_bias.unsqueeze(0)
        if self.num_expert_groups is not None:
            choice = self._limit_to_groups(choice)
        selected = choice.topk(self.top_k, dim=-1, sorted=False).indices
        top = scores.gather(1, selected)  # the biases steer the choice, not the weights
        if self.route_norm:
            top = top / (top.sum(dim=-1, keepdim=True) + 1e-20)
        top = top * self.route_scale
        return top, selected, count_tokens_per_expert(selected, self.num_experts)


def _gated(
    name: str, alpha: float, limit: float
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if name == "swiglu":
        return lambda g, u: F.silu(g) * u
    if name == "geglu_tanh":
        return lambda g, u: F.gelu(g, approximate="tanh") * u
    if name == "swiglu_clamped":
        return lambda g, u: F.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)
    if name == "swiglu_oai":
        return lambda g, u: (
            (u.clamp(-limit, limit) + 1.0)
            * (g.clamp(max=limit) * torch.sigmoid(g.clamp(max=limit) * alpha))
        )
    raise ValueError(
        f"expert activation {name!r}: use 'swiglu', 'geglu_tanh', 'swiglu_clamped' or 'swiglu_oai'"
    )


class GroupedExperts(nn.Module):
    """``num_experts`` gated MLPs. ``use_grouped_mm``/``disable_triton_grouped_mm`` are accepted;
    the experts run one matmul each (ds has no grouped-GEMM kernel)."""

    def __init__(
        self,
        dim: int,
        hidden_dim: int,
        num_experts: int,
        use_grouped_mm: bool = True,
        disable_triton_grouped_mm: bool = False,
        activation: str = "swiglu",
        activation_alpha: float = 1.702,
        activation_limit: float = 7.0,
        gate_up_impl: str = "separate",
    ) -> None:
        super().__init__()
        if gate_up_impl not in ("separate", "fused"):
            raise ValueError(f'gate_up_impl must be "separate" or "fused", got {gate_up_impl!r}')
        self._act = _gated(activation, activation_alpha, activation_limit)
        self.activation = activation
        self.num_experts = num_experts
        self.use_grouped_mm = use_grouped_mm
        self.gate_up_impl = gate_up_impl
        self.w1 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))  # gate
        self.w2 = nn.Parameter(torch.empty(num_experts, dim, hidden_dim))  # down
        self.w3 = nn.Parameter(torch.empty(num_experts, hidden_dim, dim))  # up
        for w in (self.w1, self.w2, self.w3):
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))

    def forward(self, x: torch.Tensor, num_tokens_per_expert: torch.Tensor) -> torch.Tensor:
        """``x``: the rows for expert 0, then expert 1, ... (``num_tokens_per_expert`` each)."""
        out = []
        for e, rows in enumerate(x.split(num_tokens_per_expert.tolist())):
            h = self._act(F.linear(rows, self.w1[e]), F.linear(rows, self.w3[e]))
            out.append(F.linear(h, self.w2[e]))
        return torch.cat(out) if out else x.new_zeros((0, self.w2.shape[1]))


def resolve_route_scale(config: object, model_config: object) -> float:
    """The one scale the router applies: ``routed_scaling_factor`` when set, else the model
    config's ``routed_scaling_factor``, else ``route_scale``; each must be a finite number."""

    def finite(value: object, key: str) -> float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not math.isfinite(float(value)):  # type: ignore[arg-type]
            raise ValueError(f"{key} must be a finite number, got {value!r}")
        return float(value)  # type: ignore[arg-type]

    factor = getattr(config, "routed_scaling_factor", "auto")
    if factor != "auto":
        return finite(factor, "routed_scaling_factor")
    from_model = getattr(model_config, "routed_scaling_factor", None)
    if from_model is not None:
        return finite(from_model, "model.config.routed_scaling_factor")
    return finite(getattr(config, "route_scale", 1.0), "route_scale")


def apply_scores_before_experts(
    rows: torch.Tensor, scores: torch.Tensor, score_apply: str
) -> torch.Tensor:
    """With ``score_apply="pre"`` each routed row is weighted by its score (in fp32) before the
    experts run; with "post" the rows go through unchanged."""
    if score_apply != "pre":
        return rows
    return (rows.float() * scores.reshape(-1, 1)).to(rows.dtype)


__all__ = [
    "GroupedExperts",
    "TokenChoiceTopKRouter",
    "apply_scores_before_experts",
    "count_tokens_per_expert",
    "resolve_route_scale",
]
