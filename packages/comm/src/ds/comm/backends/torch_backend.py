"""The default Communicator: real ``torch.distributed`` (gloo on CPU, nccl on CUDA).

Every collective has two paths. With nothing switched on (no comms logger, watchdog, consistency
checks or event bus) it is one call into torch plus a handle wrapper for ``async_op=True``. With any
of them on, the call is routed through :class:`ds.comm._instrument.Tap`, which times it, guards it
with a timeout and checks shapes across ranks as configured.

torch 2.13 deprecates ``all_gather_into_tensor``/``reduce_scatter_tensor`` in favour of
``all_gather_single``/``reduce_scatter_single``; the current spelling is chosen once at import so
users never see the deprecation warning through ds.

Size: one class, every operation of the Communicator protocol over torch.distributed, each a few
lines; split by operation it would read worse.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as _dist

from ds.comm import coalesced as _coalesced
from ds.comm._handle import DoneHandle, Handle
from ds.comm._reduce_op import is_avg, to_torch_op
from ds.interfaces.comm import (
    GLOO_CAPABILITIES,
    NCCL_CAPABILITIES,
    CommCapabilities,
    ReduceOp,
    WorkHandle,
)
from ds.interfaces.errors import CommError

if TYPE_CHECKING:
    from ds.comm._instrument import Tap

_all_gather_single: Callable[..., Any] = getattr(_dist, "all_gather_single", None) or (
    _dist.all_gather_into_tensor
)
_reduce_scatter_single: Callable[..., Any] = getattr(_dist, "reduce_scatter_single", None) or (
    _dist.reduce_scatter_tensor
)
# torch releases that ship the *_single spellings also ship gloo with native reduce-scatter and
# AVG; older ones get the emulations below.
_MODERN_GLOO = hasattr(_dist, "all_gather_single")

_SUM = _dist.ReduceOp.SUM


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _unstack(stacked: torch.Tensor, part: torch.Tensor) -> torch.Tensor:
    # torch documents a "stacked" [world, *shape] form for the single-tensor gather/scatter, but
    # gloo only accepts the concatenated one; the two share memory layout, so view one as the other.
    if part.dim() == 0:
        return stacked.view(-1)
    return stacked.view(-1, *part.shape[1:])


def _not_initialized() -> CommError:
    return CommError(
        "the default process group is not initialized; call ds.comm.init_distributed() "
        "(or torch.distributed.init_process_group) before using collectives"
    )


class TorchCommunicator:
    """``ds.interfaces.comm.Communicator`` over ``torch.distributed``.

    Registered as entry point ``torch`` in group ``ds.comm_backends``; construct with no arguments.
    ``native_avg`` / ``native_reduce_scatter`` say whether the gloo backend is trusted with AVG and
    reduce-scatter; when False those are emulated (SUM then divide; all-reduce then slice).
    """

    name = "torch"
    # Instrumentation is process-wide, like torch.distributed's own state: every instance (the
    # module API's and any a runtime built from the registry) is logged and guarded alike.
    _tap: Tap | None = None

    def __init__(self) -> None:
        self.native_avg = _MODERN_GLOO
        self.native_reduce_scatter = _MODERN_GLOO
        self._backend: str | None = None

    # -- process groups -------------------------------------------------------------------------
    def init_process_group(
        self,
        backend: str,
        init_method: str | None,
        rank: int,
        world_size: int,
        timeout_s: float,
    ) -> None:
        if _dist.is_initialized():
            return
        _dist.init_process_group(
            backend=backend,
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        self._backend = backend

    def is_initialized(self) -> bool:
        return bool(_dist.is_available() and _dist.is_initialized())

    def destroy_process_group(self, group: Any = None) -> None:
        if group is None and self._tap is not None:
            self.set_tap(None)
        if _dist.is_initialized():
            _dist.destroy_process_group(group)

    def get_rank(self, group: Any = None) -> int:
        if not _dist.is_initialized():
            raise _not_initialized()
        return int(_dist.get_rank(group))

    def get_world_size(self, group: Any = None) -> int:
        if not _dist.is_initialized():
            raise _not_initialized()
        return int(_dist.get_world_size(group))

    def get_local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def get_backend(self, group: Any = None) -> str:
        if not _dist.is_initialized():
            raise _not_initialized()
        return str(_dist.get_backend(group))

    def capabilities(self, group: Any = None) -> CommCapabilities:
        """What the group's backend does well (see ``ds.interfaces.comm.CommCapabilities``):
        gloo's (and MPI's) host-side choices, or NCCL's for every device backend."""
        backend = self.get_backend(group).lower() if self.is_initialized() else "gloo"
        return GLOO_CAPABILITIES if backend in ("gloo", "mpi") else NCCL_CAPABILITIES

    def new_group(self, ranks: Sequence[int] | None = None, **kwargs: Any) -> Any:
        return _dist.new_group(list(ranks) if ranks is not None else None, **kwargs)

    def get_process_group_ranks(self, group: Any = None) -> list[int]:
        if group is None:
            return list(range(self.get_world_size()))
        return list(_dist.get_process_group_ranks(group))

    def get_global_rank(self, group: Any, group_rank: int) -> int:
        return int(_dist.get_global_rank(group, group_rank))

    # -- instrumentation ------------------------------------------------------------------------
    @property
    def tap(self) -> Tap | None:
        """The active instrumentation (None when logger, watchdog and checks are all off)."""
        return self._tap

    def set_tap(self, tap: Tap | None) -> None:
        old = TorchCommunicator._tap
        if old is not None and old is not tap:
            old.close()
        TorchCommunicator._tap = tap

    def _issue(
        self,
        name: str,
        nbytes: int,
        group: Any,
        async_op: bool,
        call: Callable[[bool], Any],
        tensors: tuple[torch.Tensor, ...],
        after: Callable[[], None] | None = None,
        same_shape: bool = True,
    ) -> WorkHandle | None:
        tap = self._tap
        if tap is not None:
            return tap.run(name, nbytes, group, async_op, call, tensors, after, same_shape)
        work = call(async_op)
        if work is not None and async_op:
            return Handle(work, after)
        if after is not None:
            after()
        return None

    # -- collectives ----------------------------------------------------------------------------
    def barrier(
        self,
        group: Any = None,
        async_op: bool = False,
        timeout: float | None = None,
        device_ids: list[int] | None = None,
    ) -> WorkHandle | None:
        tap = self._tap
        if device_ids is not None:
            # nccl's device hint; forwarded as given (no instrumentation for this form).
            work = _dist.barrier(group, async_op, device_ids=device_ids)
            return Handle(work) if work is not None and async_op else None
        if tap is None and timeout is None:
            work = _dist.barrier(group, async_op)
            return Handle(work) if work is not None and async_op else None
        if tap is None:
            # A torch-style explicit timeout: a waitable barrier bounded by it.
            work = _dist.barrier(group, async_op=True)
            handle = Handle(work)
            if async_op:
                return handle
            try:
                handle.wait(timeout)
            except RuntimeError as exc:
                raise CommError(f"barrier did not complete within {timeout} s: {exc}") from exc
            return None
        return tap.run(
            "barrier",
            0,
            group,
            async_op,
            lambda a: _dist.barrier(group, async_op=a),
            (),
            None,
            True,
            timeout=timeout,
        )

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> WorkHandle | None:
        if self._tap is None:
            work = _dist.broadcast(tensor, src, group, async_op)
            return Handle(work) if work is not None and async_op else None
        return self._issue(
            "broadcast",
            _nbytes(tensor),
            group,
            async_op,
            lambda a: _dist.broadcast(tensor, src, group, a),
            (tensor,),
        )

    def _avg_after(self, tensor: torch.Tensor, group: Any) -> Callable[[], None]:
        n = self.get_world_size(group)

        def divide() -> None:
            if tensor.is_floating_point() or tensor.is_complex():
                tensor.div_(n)
            else:
                tensor.copy_(torch.div(tensor, n, rounding_mode="trunc"))

        return divide

    def all_reduce(
        self,
        tensor: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        top = _SUM if op is ReduceOp.SUM else to_torch_op(op)
        after = None
        if not self.native_avg and is_avg(top):
            top, after = _SUM, self._avg_after(tensor, group)
        if self._tap is None and after is None:
            work = _dist.all_reduce(tensor, top, group, async_op)
            return Handle(work) if work is not None and async_op else None
        return self._issue(
            "all_reduce",
            _nbytes(tensor),
            group,
            async_op,
            lambda a: _dist.all_reduce(tensor, top, group, a),
            (tensor,),
            after,
        )

    def reduce(
        self,
        tensor: torch.Tensor,
        dst: int,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        top = to_torch_op(op)
        after = None
        if not self.native_avg and is_avg(top):
            top = _SUM
            after = self._avg_after(tensor, group) if self.get_rank() == dst else None
        return self._issue(
            "reduce",
            _nbytes(tensor),
            group,
            async_op,
            lambda a: _dist.reduce(tensor, dst, top, group, a),
            (tensor,),
            after,
        )

    def all_gather(
        self,
        tensor_list: list[torch.Tensor],
        tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        return self._issue(
            "all_gather",
            sum(_nbytes(t) for t in tensor_list),
            group,
            async_op,
            lambda a: _dist.all_gather(tensor_list, tensor, group, a),
            (tensor,),
        )

    def all_gather_into_tensor(
        self,
        output_tensor: torch.Tensor,
        input_tensor: torch.Tensor,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        output, input = output_tensor, input_tensor
        if output.dim() == input.dim() + 1:
            output = _unstack(output, input)
        if self._tap is None:
            work = _all_gather_single(output, input, group, async_op)
            return Handle(work) if work is not None and async_op else None
        return self._issue(
            "all_gather_into_tensor",
            _nbytes(output),
            group,
            async_op,
            lambda a: _all_gather_single(output, input, group, a),
            (input,),
        )

    all_gather_single = all_gather_into_tensor

    def reduce_scatter(
        self,
        output: torch.Tensor,
        input_list: list[torch.Tensor],
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        top = to_torch_op(op)
        if not self.native_reduce_scatter:
            flat = torch.cat([t.reshape(-1) for t in input_list])
            return self._emulated_reduce_scatter(
                "reduce_scatter", output, flat, top, group, async_op
            )
        after = None
        if not self.native_avg and is_avg(top):
            top, after = _SUM, self._avg_after(output, group)
        return self._issue(
            "reduce_scatter",
            sum(_nbytes(t) for t in input_list),
            group,
            async_op,
            lambda a: _dist.reduce_scatter(output, input_list, top, group, a),
            (output,),
            after,
        )

    def reduce_scatter_tensor(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        top = _SUM if op is ReduceOp.SUM else to_torch_op(op)
        if input.dim() == output.dim() + 1:
            input = _unstack(input, output)
        if not self.native_reduce_scatter:
            return self._emulated_reduce_scatter(
                "reduce_scatter_tensor", output, input.reshape(-1), top, group, async_op
            )
        after = None
        if not self.native_avg and is_avg(top):
            top, after = _SUM, self._avg_after(output, group)
        if self._tap is None and after is None:
            work = _reduce_scatter_single(output, input, top, group, async_op)
            return Handle(work) if work is not None and async_op else None
        return self._issue(
            "reduce_scatter_tensor",
            _nbytes(input),
            group,
            async_op,
            lambda a: _reduce_scatter_single(output, input, top, group, a),
            (input,),
            after,
        )

    reduce_scatter_single = reduce_scatter_tensor

    def _emulated_reduce_scatter(
        self,
        name: str,
        output: torch.Tensor,
        flat_input: torch.Tensor,
        top: Any,
        group: Any,
        async_op: bool,
    ) -> WorkHandle | None:
        # Backends without reduce-scatter: all-reduce a private copy, keep this rank's slice.
        # Costs world_size x the traffic of a native reduce-scatter, but is exact.
        buf = flat_input.clone()
        rank = self.get_rank(group)
        n = output.numel()
        avg = is_avg(top) and not self.native_avg
        if avg:
            top = _SUM
        world = self.get_world_size(group)

        def take_slice() -> None:
            part = buf[rank * n : (rank + 1) * n]
            if avg:
                if part.is_floating_point():
                    part = part / world
                else:
                    part = torch.div(part, world, rounding_mode="trunc")
            output.view(-1).copy_(part)

        return self._issue(
            name,
            _nbytes(flat_input),
            group,
            async_op,
            lambda a: _dist.all_reduce(buf, top, group, a),
            (output,),
            take_slice,
        )

    def all_to_all_single(
        self,
        output: torch.Tensor,
        input: torch.Tensor,
        output_split_sizes: list[int] | None = None,
        input_split_sizes: list[int] | None = None,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        return self._issue(
            "all_to_all_single",
            _nbytes(input),
            group,
            async_op,
            lambda a: _dist.all_to_all_single(
                output, input, output_split_sizes, input_split_sizes, group, a
            ),
            (input,),
            None,
            output_split_sizes is None and input_split_sizes is None,
        )

    def all_to_all(
        self,
        output_tensor_list: list[torch.Tensor],
        input_tensor_list: list[torch.Tensor],
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        return self._issue(
            "all_to_all",
            sum(_nbytes(t) for t in input_tensor_list),
            group,
            async_op,
            lambda a: _dist.all_to_all(output_tensor_list, input_tensor_list, group, a),
            tuple(input_tensor_list[:1]),
            None,
            False,
        )

    def gather(
        self,
        tensor: torch.Tensor,
        gather_list: list[torch.Tensor] | None = None,
        dst: int = 0,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        return self._issue(
            "gather",
            _nbytes(tensor),
            group,
            async_op,
            lambda a: _dist.gather(tensor, gather_list, dst, group, a),
            (tensor,),
        )

    def scatter(
        self,
        tensor: torch.Tensor,
        scatter_list: list[torch.Tensor] | None = None,
        src: int = 0,
        group: Any = None,
        async_op: bool = False,
    ) -> WorkHandle | None:
        return self._issue(
            "scatter",
            _nbytes(tensor),
            group,
            async_op,
            lambda a: _dist.scatter(tensor, scatter_list, src, group, a),
            (tensor,),
        )

    # -- point to point -------------------------------------------------------------------------
    def send(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> None:
        tap = self._tap
        if tap is None:
            _dist.send(tensor, dst, group, tag)
            return
        handle = tap.run_p2p("send", tensor, dst, lambda: _dist.isend(tensor, dst, group, tag))
        handle.wait()

    def recv(
        self, tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0
    ) -> Any:
        tap = self._tap
        if tap is None or src is None:
            return _dist.recv(tensor, src, group, tag)
        handle = tap.run_p2p("recv", tensor, src, lambda: _dist.irecv(tensor, src, group, tag))
        handle.wait()
        return src

    def isend(self, tensor: torch.Tensor, dst: int, group: Any = None, tag: int = 0) -> WorkHandle:
        tap = self._tap
        if tap is None:
            return Handle(_dist.isend(tensor, dst, group, tag))
        return tap.run_p2p("isend", tensor, dst, lambda: _dist.isend(tensor, dst, group, tag))

    def irecv(
        self, tensor: torch.Tensor, src: int | None = None, group: Any = None, tag: int = 0
    ) -> WorkHandle:
        tap = self._tap
        if tap is None or src is None:
            return Handle(_dist.irecv(tensor, src, group, tag))
        return tap.run_p2p("irecv", tensor, src, lambda: _dist.irecv(tensor, src, group, tag))

    def batch_isend_irecv(self, ops: Sequence[Any]) -> list[WorkHandle]:
        """``torch.distributed.batch_isend_irecv`` over ``torch.distributed.P2POp``s.

        On NCCL the batch is one group: its sends and receives progress together, so two ranks
        that each send to the other before receiving cannot deadlock, as unbatched ones can.
        """
        works = list(_dist.batch_isend_irecv(list(ops)) or [])
        tap = self._tap
        if tap is None:
            return [Handle(w) for w in works]
        # Watched and timed as the single p2p calls are: one handle per operation (gloo), or
        # one for the whole group (NCCL), named after its last operation's peer.
        named = ops if len(works) == len(ops) else [ops[-1]] * len(works)
        return [
            tap.run_p2p("batch_isend_irecv", op.tensor, op.peer, lambda w=w: w)
            for w, op in zip(works, named, strict=True)
        ]

    # -- objects --------------------------------------------------------------------------------
    def broadcast_object_list(
        self, object_list: list[Any], src: int = 0, group: Any = None, device: Any = None
    ) -> None:
        _dist.broadcast_object_list(object_list, src, group, device)

    def all_gather_object(self, object_list: list[Any], obj: Any, group: Any = None) -> None:
        _dist.all_gather_object(object_list, obj, group)

    def gather_object(
        self, obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group: Any = None
    ) -> None:
        _dist.gather_object(obj, object_gather_list, dst, group)

    def scatter_object_list(
        self,
        scatter_object_output_list: list[Any],
        scatter_object_input_list: list[Any] | None,
        src: int = 0,
        group: Any = None,
    ) -> None:
        _dist.scatter_object_list(scatter_object_output_list, scatter_object_input_list, src, group)

    # -- coalesced (the ZeRO runtime's bucketed collectives) ------------------------------------
    def all_gather_coalesced(
        self,
        shards: Sequence[torch.Tensor],
        numels: Sequence[int] | None = None,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        """See :func:`ds.comm.coalesced.all_gather_coalesced`."""
        return _coalesced.all_gather_coalesced(self, shards, numels, group, async_op)

    def reduce_scatter_coalesced(
        self,
        tensors: Sequence[torch.Tensor],
        op: Any = ReduceOp.SUM,
        group: Any = None,
        async_op: bool = False,
    ) -> Any:
        """See :func:`ds.comm.coalesced.reduce_scatter_coalesced`."""
        return _coalesced.reduce_scatter_coalesced(self, tensors, op, group, async_op)


__all__ = ["DoneHandle", "Handle", "TorchCommunicator"]
