"""AutoEP: transformers' sparse MoE blocks (Mixtral, Qwen2-MoE, Qwen3-MoE) made expert parallel.

Each block keeps its router (``block.gate``: softmax, top-k, ``norm_topk_prob``, no capacity and no
drop, exactly transformers' routing) and any shared expert; only ``block.experts`` (the fused
``gate_up_proj [E, 2I, H]`` / ``down_proj [E, H, I]`` tensors) is replaced by
:class:`ExpertParallelExperts`, which keeps the ``E / ep_size`` experts of this rank's position in
its expert-parallel group, one parameter per expert keyed by global index
(``experts.gate_up_proj.<e>`` ``[2I, H]``, ``experts.down_proj.<e>`` ``[H, I]``), loaded from the
original tensors. A forward sends every (token, choice) pair to the rank holding its expert with
one all-to-all of variable sizes, runs the local experts, sends the outputs back and sums them
with the router's weights, as transformers' loop over experts does.

:func:`fused_state_dict` turns the per-expert names back into transformers' fused tensors (for an
export that ``from_pretrained`` loads).
"""

from __future__ import annotations

from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import REPLICA_ATTR
from ds.parallel.moe.groups import ExpertGroups, expert_groups


def _exchange(
    comm: Any, group: Any, x: torch.Tensor, send: list[int], recv: list[int]
) -> torch.Tensor:
    out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
    comm.all_to_all_single(out, x.contiguous(), recv, send, group=group)
    return out


class _VarAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, comm: Any, group: Any, x: torch.Tensor, send: list[int], recv: list[int]
    ) -> torch.Tensor:
        ctx.args = (comm, group, send, recv)
        return _exchange(comm, group, x, send, recv)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        comm, group, send, recv = ctx.args
        # The gradients travel back the way the rows came.
        return None, None, _exchange(comm, group, grad, recv, send), None, None


def _is_fused_experts(module: torch.nn.Module) -> bool:
    gu, down = getattr(module, "gate_up_proj", None), getattr(module, "down_proj", None)
    return (
        isinstance(gu, torch.nn.Parameter)
        and isinstance(down, torch.nn.Parameter)
        and gu.dim() == 3
        and hasattr(module, "act_fn")
    )


class ExpertParallelExperts(torch.nn.Module):
    def __init__(self, original: Any, comm: Any, groups: ExpertGroups) -> None:
        super().__init__()
        num_experts = int(original.gate_up_proj.shape[0])
        ep = groups.ep_size
        if num_experts % ep:
            raise ConfigError(
                f"expert_parallel.autoep_size={ep} does not divide the model's {num_experts} "
                f"experts; choose a divisor of {num_experts}"
            )
        self.num_experts = num_experts
        self.num_local = num_experts // ep
        self.first = groups.ep_rank * self.num_local
        self.act_fn: Any = original.act_fn
        self.comm, self.groups = comm, groups
        self.fold: Any = None  # a TPFold (ds.parallel.moe.folded) when folded onto TP
        local = range(self.first, self.first + self.num_local)
        with torch.no_grad():
            self.gate_up_proj = torch.nn.ParameterDict(
                {
                    str(e): torch.nn.Parameter(original.gate_up_proj[e].detach().clone())
                    for e in local
                }
            )
            self.down_proj = torch.nn.ParameterDict(
                {str(e): torch.nn.Parameter(original.down_proj[e].detach().clone()) for e in local}
            )
        for p in self.parameters():
            p.allreduce = False  # type: ignore[attr-defined]  # DeepSpeed's expert marks
            p.group_name = groups.name  # type: ignore[attr-defined]
            setattr(p, REPLICA_ATTR, groups.replicas)

    def _expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        gate, up = torch.nn.functional.linear(x, self.gate_up_proj[str(e)]).chunk(2, dim=-1)
        return torch.nn.functional.linear(self.act_fn(gate) * up, self.down_proj[str(e)])

    def forward(
        self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
    ) -> torch.Tensor:
        k = top_k_index.shape[-1]
        experts = top_k_index.reshape(-1)
        tokens = torch.arange(
            hidden_states.shape[0], device=hidden_states.device
        ).repeat_interleave(k)
        weights = top_k_weights.reshape(-1)
        order = torch.argsort(experts, stable=True)  # grouped by expert, hence by owning rank
        experts, tokens, weights = experts[order], tokens[order], weights[order]
        every_token, source = tokens, hidden_states
        fold = self.fold
        if fold is not None:  # folded onto TP: this rank sends its share of the routes
            shares = fold.shares(experts)
            experts, tokens = experts[shares[fold.rank]], tokens[shares[fold.rank]]
            source = fold.share_input(hidden_states)
        ep = self.groups.ep_size
        owner = torch.div(experts, self.num_local, rounding_mode="floor")
        send = torch.bincount(owner, minlength=ep)
        rows = source[tokens]
        if ep > 1:
            group = self.groups.ep_group
            recv = torch.empty_like(send)
            self.comm.all_to_all_single(recv, send, group=group)
            send_l, recv_l = send.tolist(), recv.tolist()
            ids = _exchange(self.comm, group, experts, send_l, recv_l)
            rows = _VarAllToAll.apply(self.comm, group, rows, send_l, recv_l)  # type: ignore[no-untyped-call]
        else:
            ids = experts
        out = torch.zeros(
            rows.shape[0], hidden_states.shape[-1], dtype=rows.dtype, device=rows.device
        )
        # Rows arrive grouped by source rank, each source's rows sorted by expert.
        for e in range(self.first, self.first + self.num_local):
            where = (ids == e).nonzero().squeeze(1)
            if where.numel():
                out = out.index_put((where,), self._expert(e, rows[where]))
        if ep > 1:
            out = _VarAllToAll.apply(self.comm, self.groups.ep_group, out, recv_l, send_l)  # type: ignore[no-untyped-call]
        if fold is not None:
            out = fold.gather(out, shares)
        result = torch.zeros_like(hidden_states)
        return result.index_add(0, every_token, (out * weights.unsqueeze(1)).to(result.dtype))


def autoep(model: torch.nn.Module, comm: Any, ep_size: int) -> list[ExpertParallelExperts]:
    """Replace every fused experts module of ``model``'s sparse MoE blocks by its expert-parallel
    version over ``ep_size`` ranks (collective: creates the groups). Returns the new modules."""
    targets = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if _is_fused_experts(child) and not isinstance(child, ExpertParallelExperts)
    ]
    if not targets:
        return []
    groups = expert_groups(comm, ep_size)
    done = []
    for parent, name in targets:
        new = ExpertParallelExperts(getattr(parent, name), comm, groups)
        setattr(parent, name, new)
        done.append(new)
    return done


def fused_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A state dict with every expert (``...experts.gate_up_proj.<e>``) restacked into
    transformers' fused ``...experts.gate_up_proj [E, ...]`` (and ``down_proj``)."""
    out: dict[str, torch.Tensor] = {}
    stacks: dict[str, dict[int, torch.Tensor]] = {}
    for name, t in state.items():
        base, _, last = name.rpartition(".")
        if last.isdigit() and base.endswith(("experts.gate_up_proj", "experts.down_proj")):
            stacks.setdefault(base, {})[int(last)] = t
        else:
            out[name] = t
    for base, parts in stacks.items():
        if sorted(parts) != list(range(len(parts))):
            raise ConfigError(
                f"{base}: experts {sorted(parts)} given, not all of 0..{max(parts)}; gather "
                "every expert-parallel rank's state first"
            )
        out[base] = torch.stack([parts[e] for e in range(len(parts))])
    return out


__all__ = ["ExpertParallelExperts", "autoep", "fused_state_dict"]
