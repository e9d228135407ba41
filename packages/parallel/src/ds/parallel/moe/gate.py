"""The top-k gate of DeepSpeed's mixture-of-experts layer (GShard / Switch routing).

For ``S`` tokens and ``E`` experts the gate returns ``(l_aux, combine_weights, dispatch_mask,
exp_counts)``: ``combine_weights`` is ``[S, E, C]`` (token ``s`` goes to slot ``c`` of expert
``e`` with that weight), ``dispatch_mask`` its non-zero pattern, ``exp_counts`` the tokens each
expert was chosen for before any drop (on the host, as DeepSpeed returns it).

* Capacity: ``C = max(ceil(S / E * capacity_factor), min_capacity)`` slots per expert (``2 *
  capacity_factor`` for k=2); tokens past it are dropped (their combine weights are zero, the
  layer outputs zeros for them). ``drop_tokens=False`` makes ``C`` the largest expert count
  instead (over the expert-parallel group, which must agree on the dispatch shape): no drop.
* Which tokens are kept: in token order (the first ``C`` routed to an expert), or with
  ``use_rts`` (random token selection, DeepSpeed's default for k=1) the ``C`` with the largest
  uniform draw.
* The auxiliary load-balancing loss (Switch/GShard): ``l_aux = E * sum_e me_e * ce_e`` with
  ``me_e`` the mean gate probability of expert ``e`` and ``ce_e`` the fraction of tokens whose
  first choice is ``e`` (before drops); 1 for perfectly balanced routing.
* Noise: ``noisy_gate_policy="Jitter"`` multiplies the gate input by uniform(1-1e-2, 1+1e-2)
  while training; ``"RSample"`` (k=1) picks the expert from the logits plus Gumbel noise. k=2
  samples its second expert with Gumbel noise when ``top2_2nd_expert_sampling``.
* k > 2 (:func:`topkgating`): the k most probable experts, ``k * capacity_factor`` slots per
  expert, routes past capacity dropped by gate value or by position.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ds.interfaces.errors import ConfigError

GateOutput = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def capacity(num_tokens: int, num_experts: int, capacity_factor: float, min_capacity: int) -> int:
    """Slots per expert: ``max(ceil(num_tokens / num_experts * capacity_factor), min_capacity)``."""
    return max(math.ceil(num_tokens / num_experts * capacity_factor), int(min_capacity))


def gumbel_rsample(shape: torch.Size, device: torch.device) -> torch.Tensor:
    u = torch.rand(shape, device=device)
    return -torch.log(-torch.log(u.clamp_min(1e-20)).clamp_min(1e-20))


def multiplicative_jitter(x: torch.Tensor, epsilon: float = 1e-2) -> torch.Tensor:
    noise = torch.empty_like(x).uniform_(1.0 - epsilon, 1.0 + epsilon)
    return x * noise


def _agreed_capacity(counts: torch.Tensor, agree: Callable[[torch.Tensor], None] | None) -> int:
    # drop_tokens=False: room for the busiest expert, the maximum over the expert-parallel group
    # (every rank of it exchanges [E, C, M] tensors of one shape).
    top = counts.max().reshape(1).to(torch.int64)
    if agree is not None:
        agree(top)
    return max(int(top.item()), 1)


def _keep(mask: torch.Tensor, cap: int, use_rts: bool) -> torch.Tensor:
    """The routed tokens each expert keeps: the first ``cap`` in token order, or the ``cap``
    with the largest uniform draw (random token selection)."""
    if not use_rts:
        return mask * (torch.cumsum(mask, dim=0) <= cap).to(mask.dtype)
    scores = mask * torch.rand(mask.shape, device=mask.device)
    k = min(cap, mask.shape[0])
    top = torch.topk(scores, k=k, dim=0)[1]
    return mask * torch.zeros_like(mask).scatter_(0, top, 1)


def top1gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    noisy_gate_policy: str | None = None,
    drop_tokens: bool = True,
    use_rts: bool = True,
    agree: Callable[[torch.Tensor], None] | None = None,
    used_token: torch.Tensor | None = None,
) -> GateOutput:
    """Switch routing: each token goes to its most probable expert."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    chooser = (
        logits + gumbel_rsample(logits.shape, logits.device)
        if noisy_gate_policy == "RSample"
        else gates
    )
    mask1 = F.one_hot(torch.argmax(chooser, dim=1), num_classes=num_experts)
    if used_token is not None:
        mask1 = mask1 * used_token.reshape(-1, 1).to(mask1.dtype)
    exp_counts = mask1.sum(dim=0).detach().to("cpu")
    if drop_tokens:
        cap = capacity(num_tokens, num_experts, capacity_factor, min_capacity)
    else:
        cap = _agreed_capacity(exp_counts, agree)
    me = gates.mean(dim=0)
    ce = mask1.float().mean(dim=0)
    l_aux = torch.sum(me * ce) * num_experts
    if drop_tokens:
        mask1 = _keep(mask1, cap, use_rts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    locations1_s = torch.sum(locations1 * mask1, dim=1)
    gates = gates * mask1.float()
    locations1_sc = F.one_hot(locations1_s, num_classes=cap).float()
    combine_weights = torch.einsum("se,sc->sec", gates, locations1_sc)
    return l_aux, combine_weights, combine_weights.bool(), exp_counts


def top2gating(
    logits: torch.Tensor,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    top2_2nd_expert_sampling: bool = True,
    agree: Callable[[torch.Tensor], None] | None = None,
) -> GateOutput:
    """GShard routing: the two most probable experts, weights renormalised over the two kept."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    mask1 = F.one_hot(torch.argmax(gates, dim=1), num_classes=num_experts)
    chooser = (
        logits + gumbel_rsample(logits.shape, logits.device) if top2_2nd_expert_sampling else logits
    )
    except1 = chooser.masked_fill(mask1.bool(), float("-inf"))
    mask2 = F.one_hot(torch.argmax(except1, dim=1), num_classes=num_experts)
    locations1 = torch.cumsum(mask1, dim=0) - 1
    # Second choices queue behind every first choice of the same expert.
    locations2 = torch.cumsum(mask2, dim=0) - 1 + mask1.sum(dim=0, keepdim=True)
    me = gates.mean(dim=0)
    ce = mask1.float().mean(dim=0)
    l_aux = torch.mean(me * ce) * num_experts * num_experts
    exp_counts = (mask1 + mask2).sum(dim=0).detach().to("cpu")
    if drop_tokens:
        cap = capacity(num_tokens, num_experts, capacity_factor * 2, min_capacity)
        mask1 = mask1 * (locations1 < cap).to(mask1.dtype)
        mask2 = mask2 * (locations2 < cap).to(mask2.dtype)
    else:
        cap = _agreed_capacity(exp_counts, agree)
    locations1_s = torch.sum(locations1 * mask1, dim=1)
    locations2_s = torch.sum(locations2 * mask2, dim=1)
    m1, m2 = mask1.float(), mask2.float()
    gates1_s = (gates * m1).sum(dim=1)
    gates2_s = (gates * m2).sum(dim=1)
    denom = torch.clamp(gates1_s + gates2_s, min=torch.finfo(gates.dtype).eps)
    gates1 = (gates1_s / denom).unsqueeze(1) * m1
    gates2 = (gates2_s / denom).unsqueeze(1) * m2
    loc1 = F.one_hot(locations1_s, num_classes=cap).float()
    loc2 = F.one_hot(locations2_s, num_classes=cap).float()
    combine_weights = torch.einsum("se,sc->sec", gates1, loc1) + torch.einsum(
        "se,sc->sec", gates2, loc2
    )
    return l_aux, combine_weights, combine_weights.bool(), exp_counts


def topkgating(
    logits: torch.Tensor,
    k: int,
    capacity_factor: float,
    min_capacity: int,
    drop_tokens: bool = True,
    drop_policy: str = "probs",
    agree: Callable[[torch.Tensor], None] | None = None,
) -> GateOutput:
    """Top-k routing for any k: each token goes to its ``k`` most probable experts, weights
    renormalised over the routes it keeps. With ``drop_tokens`` each expert has
    ``capacity(S, E, k * capacity_factor, min_capacity)`` slots and keeps, by ``drop_policy``,
    the routes with the largest gate values (``"probs"``) or the first in token order
    (``"position"``)."""
    gates = F.softmax(logits, dim=1)
    num_tokens, num_experts = gates.shape
    top_gate, top_idx = torch.topk(gates, k=k, dim=1)
    mask = torch.zeros_like(gates, dtype=torch.bool).scatter_(1, top_idx, True)
    exp_counts = mask.sum(dim=0).detach().to("cpu")
    me = gates.mean(dim=0)
    ce = mask.float().mean(dim=0)
    l_aux = torch.mean(me * ce) * num_experts * num_experts / k
    if not drop_tokens:
        cap = _agreed_capacity(exp_counts, agree)
    else:
        cap = capacity(num_tokens, num_experts, capacity_factor * k, min_capacity)
        if drop_policy == "probs":
            routed = torch.zeros_like(gates).scatter(1, top_idx, top_gate)
            # The slots still number ``cap``; at most every token can fill them.
            best = torch.topk(routed, k=min(cap, num_tokens), dim=0, sorted=False)[1]
            mask &= torch.zeros_like(mask).scatter_(0, best, True)
        elif drop_policy == "position":
            mask &= (torch.cumsum(mask, dim=0) - 1) < cap
        else:
            raise ConfigError(f"drop_policy={drop_policy!r}: use 'probs' or 'position'")
    locations = torch.cumsum(mask, dim=0) - 1
    kept = gates * mask
    kept = kept / kept.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(kept.dtype).eps)
    slots = F.one_hot(locations * mask, num_classes=cap).float()
    combine_weights = torch.einsum("se,sec->sec", kept, slots)
    return l_aux, combine_weights, combine_weights.bool(), exp_counts


class TopKGate(torch.nn.Module):
    """The gate: a bias-free fp32 linear ``wg`` from the model dimension to the experts, then
    top-1 or top-2 routing (see the module docstring)."""

    def __init__(
        self,
        model_dim: int,
        num_experts: int,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 8,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        top2_2nd_expert_sampling: bool = True,
    ) -> None:
        super().__init__()
        if k < 1 or k > num_experts:
            raise ConfigError(f"MoE k={k}: each token goes to between 1 and {num_experts} experts")
        if noisy_gate_policy not in (None, "None", "Jitter", "RSample"):
            raise ConfigError(
                f"noisy_gate_policy={noisy_gate_policy!r} is not a gate noise; use None, "
                "'Jitter' or 'RSample'"
            )
        if noisy_gate_policy == "RSample" and k != 1:
            raise ConfigError(
                "noisy_gate_policy='RSample' applies to k=1 only (k=2 samples its second expert "
                "through top2_2nd_expert_sampling); use k=1 or noisy_gate_policy=None"
            )
        self.wg = torch.nn.Linear(model_dim, num_experts, bias=False).float()
        self.k = k
        self.capacity_factor = capacity_factor
        self.eval_capacity_factor = eval_capacity_factor
        self.min_capacity = min_capacity
        self.noisy_gate_policy = None if noisy_gate_policy == "None" else noisy_gate_policy
        self.drop_tokens = drop_tokens
        self.use_rts = use_rts
        self.top2_2nd_expert_sampling = top2_2nd_expert_sampling
        # drop_tokens=False: how the expert-parallel group agrees on the capacity (set by the
        # layer once it knows its group).
        self.agree: Callable[[torch.Tensor], None] | None = None

    def forward(self, x: torch.Tensor, used_token: torch.Tensor | None = None) -> GateOutput:
        x32 = x.float()
        if self.noisy_gate_policy == "Jitter" and self.training:
            x32 = multiplicative_jitter(x32)
        logits = F.linear(x32, self.wg.weight.float())
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        if self.k == 1:
            return top1gating(
                logits,
                factor,
                self.min_capacity,
                self.noisy_gate_policy if self.training else None,
                self.drop_tokens,
                self.use_rts,
                self.agree,
                used_token,
            )
        if self.k == 2:
            return top2gating(
                logits,
                factor,
                self.min_capacity,
                self.drop_tokens,
                self.top2_2nd_expert_sampling,
                self.agree,
            )
        return topkgating(
            logits, self.k, factor, self.min_capacity, self.drop_tokens, agree=self.agree
        )

    def extra_repr(self) -> str:
        return f"k={self.k}, capacity_factor={self.capacity_factor}, drop_tokens={self.drop_tokens}"


__all__ = [
    "TopKGate",
    "capacity",
    "gumbel_rsample",
    "multiplicative_jitter",
    "top1gating",
    "top2gating",
    "topkgating",
]
