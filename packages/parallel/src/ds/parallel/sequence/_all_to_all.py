"""The one collective of Ulysses: an all-to-all that trades a sharded dimension for another.

``x`` is split into ``sp`` equal chunks along ``scatter_dim``; chunk ``j`` goes to group rank
``j``; the chunks received from ranks ``0..sp-1`` are concatenated along ``gather_dim``. The
backward pass is the same exchange with the two dimensions swapped, so gradients flow back to the
ranks that produced each activation. Everything goes through a ``ds.interfaces.comm.Communicator``
(``all_to_all_single`` on ``group``), never ``torch.distributed`` directly, so the simulated
communicator and any other backend work unchanged.
"""

from __future__ import annotations

from typing import Any

import torch


def _exchange(
    comm: Any, group: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    sp = int(comm.get_world_size(group))
    if sp == 1:
        return x
    if x.shape[scatter_dim] % sp:
        # Internal invariant: callers check head counts and sequence lengths with clear errors.
        raise AssertionError(
            f"dimension {scatter_dim} of size {x.shape[scatter_dim]} does not split into {sp} chunks"
        )
    # [sp, ...chunk]: chunk j is row j, which all_to_all_single sends to group rank j.
    send = torch.stack(x.chunk(sp, dim=scatter_dim), dim=0).contiguous()
    recv = torch.empty_like(send)
    comm.all_to_all_single(recv, send, group=group)
    return torch.cat(recv.unbind(0), dim=gather_dim)


class _SeqAllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, comm: Any, group: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int
    ) -> torch.Tensor:
        ctx.comm, ctx.group, ctx.dims = comm, group, (scatter_dim, gather_dim)
        return _exchange(comm, group, x, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        scatter_dim, gather_dim = ctx.dims
        return None, None, _exchange(ctx.comm, ctx.group, grad, gather_dim, scatter_dim), None, None


def seq_all_to_all(
    comm: Any, group: Any, x: torch.Tensor, scatter_dim: int, gather_dim: int
) -> torch.Tensor:
    """Differentiable all-to-all over ``group``: split ``scatter_dim``, concatenate ``gather_dim``."""
    out: torch.Tensor = _SeqAllToAll.apply(comm, group, x, scatter_dim, gather_dim)  # type: ignore[no-untyped-call]
    return out


__all__ = ["seq_all_to_all"]
