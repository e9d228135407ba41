"""A simulated world of N ranks in one process, with a strict communicator that enforces NCCL's rules.

How the world runs: **one rank after another** (not threads). torch.distributed has one default
process group per process, and the ``"fake"`` backend
(``torch.testing._internal.distributed.fake_pg``) completes every collective at once without
moving data, so a rank never waits on a peer. :meth:`SimWorld.rank` makes rank ``r`` the process's
rank (a fake process group of the world's size, ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` set) and
hands out its :class:`StrictCommunicator`; the caller runs that rank's whole program (build the
engine, train, save, load), leaves, and enters the next rank. :meth:`SimWorld.check` then compares
what the ranks did. Data never crosses ranks: object collectives see the calling rank's own
objects, tensors carry no values (fake tensors, :mod:`ds.sim.accelerator`).

What the strict communicator checks, raising :class:`ds.interfaces.errors.CommError` at the call
(naming the collective, the tensor and the call site):

* every tensor handed to a collective or point-to-point op is a device tensor on the rank's own
  device (``cuda:local_rank``): a host tensor or another GPU's tensor is refused, as NCCL would;
* the rank's device is the current one (``set_device(local_rank)`` ran) when it issues any
  operation: NCCL binds a rank's communicator, and barriers and object collectives their
  buffers, to the current device, so a rank left on ``cuda:0`` would share GPU 0 with rank 0;
* the arguments torch itself validates (sizes of gather/scatter outputs, dtypes), through the fake
  process group.

What :meth:`SimWorld.check` checks over all ranks' traces, replaying them as NCCL would execute
them (each rank's operations in issue order on one stream; a collective runs when every member of
its group has it next; an unbatched send or receive runs when the peer has the matching receive or
send next; a ``batch_isend_irecv`` batch runs when each of its operations finds its counterpart at
the head of the peer's stream):

* every rank of a group issues the same collectives in the same order with the same element
  counts, dtypes, reduce ops and roots;
* sends match receives in size and dtype, and the order cannot deadlock (two ranks that both send
  first, unbatched, wait for each other forever on NCCL: a reported deadlock).

The world also counts, per rank, the bytes each kind of collective moved (:meth:`SimWorld.traffic`).

Size: the world's replay and the strict communicator that records what it replays share one trace
(:class:`Op`) and are read together.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as _dist

from ds.comm.backends.torch_backend import TorchCommunicator
from ds.comm.observe import Call, observed
from ds.interfaces.comm import NCCL_CAPABILITIES, CommCapabilities
from ds.interfaces.errors import CommError
from ds.sim.accelerator import active_device

MAX_LOCAL = 8  # GPUs of one simulated node (ds.sim.accelerator)

_P2P = ("send", "recv")


@dataclass(frozen=True)
class Op:
    """One operation as a rank issued it."""

    kind: str  # collective name, "send", "recv" or "batch"
    group: tuple[int, ...]  # global ranks of the group
    dtype: str = ""
    numels: tuple[int, ...] = ()
    reduce: str = ""
    root: int = -1  # global rank: src/dst of rooted collectives, peer of send/recv
    where: str = ""
    items: tuple[Op, ...] = ()  # kind == "batch": its sends and receives
    nbytes: int = 0

    def signature(self) -> tuple[Any, ...]:
        return (self.kind, self.group, self.dtype, self.numels, self.reduce, self.root)

    def describe(self) -> str:
        if self.kind == "batch":
            inner = ", ".join(i.describe() for i in self.items)
            return f"batch_isend_irecv[{inner}] at {self.where}"
        sizes = "x".join(str(n) for n in self.numels)
        extra = f" {self.reduce}" if self.reduce else ""
        if self.kind in _P2P:
            peer = "to" if self.kind == "send" else "from"
            return f"{self.kind} {peer} rank {self.root} {self.dtype}[{sizes}]"
        root = f" root {self.root}" if self.root >= 0 else ""
        return f"{self.kind}{extra} {self.dtype}[{sizes}]{root} on ranks {_span(self.group)}"


def _span(ranks: tuple[int, ...]) -> str:
    if ranks and list(ranks) == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}..{ranks[-1]}"
    return ",".join(str(r) for r in ranks)


def _call_site() -> str:
    for frame in reversed(traceback.extract_stack(sys._getframe(2), limit=30)):
        name = frame.filename.replace("\\", "/")
        if "/torch/" in name or "/ds/comm/" in name or name.endswith("/ds/sim/comm.py"):
            continue
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "<unknown>"


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel() * t.element_size())


@dataclass
class _Rank:
    trace: list[Op] = field(default_factory=list)
    traffic: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class SimWorld:
    """``world_size`` simulated ranks; ``local_size`` of them per node (at most 8, one GPU each).

    ``capabilities`` is what the communicators report to runtimes that choose by capability
    (NCCL's by default; pass ``GLOO_CAPABILITIES`` to run the gloo choices under the same checks).
    ``host_ranks``: the ranks are CPU ranks (gloo), whose communicator's device is the host, so
    every collective takes host tensors and none a GPU's (:mod:`ds.sim.cpu_rank`).
    """

    def __init__(
        self,
        world_size: int,
        local_size: int | None = None,
        capabilities: CommCapabilities = NCCL_CAPABILITIES,
        *,
        host_ranks: bool = False,
    ) -> None:
        if world_size < 1:
            raise CommError(f"a simulated world needs at least one rank, got {world_size}")
        local = min(world_size, MAX_LOCAL) if local_size is None else local_size
        if not 1 <= local <= MAX_LOCAL or world_size % local:
            raise CommError(
                f"local_size={local} must be 1..{MAX_LOCAL} and divide world_size={world_size}"
            )
        self.world_size = world_size
        self.local_size = local
        self.capabilities = capabilities
        self.host_ranks = host_ranks
        self.backend = "gloo" if host_ranks else "nccl"
        self._ranks = [_Rank() for _ in range(world_size)]
        self._active: int | None = None
        # Host-side values a sender posts beside a p2p message (see StrictCommunicator.post_values).
        self._values: dict[tuple[int, int, int], deque[list[int]]] = defaultdict(deque)

    def local_rank(self, rank: int) -> int:
        return rank % self.local_size

    def device(self, rank: int) -> torch.device:
        if self.host_ranks:
            return torch.device("cpu")
        return torch.device("cuda", self.local_rank(rank))

    @contextlib.contextmanager
    def rank(self, rank: int) -> Iterator[StrictCommunicator]:
        """Make this process rank ``rank`` of the world until the block ends."""
        if not 0 <= rank < self.world_size:
            raise CommError(f"rank {rank} is outside the simulated world of {self.world_size}")
        if self._active is not None:
            raise CommError(f"rank {self._active} is still running; ranks run one at a time")
        if _dist.is_initialized():
            raise CommError(
                "a process group already exists in this process; destroy it before simulating"
            )
        from torch.testing._internal.distributed.fake_pg import FakeStore

        env = {
            "RANK": str(rank),
            "LOCAL_RANK": str(self.local_rank(rank)),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(rank // self.local_size),
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        self._ranks[rank] = _Rank()  # a rank that runs again starts a fresh trace
        self._active = rank
        _dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=self.world_size)
        comm = StrictCommunicator(self, rank)
        try:
            yield comm
        finally:
            comm.destroy_process_group()
            self._active = None
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    # -- results --------------------------------------------------------------------------------
    def trace(self, rank: int) -> list[Op]:
        return list(self._ranks[rank].trace)

    def traffic(self, rank: int) -> dict[str, int]:
        """Bytes this rank handed to each kind of operation."""
        return dict(self._ranks[rank].traffic)

    def record(self, rank: int, op: Op) -> None:
        self._ranks[rank].trace.append(op)
        self._ranks[rank].traffic[op.kind] += op.nbytes

    def check(self) -> None:
        """Replay every rank's trace as NCCL would run it; raise CommError on the first mismatch
        or on a deadlock."""
        traces = [r.trace for r in self._ranks]
        heads = [0] * self.world_size
        # Operations of a batch already matched, per rank: indices into its items.
        done: list[set[int]] = [set() for _ in range(self.world_size)]

        def head(r: int) -> Op | None:
            return traces[r][heads[r]] if heads[r] < len(traces[r]) else None

        def advance(r: int) -> None:
            heads[r] += 1
            done[r].clear()

        def p2p_slots(r: int) -> list[tuple[int, Op]]:
            op = head(r)
            if op is None:
                return []
            if op.kind in _P2P:
                return [(-1, op)]
            if op.kind == "batch":
                return [(i, it) for i, it in enumerate(op.items) if i not in done[r]]
            return []

        def finish_p2p(r: int, slot: int) -> None:
            op = head(r)
            assert op is not None
            if slot < 0:
                advance(r)
                return
            done[r].add(slot)
            if len(done[r]) == len(op.items):
                advance(r)

        progress = True
        while progress:
            progress = False
            for r in range(self.world_size):
                op = head(r)
                if op is None:
                    continue
                if op.kind not in _P2P and op.kind != "batch":
                    members = op.group
                    others = [head(m) for m in members]
                    if any(o is None for o in others):
                        missing = [m for m, o in zip(members, others) if o is None]
                        raise CommError(
                            f"rank {r} issued {op.describe()} (at {op.where}) but rank "
                            f"{missing[0]} finished without it; every rank of the group must "
                            "issue the same collectives"
                        )
                    if all(
                        o is not None
                        and o.group == members
                        and o.kind not in _P2P
                        and o.kind != "batch"
                        for o in others
                    ):
                        for m, o in zip(members, others):
                            assert o is not None
                            if o.signature() != op.signature():
                                raise CommError(
                                    f"collective mismatch on ranks {_span(members)}: rank {r} "
                                    f"issued {op.describe()} (at {op.where}) where rank {m} "
                                    f"issued {o.describe()} (at {o.where}); every rank must "
                                    "issue the same collectives in the same order and sizes"
                                )
                        for m in members:
                            advance(m)
                        progress = True
                    continue
                for slot, item in p2p_slots(r):
                    peer = item.root
                    want = "recv" if item.kind == "send" else "send"
                    for pslot, pitem in p2p_slots(peer):
                        if pitem.kind == want and pitem.root == r:
                            if (pitem.dtype, pitem.numels) != (item.dtype, item.numels):
                                raise CommError(
                                    f"rank {r}'s {item.describe()} (at {op.where}) meets rank "
                                    f"{peer}'s {pitem.describe()}: sizes and dtypes of a send "
                                    "and its receive must match"
                                )
                            finish_p2p(r, slot)
                            finish_p2p(peer, pslot)
                            progress = True
                            break
                    if progress:
                        break
        stuck = [(r, head(r)) for r in range(self.world_size) if head(r) is not None]
        if stuck:
            lines = "; ".join(
                f"rank {r} waits in {op.describe()} (at {op.where})"
                for r, op in stuck[:4]
                if op is not None
            )
            raise CommError(
                f"deadlock: {lines}. Unbatched sends and receives run in issue order on NCCL; "
                "issue them in one batch_isend_irecv, or use a collective"
            )


@observed
class StrictCommunicator(TorchCommunicator):
    """One simulated rank's communicator: torch's API over the fake process group, with the
    device and trace checks of :mod:`ds.sim.comm` made on every operation by :meth:`observe`."""

    name = "sim"

    def __init__(self, world: SimWorld, rank: int) -> None:
        super().__init__()
        self.world = world
        self.rank = rank
        self.device = world.device(rank)
        self._backend = world.backend

    # -- identity (SimWorld.rank created the process group, so init_process_group does nothing) -
    def get_backend(self, group: Any = None) -> str:
        return self.world.backend

    def get_local_rank(self) -> int:
        return self.world.local_rank(self.rank)

    def capabilities(self, group: Any = None) -> CommCapabilities:
        return self.world.capabilities

    def set_tap(self, tap: Any) -> None:
        return None  # instrumentation would bypass the checks; the simulation records itself

    # -- checks ---------------------------------------------------------------------------------
    def _members(self, group: Any) -> tuple[int, ...]:
        if group is None:
            return tuple(range(self.world.world_size))
        return tuple(int(r) for r in _dist.get_process_group_ranks(group))

    def _require_selected(self, name: str, where: str) -> None:
        dev = active_device()
        if self.world.host_ranks:
            return  # a CPU rank's communicator has no device to select
        if dev is not None and dev.current != self.device.index:
            raise CommError(
                f"{name} on rank {self.rank} at {where} while cuda:{dev.current} is the current "
                f"device: NCCL runs a rank's communicator on the current device; select the "
                f"rank's device (set_device({self.device.index}), its local rank) before the "
                "process group and any allocation"
            )

    def _require_device(self, name: str, tensors: Sequence[torch.Tensor], where: str) -> None:
        self._require_selected(name, where)
        for i, t in enumerate(tensors):
            if t.device != self.device:
                kind = "a host tensor" if t.device.type == "cpu" else f"a tensor on {t.device}"
                raise CommError(
                    f"{name} on rank {self.rank} got {kind} (argument {i}, {_dtype(t)}"
                    f"[{t.numel()}]) at {where}; {self.world.backend} takes only tensors on the "
                    f"rank's own device {self.device}: copy the values to it explicitly first"
                )

    def _require_sizes(
        self, name: str, whole: torch.Tensor, part: torch.Tensor, group: Any
    ) -> None:
        # NCCL reads exactly size x count elements; the fake group checks nothing.
        size = len(self._members(group))
        if whole.numel() != size * part.numel() or whole.dtype != part.dtype:
            raise CommError(
                f"{name} on rank {self.rank}: the whole tensor has {whole.numel()} elements of "
                f"{_dtype(whole)} but the group of {size} needs {size} x {part.numel()} of "
                f"{_dtype(part)} (at {_call_site()})"
            )

    def observe(self, call: Call) -> None:
        """Every operation's one check point (see :func:`ds.comm.observe.observed`): device
        checks, sizes, and the operation in this rank's trace."""
        where = _call_site()
        name, tensors, peer = call.name, call.tensors, call.root
        if call.operation.p2p is not None:
            name = call.operation.p2p
            if peer is None:
                raise CommError(f"{name} from any source at {where}: NCCL needs the peer rank")
        self._require_device(name, tensors, where)
        dev = active_device()
        if dev is not None:
            for t in tensors:
                dev.touch(t)  # the fake group moves no data; on a rank, receives fill these
        counted = tensors if call.operation.p2p else call.counted
        self.world.record(
            self.rank,
            Op(
                name,
                self._p2p_group(peer) if call.operation.p2p else self._members(call.group),
                _dtype(counted[0]) if counted else "",
                tuple(int(t.numel()) for t in counted),
                "" if call.reduce is None else str(getattr(call.reduce, "value", call.reduce)),
                int(peer) if call.operation.p2p else peer,
                where,
                nbytes=sum(_nbytes(t) for t in counted),
            ),
        )
        if call.whole_part is not None:
            self._require_sizes(name, *call.whole_part, call.group)

    def _p2p_group(self, peer: int) -> tuple[int, ...]:
        return (min(self.rank, peer), max(self.rank, peer))

    # -- operations that behave differently here ------------------------------------------------
    def barrier(
        self,
        group: Any = None,
        async_op: bool = False,
        timeout: float | None = None,
        device_ids: list[int] | None = None,
    ) -> Any:
        return super().barrier(group, async_op)

    def broadcast(
        self, tensor: torch.Tensor, src: int, group: Any = None, async_op: bool = False
    ) -> Any:
        # torch.distributed.broadcast asks the CUDA runtime for the device's compute capability
        # (an fp8 workaround); a CPU build has none, so answer as an sm90 device would.
        real = torch.cuda.get_device_capability
        torch.cuda.get_device_capability = lambda device=None: (9, 0)  # type: ignore[assignment]
        try:
            return super().broadcast(tensor, src, group, async_op)
        finally:
            torch.cuda.get_device_capability = real

    # -- values fake tensors cannot carry ------------------------------------------------------
    def post_values(self, values: list[int], dst: int, tag: int = 0) -> None:
        """Post the integers a p2p message sent next carries (a pipeline's shape header).

        Fake tensors hold no data, so a receiver that sizes its buffers from a header it received
        would read zeros. A sender that builds its header from host integers (shapes, dtypes)
        posts them here as well; the receiver reads them with :meth:`take_values` after its
        ``recv`` of that message. The messages themselves still go through ``isend``/``recv``
        and are checked as any other.
        """
        self.world._values[(self.rank, int(dst), int(tag))].append([int(v) for v in values])

    def take_values(self, src: int, tag: int = 0) -> list[int]:
        """The integers ``src`` posted for its next message to this rank with ``tag``."""
        box = self.world._values.get((int(src), self.rank, int(tag)))
        if not box:
            raise CommError(
                f"rank {self.rank} receives a header from rank {src} (tag {tag}) that rank {src} "
                "has not sent: ranks of a simulated world run one after another, so a rank that "
                "receives values must run after its sender (give senders the lower ranks)"
            )
        return box.popleft()

    def batch_isend_irecv(self, ops: Sequence[Any]) -> list[Any]:
        """``torch.distributed.batch_isend_irecv`` over ``P2POp``s: one batch in the trace."""
        where = _call_site()
        items = []
        for p in ops:
            kind = "send" if p.op in (_dist.isend, _dist.send) else "recv"
            self._require_device(f"batch_isend_irecv {kind}", (p.tensor,), where)
            items.append(
                Op(
                    kind,
                    (),
                    _dtype(p.tensor),
                    (int(p.tensor.numel()),),
                    "",
                    int(p.peer),
                    where,
                    nbytes=_nbytes(p.tensor),
                )
            )
        self.world.record(
            self.rank,
            Op("batch", (), where=where, items=tuple(items), nbytes=sum(i.nbytes for i in items)),
        )
        return list(_dist.batch_isend_irecv(list(ops)) or [])

    # -- objects: a rank sees only its own ------------------------------------------------------
    def broadcast_object_list(
        self, object_list: list[Any], src: int = 0, group: Any = None, device: Any = None
    ) -> None:
        return None

    def all_gather_object(self, object_list: list[Any], obj: Any, group: Any = None) -> None:
        for i in range(len(object_list)):
            object_list[i] = obj

    def gather_object(
        self, obj: Any, object_gather_list: list[Any] | None = None, dst: int = 0, group: Any = None
    ) -> None:
        if object_gather_list is not None:
            for i in range(len(object_gather_list)):
                object_gather_list[i] = obj

    def scatter_object_list(
        self,
        scatter_object_output_list: list[Any],
        scatter_object_input_list: list[Any] | None,
        src: int = 0,
        group: Any = None,
    ) -> None:
        if scatter_object_input_list:
            scatter_object_output_list[0] = scatter_object_input_list[0]


__all__ = ["Op", "SimWorld", "StrictCommunicator"]
