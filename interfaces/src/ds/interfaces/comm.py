"""The Communicator contract: the collectives of torch.distributed behind one interface.

The signatures mirror ``torch.distributed`` so that ``from ds import comm as dist`` is a drop-in
replacement. ``group`` arguments accept whatever the backend's ``new_group`` returned.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


class ReduceOp(enum.Enum):
    SUM = "sum"
    AVG = "avg"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    BAND = "band"
    BOR = "bor"
    BXOR = "bxor"


@runtime_checkable
class WorkHandle(Protocol):
    """Returned by ``async_op=True`` collectives."""

    def wait(self, timeout: float | None = None) -> bool: ...
    def is_completed(self) -> bool: ...


@runtime_checkable
class ProcessGroup(Protocol):
    def rank(self) -> int: ...
    def size(self) -> int: ...


@runtime_checkable
class Communicator(Protocol):
    """A communication backend. ``ds.comm`` routes every public call through one of these."""

    def init_process_group(
        self,
        backend: str,
        init_method: str | None,
        rank: int,
        world_size: int,
        timeout_s: float,
    ) -> None: ...
    def is_initialized(self) -> bool: ...
    def destroy_process_group(self, group: Any = None) -> None: ...
    def get_rank(self, group: Any = None) -> int: ...
    def get_world_size(self, group: Any = None) -> int: ...
    def new_group(self, ranks: Sequence[int] | None = None) -> Any: ...
    def get_global_rank(self, group: Any, group_rank: int) -> int: ...

    def barrier(self, group: Any = None, async_op: bool = False) -> WorkHandle | None: ...
    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> WorkHandle | None: ...
    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: ReduceOp = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: ReduceOp = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: ReduceOp = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def reduce_scatter_tensor(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: ReduceOp = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None = None,
        input_split_sizes: list[int] | None = None,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None,
        dst: int,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None,
        src: int,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None: ...
    # ``tag`` pairs a send with the receive of the same tag from that peer (in order per tag).
    def send(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> None: ...
    def recv(self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0) -> Any: ...
    def isend(
        self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0
    ) -> WorkHandle: ...
    def irecv(
        self, tensor: torch.Tensor, src: int, group: Any = None, tag: int = 0
    ) -> WorkHandle: ...
    def broadcast_object_list(
        self, object_list: list[Any], src: int, group: Any = None
    ) -> None: ...
    def all_gather_object(self, object_list: list[Any], obj: Any, group: Any = None) -> None: ...


@dataclass(frozen=True)
class CommCapabilities:
    """How a backend's collectives behave, so runtimes choose by capability, not by name.

    ``p2p_gather``: exchanging a partition with each peer point to point (batched) beats an
    all-gather (gloo, where ``all_gather`` stages through a flat temporary). ``reduce_to_owner_world``:
    the smallest world at which reducing a bucket's pieces to their owners beats all-reducing the
    whole bucket (gloo: 3; NCCL's reduce-scatter wins from 2). ``device_tensors_only``: every tensor
    must live on the rank's own device (NCCL). ``coalesced_collectives``: one bucketed
    ``all_gather_into_tensor``/``reduce_scatter_tensor`` per bucket is the efficient form (NCCL).
    """

    p2p_gather: bool = False
    reduce_to_owner_world: int = 2
    device_tensors_only: bool = True
    coalesced_collectives: bool = True


GLOO_CAPABILITIES = CommCapabilities(
    p2p_gather=True,
    reduce_to_owner_world=3,
    device_tensors_only=False,
    coalesced_collectives=False,
)
NCCL_CAPABILITIES = CommCapabilities()


def comm_capabilities(comm: Any, group: Any = None) -> CommCapabilities:
    """``comm.capabilities(group)`` when the communicator has it, else by backend name (gloo and
    anything unknown that runs on the host: gloo's; every other backend: NCCL's)."""
    get = getattr(comm, "capabilities", None)
    if callable(get):
        caps = get(group)
        if isinstance(caps, CommCapabilities):
            return caps
    try:
        backend = str(comm.get_backend(group)).lower()
    except Exception:  # no group yet: assume the host backend
        backend = "gloo"
    return GLOO_CAPABILITIES if backend in ("gloo", "mpi") else NCCL_CAPABILITIES
