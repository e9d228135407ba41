"""DeepSpeed's mixture-of-experts layer with expert parallelism.

``MoE(hidden_size, expert, num_experts, ep_size, k, ...)`` keeps ``num_experts / ep_size`` copies
of ``expert`` on each rank (the experts of its position in the expert-parallel group) and routes
every token through the top-k gate (:mod:`ds.parallel.moe.gate`). One forward:

1. the gate assigns each local token to up to k ``(expert, slot)`` pairs: ``[E, C, M]``;
2. an all-to-all over the expert-parallel group sends each expert's slots to the rank holding it
   (every rank receives ``[ep, E_local, C, M]``: the slots every rank filled for its experts);
3. each local expert runs on its ``ep * C`` slots;
4. the reverse all-to-all brings the outputs home, and they are combined with the gate weights.

The forward returns ``(output, l_aux, exp_counts)`` as DeepSpeed's does; add
``coefficient * l_aux`` to the loss to balance the experts.

Parameter names are the same at every ``ep_size``: local experts sit in a ModuleDict keyed by
their *global* index (``deepspeed_moe.experts.deepspeed_experts.<e>.*``, DeepSpeed's names at
``ep_size=1``), so a checkpoint written at one expert-parallel size loads at another. Expert
parameters carry DeepSpeed's marks (``allreduce=False``, ``group_name="ep_size_<ep>"``) and, once
the layer knows its groups (:meth:`MoE.bind`, which ``ds.initialize`` calls), the
:class:`ds.interfaces.moe.ReplicaGroup` the engine reduces them over.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from ds.interfaces.comm import ReduceOp
from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import REPLICA_ATTR
from ds.parallel.moe.gate import TopKGate
from ds.parallel.moe.groups import ExpertGroups, expert_groups
from ds.parallel.sequence._all_to_all import seq_all_to_all


class Experts(torch.nn.Module):
    """This rank's experts, keyed by global expert index."""

    def __init__(self, expert: torch.nn.Module, num_local_experts: int, group_name: str) -> None:
        super().__init__()
        self.num_local_experts = num_local_experts
        self.group_name = group_name
        self.deepspeed_experts = torch.nn.ModuleDict(
            {str(i): copy.deepcopy(expert) for i in range(num_local_experts)}
        )
        for p in self.parameters():
            p.allreduce = False  # type: ignore[attr-defined]
            p.group_name = group_name  # type: ignore[attr-defined]

    def place(self, first: int) -> None:
        """Re-key the local experts as global experts ``first .. first + num_local - 1``."""
        modules = list(self.deepspeed_experts.values())
        self.deepspeed_experts = torch.nn.ModuleDict(
            {str(first + i): m for i, m in enumerate(modules)}
        )

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        # inputs [ep, E_local, C, M]: local expert i runs on column i (every source rank's slots).
        outs = []
        for i, expert in enumerate(self.deepspeed_experts.values()):
            out = expert(inputs[:, i : i + 1])
            outs.append(out[0] if isinstance(out, tuple) else out)
        return torch.cat(outs, dim=1)


class MOELayer(torch.nn.Module):
    def __init__(self, gate: TopKGate, experts: Experts, num_experts: int, ep_size: int) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.num_experts = num_experts
        self.ep_size = ep_size
        self.num_local_experts = num_experts // ep_size
        self.comm: Any = None
        self.groups: ExpertGroups | None = None
        self.l_aux: torch.Tensor | None = None
        self.exp_counts: torch.Tensor | None = None

    def _exchange(self, x: torch.Tensor) -> torch.Tensor:
        # Row block j of dim 0 goes to expert-parallel rank j; the blocks received are stacked
        # along dim 0 in source-rank order.
        if self.ep_size == 1:
            return x
        assert self.groups is not None
        return seq_all_to_all(self.comm, self.groups.ep_group, x, 0, 0)

    def forward(self, x: torch.Tensor, used_token: torch.Tensor | None = None) -> torch.Tensor:
        if self.ep_size > 1 and self.groups is None:
            raise ConfigError(
                f"MoE with ep_size={self.ep_size} has no expert-parallel group yet: build the "
                "engine with ds.initialize (or deepspeed.initialize), or call moe.bind(comm) "
                "after init_distributed"
            )
        d_model = x.shape[-1]
        tokens = x.reshape(-1, d_model)
        self.l_aux, combine, dispatch, self.exp_counts = self.gate(tokens, used_token)
        dispatched = torch.einsum("sec,sm->ecm", dispatch.type_as(x), tokens)
        capacity = dispatched.shape[1]
        received = self._exchange(dispatched)
        received = received.reshape(self.ep_size, self.num_local_experts, capacity, d_model)
        out = self.experts(received)
        out = self._exchange(out.reshape(self.ep_size * self.num_local_experts, capacity, -1))
        out = out.reshape(self.num_experts, capacity, -1)
        combined = torch.einsum("sec,ecm->sm", combine.type_as(x), out)
        return combined.reshape(x.shape[:-1] + combined.shape[-1:])


class MoE(torch.nn.Module):
    """DeepSpeed's ``deepspeed.moe.layer.MoE`` (same arguments and return value)."""

    def __init__(
        self,
        hidden_size: int,
        expert: torch.nn.Module,
        num_experts: int = 1,
        ep_size: int = 1,
        k: int = 1,
        capacity_factor: float = 1.0,
        eval_capacity_factor: float = 1.0,
        min_capacity: int = 4,
        use_residual: bool = False,
        noisy_gate_policy: str | None = None,
        drop_tokens: bool = True,
        use_rts: bool = True,
        use_tutel: bool = False,
        enable_expert_tensor_parallelism: bool = False,
        top2_2nd_expert_sampling: bool = True,
        comm: Any = None,
    ) -> None:
        super().__init__()
        if num_experts < 1 or ep_size < 1 or num_experts % ep_size:
            raise ConfigError(
                f"MoE num_experts={num_experts} is not divisible by ep_size={ep_size}; choose an "
                f"ep_size that divides {num_experts}"
            )
        if use_tutel:
            raise ConfigError("MoE use_tutel=True: ds has no Tutel kernels; set use_tutel=False")
        if enable_expert_tensor_parallelism:
            raise ConfigError(
                "MoE enable_expert_tensor_parallelism=True: experts split over tensor-parallel "
                "ranks are not available in ds; set it to False"
            )
        self.ep_size = ep_size
        self.num_experts = num_experts
        self.num_local_experts = num_experts // ep_size
        self.expert_group_name = f"ep_size_{ep_size}"
        self.use_residual = use_residual
        gate = TopKGate(
            hidden_size,
            num_experts,
            k,
            capacity_factor,
            eval_capacity_factor,
            min_capacity,
            noisy_gate_policy,
            drop_tokens,
            use_rts,
            top2_2nd_expert_sampling,
        )
        experts = Experts(expert, self.num_local_experts, self.expert_group_name)
        self.deepspeed_moe = MOELayer(gate, experts, num_experts, ep_size)
        if use_residual:
            self.mlp = expert
            self.coefficient = torch.nn.Linear(hidden_size, 2)
        if comm is not None:
            self.bind(comm)

    def bind(self, comm: Any) -> ExpertGroups:
        """Join this rank's expert-parallel groups (creating them on first use: collective),
        take this rank's experts' global indices and mark their parameters for the engine."""
        groups = expert_groups(comm, self.ep_size)
        layer = self.deepspeed_moe
        if layer.groups is None:
            layer.experts.place(groups.ep_rank * self.num_local_experts)
        layer.comm, layer.groups = comm, groups
        if groups.ep_group is not None and not layer.gate.drop_tokens:

            def agree(t: torch.Tensor) -> None:
                comm.all_reduce(t, op=ReduceOp.MAX, group=groups.ep_group)

            layer.gate.agree = agree
        for p in layer.experts.parameters():
            setattr(p, REPLICA_ATTR, groups.replicas)
        return groups

    # DeepSpeed's name of bind (it creates the groups there).
    def set_deepspeed_parallelism(self, comm: Any = None) -> None:
        if comm is None:
            raise ConfigError(
                "set_deepspeed_parallelism needs the communicator in ds: ds.initialize binds "
                "MoE layers itself; or pass ds.comm.get_communicator()"
            )
        self.bind(comm)

    def forward(
        self, hidden_states: torch.Tensor, used_token: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        output = self.deepspeed_moe(hidden_states, used_token)
        if self.use_residual:
            # Residual MoE: a learned per-token mix of the experts' output and a dense MLP's.
            mlp_out = self.mlp(hidden_states)
            if isinstance(mlp_out, tuple):
                mlp_out = mlp_out[0]
            coef = torch.softmax(self.coefficient(hidden_states), dim=-1)
            output = output * coef[..., 0:1] + mlp_out * coef[..., 1:]
        l_aux, counts = self.deepspeed_moe.l_aux, self.deepspeed_moe.exp_counts
        assert l_aux is not None and counts is not None
        return output, l_aux, counts


def moe_layers(model: torch.nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


__all__ = ["Experts", "MOELayer", "MoE", "moe_layers"]
