"""Gather-before-use / release-after-use of stage-3 parameters, driven by module hooks.

Forward: a pre-hook gathers a module's own parameters (and prefetches the next modules' along a
recorded trace), a post-hook releases them. Backward: a multi-grad hook on the module's outputs
gathers again just before the module's backward runs; each parameter's post-accumulate-grad hook
reduce-scatters its gradient into this rank's partition and releases the full data.

The trace is the order in which modules fetched parameters during the first forward+backward; it
is replayed on later steps to prefetch and is invalidated (and re-recorded) the moment a step
departs from it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch

from ds.interfaces.logging import get_logger
from ds.zero.stage3.collectives import Collectives, PendingGather
from ds.zero.stage3.external import external_parameters, register_external_parameter
from ds.zero.stage3.external_access import ExternalAccess, in_backward, tensors_in, uninstall
from ds.zero.stage3.grads import GradReducer
from ds.zero.stage3.heap import release_free_heap
from ds.zero.stage3.leaf import z3_leaf_module
from ds.zero.stage3.limits import Accounting, Stage3Limits
from ds.zero.stage3.linear import patch_linears, unpatch_linears
from ds.zero.stage3.pool import BufferPool
from ds.zero.stage3.shard import ParamStatus, ShardState, partition_params, shard_of
from ds.zero.stage3.swap import ParamSwapper

log = get_logger(__name__)

# Stage3Limits, Accounting and the external-parameter helpers live in limits.py and external.py;
# imported from here too.
__all__ = [
    "Accounting",
    "Stage3Limits",
    "Stage3Partitioner",
    "external_parameters",
    "register_external_parameter",
]


class Stage3Partitioner(ExternalAccess):
    """Partitions ``module``'s parameters across ranks and manages their gathered lifetime."""

    def __init__(
        self,
        module: torch.nn.Module,
        collectives: Collectives,
        limits: Stage3Limits | None = None,
        swapper: ParamSwapper | None = None,
        leaf_modules: Sequence[type[torch.nn.Module]] = (),
    ) -> None:
        self.module = module
        # Modules whose forward reads their children's parameters without calling the children
        # (MultiheadAttention reads out_proj.weight directly) gather their whole subtree at once.
        self.leaf_types: tuple[type[torch.nn.Module], ...] = (
            torch.nn.MultiheadAttention,
            *leaf_modules,
        )
        self._external: dict[int, list[torch.nn.Parameter]] = {
            id(m): list(ps) for m, ps in external_parameters(module).items()
        }
        self.coll = collectives
        self.limits = limits or Stage3Limits()
        self.swapper = swapper
        self.acct = Accounting()
        self.params = partition_params(module, collectives, self.limits.param_persistence_threshold)
        self.by_name = {shard_of(p).name: p for p in self.params}
        self._live: dict[int, torch.nn.Parameter] = {}  # id(param) -> param, gathered
        # id(param) -> ids of the running modules that use it (a module running inside itself
        # is there once per invocation); read as ``param.ds_active_sub_modules``.
        self._in_use: dict[int, list[int]] = {}
        self._mirror_use()
        self._trace: list[torch.nn.Module] | None = None
        self._recording: list[torch.nn.Module] = []
        # Where backward starts in the trace / in the recording (prefetch stops there in forward).
        self._trace_backward = 0
        self._recording_backward: int | None = None
        # Return the heap's free pages once per step at the first backward fetch (heap.py).
        self.trim_heap = True
        self._pos = 0
        self._direct: dict[int, list[torch.nn.Parameter]] = {}
        self._hooks: list[Any] = []
        self._hooked: set[int] = set()
        self.acct.total_bytes = sum(shard_of(p).full_bytes for p in self.params)
        for p in self.params:
            s = shard_of(p)
            if swapper is not None and not s.persistent:
                swapper.register(s)
            if not s.swapped:
                self.acct.partition_bytes += s.shard_bytes
            if s.status is ParamStatus.AVAILABLE:
                self._add_live(p)
        self.pool = BufferPool(self._pool_budget())
        collectives.pool = self.pool
        self.grads = GradReducer(
            collectives,
            self.pool,
            self.limits.reduce_bucket_size,
        )
        self._held = 0
        self._backward_end_queued = False  # reset by after_backward, or by _drain after an error
        self._patched: list[torch.nn.Linear] = []
        if self.limits.memory_efficient_linear:  # DeepSpeed's default, as zero.Init's
            from ds.zero.init import use_memory_efficient_linear

            self._patched = patch_linears(module, self.pool.take)
            use_memory_efficient_linear()
        self._register_hooks()
        module.__dict__["_ds_stage3"] = self  # found by ds.zero.generation
        # Persistent parameters created on the meta device (or swapped) need one gather now.
        missing = [p for p in self.params if shard_of(p).persistent and id(p) not in self._live]
        if missing:
            self._gather(missing).wait()
        self.release_all()  # anything left whole by construction that is not persistent

    def _pool_budget(self) -> int:
        """Idle bytes the buffer pool may keep.

        Host memory: none. A released buffer goes straight back to the C heap, where the
        step's activations and the next gathers reuse it; kept idle in the pool it is resident
        memory nothing else can use (measured once on the 27.4M-parameter benchmark model: one
        prefetch bucket of idle host buffers raised peak RSS by about 30 MB and step time did
        not measurably improve, since the heap hands the same memory back without faults). Accelerator memory: one prefetch bucket plus the largest
        parameter, enough for the next gathers to find their buffers ready without going
        through the device allocator."""
        sharded = [shard_of(p) for p in self.params if not shard_of(p).persistent]
        if not sharded or all(self.coll.device_of(s).type == "cpu" for s in sharded):
            return 0
        total = sum(s.padded_numel for s in sharded)
        biggest = max(s.padded_numel for s in sharded)
        item = max(s.dtype.itemsize for s in sharded)
        return item * min(self.limits.prefetch_bucket_size + biggest, total)

    # -- hooks ---------------------------------------------------------------------------------
    def _register_hooks(self) -> None:
        stack = [self.module]
        while stack:
            m = stack.pop()
            leaf = isinstance(m, self.leaf_types) or z3_leaf_module(m)
            if not leaf:
                stack.extend(reversed(list(m.children())))
            own = [p for p in m.parameters(recurse=leaf) if hasattr(p, "ds_shard")]
            if leaf:
                for p in own:
                    p.ds_z3_leaf_module = m  # type: ignore[attr-defined]
            own += self._external.get(id(m), [])
            if not own:
                continue
            self._direct[id(m)] = list(dict.fromkeys(own))
            self._hook(m)
        for p in self.params:
            if p.requires_grad:
                self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
        self._hooks.append(self.module._register_state_dict_hook(self._full_state_dict))
        self._watch()

    def _full_state_dict(
        self, module: torch.nn.Module, state: dict[str, Any], prefix: str, meta: Any
    ) -> None:
        # module.state_dict() returns whole weights under stage 3 (it gathers one parameter at a
        # time, so every rank must call it); a tied parameter is gathered once and stays one
        # tensor under each of its names.
        whole: dict[int, torch.Tensor] = {}
        for name, p in module.named_parameters(remove_duplicate=False):
            key = prefix + name
            s = getattr(p, "ds_shard", None)
            if s is None or key not in state or s.status is ParamStatus.AVAILABLE:
                continue
            if id(p) not in whole:
                self.gather_all([p])
                whole[id(p)] = p.data.detach().clone()
                self.release([p])
            state[key] = whole[id(p)]

    def remove_hooks(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks.clear()
        uninstall(self.module)
        unpatch_linears(self._patched)
        self.module.__dict__.pop("_ds_stage3", None)

    def _pre_forward(self, module: torch.nn.Module, args: Any) -> None:
        self._enter(module)
        self.fetch(module, "forward")
        for p in self._direct[id(module)]:
            self._in_use.setdefault(id(p), []).append(id(module))

    def _post_forward(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._leave(module)
        self.adopt_returned(module, output)
        for p in self._direct[id(module)]:
            self._stop_using(p, module)
        # A forward run inside backward is an activation-checkpoint recompute: the tensors it
        # saved (the parameters themselves, see linear.py) are compared with the original
        # forward's and read by the module's backward after it, so they stay whole until their
        # gradient is reduced (_on_grad) or the backward ends (after_backward).
        if not in_backward() and not self._reused_soon(module):
            self.release(self._direct[id(module)])
        if torch.is_grad_enabled():
            outs = [t for t in tensors_in(output) if t.requires_grad]
            if outs:
                torch.autograd.graph.register_multi_grad_hook(
                    outs, lambda _grads: self._backward_fetch(module), mode="any"
                )

    def _backward_fetch(self, module: torch.nn.Module) -> None:
        self._end_with_backward()
        self.fetch(module, "backward")

    def _end_with_backward(self) -> None:
        """Have the running backward run ``after_backward`` when it ends, so that one the
        engine did not start (``loss.backward()``, ``engine.scale(loss).backward()``) does not
        leave what it (or a checkpoint recompute in it) gathered whole until the next forward.
        Not for a backward run inside a forward (``autograd.grad`` in a module): that forward's
        modules still hold their parameters."""
        if self._backward_end_queued or self._running or not in_backward():
            return
        self._backward_end_queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self.after_backward)

    def _on_grad(self, p: torch.Tensor) -> None:
        self._end_with_backward()
        if not getattr(p, "ds_grad_is_ready", True):
            return  # more contributions follow in this backward (tiled compute): keep summing
        s = shard_of(p)
        g = p.grad
        p.grad = None
        if g is None:
            return
        self.grads.add(s, g)
        del g  # the full gradient is in the bucket now
        if not self._in_use.get(id(p)):
            self.release([p])  # type: ignore[list-item]

    # -- gathering -----------------------------------------------------------------------------
    def _add_live(self, p: torch.nn.Parameter) -> None:
        if id(p) not in self._live:
            self._live[id(p)] = p
            self.acct.live_bytes += shard_of(p).full_bytes
            self.acct.bump()

    def _gather(
        self, params: Sequence[torch.nn.Parameter], async_op: bool = False, checked: bool = False
    ) -> PendingGather:
        if self.swapper is not None:
            for p in params:
                s = shard_of(p)
                if s.swapped:
                    self.swapper.swap_in(s)
        pending = self.coll.gather(params, async_op=async_op, checked=checked)
        for p in params:
            self._add_live(p)
            self.acct.fetched_numel += shard_of(p).numel
        if self.swapper is not None:
            for p in params:
                s = shard_of(p)
                if s.swapped:
                    self.swapper.drop(s)
        return pending

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Gather every parameter in one collective and keep all of them whole inside the block
        (per-module fetch and release become no-ops); release everything at exit."""
        self.gather_all()
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held:
                self.release_all()

    def fetch(self, module: torch.nn.Module, phase: str) -> None:
        """Make ``module``'s own parameters whole (called by the hooks)."""
        if self._held:
            return
        self.coll.context = f"{phase} of {type(module).__name__}"
        self._follow_trace(module, phase)
        own = self._direct.get(id(module), [])
        need = [p for p in own if shard_of(p).status is ParamStatus.NOT_AVAILABLE]
        numel = sum(shard_of(p).numel for p in need)
        if need:
            self._make_room(numel)
        # Full-size gradients count against the live budget like gathered parameters: those
        # waiting for or in reduction, and in backward the ones this module is about to
        # produce. Prefetching past them would stack the next modules' weights on top of the
        # step's largest transient (the output head's weight and gradient).
        held = numel + self.grads.held_numel
        if phase == "backward":
            held += sum(shard_of(p).numel for p in own if p.requires_grad)
        picked = self._prefetch_pick({id(p) for p in need}, held, phase)
        grouped = self.grads.grouped if need or picked else []
        if need or picked:
            # One order check covers the gradients reduced so far, this module's gather and the
            # prefetch behind it: one fingerprint all-reduce instead of three, verified before
            # any of them is waited on.
            states = grouped + [shard_of(p) for p in need + picked]
            self.coll.start_check(f"rs{len(grouped)}+gather{len(need)}", states)
            self.grads.launch(checked=True)
        if need:
            self._gather(need, checked=True).wait()
        for p in own:
            pending = shard_of(p).pending
            if pending is not None:
                pending.wait()
        if picked:
            self._gather(picked, async_op=True, checked=True)
        if self.swapper is not None:
            self._prefetch_reads()

    def _prefetch_reads(self) -> None:
        """Start NVMe reads of the shards the trace needs next (bounded by buffer_count)."""
        assert self.swapper is not None
        if self._trace is None:
            return
        want: list[ShardState] = []
        for m in self._trace[self._pos :]:
            for p in self._direct[id(m)]:
                s = shard_of(p)
                if s.swapped and s.status is ParamStatus.NOT_AVAILABLE:
                    want.append(s)
            if len(want) >= self.swapper.buffer_count:
                break
        self.swapper.prefetch(want)

    def gather_all(self, params: Iterable[torch.nn.Parameter] | None = None) -> None:
        """Gather the given (default: all) parameters in one collective, e.g. for generation."""
        todo = list(self.params if params is None else params)
        need = [p for p in todo if shard_of(p).status is ParamStatus.NOT_AVAILABLE]
        if need:
            self._gather(need).wait()
        for p in todo:
            if shard_of(p).pending is not None:
                shard_of(p).pending.wait()

    def release(self, params: Iterable[torch.nn.Parameter], keep_persistent: bool = True) -> None:
        if self._held:
            return
        for p in params:
            s = shard_of(p)
            if (keep_persistent and s.persistent) or self._in_use.get(id(p)):
                continue
            if s.pending is not None:
                s.pending.wait()
            if s.status is ParamStatus.AVAILABLE:
                self.coll.release_param(p)
            if self._live.pop(id(p), None) is not None:
                self.acct.live_bytes -= s.full_bytes

    def release_all(self) -> None:
        self.release(list(self._live.values()))

    def empty_cache(self) -> None:
        """Release every whole parameter, the persistent ones too: the next pass gathers what
        it uses again (and keeps the persistent ones from then on). Inside ``hold()`` and for
        parameters a running module uses, nothing is released."""
        self.release(self.params, keep_persistent=False)

    def _make_room(self, numel: int) -> None:
        limit = self.limits.max_live_parameters
        live = sum(shard_of(p).numel for p in self._live.values() if not shard_of(p).persistent)
        if live + numel <= limit:
            return
        for p in list(self._live.values()):
            s = shard_of(p)
            if s.persistent or self._in_use.get(id(p)) or s.pending is not None:
                continue
            self.release([p])
            live -= s.numel
            if live + numel <= limit:
                return

    # -- trace and prefetch --------------------------------------------------------------------
    def _follow_trace(self, module: torch.nn.Module, phase: str) -> None:
        if phase == "backward" and self._recording_backward is None:
            self._recording_backward = len(self._recording)
            if self.trim_heap:
                release_free_heap()  # the step's high-water mark is next (see stage3/heap.py)
        if len(self._recording) <= 16 * len(self._direct) + 64:
            self._recording.append(module)
        if self._trace is None:
            return
        if self._pos < len(self._trace) and self._trace[self._pos] is module:
            self._pos += 1
            return
        log.debug("stage3 module trace invalidated", position=self._pos)
        self._trace = None

    def _prefetch_pick(
        self, exclude: set[int], extra_live: int, phase: str
    ) -> list[torch.nn.Parameter]:
        """Parameters of the next modules along the trace to gather ahead, within the prefetch
        bucket and the live budget (``extra_live``: elements about to be gathered or held as
        full gradients).

        Forward prefetches only forward modules: between the last forward module and the first
        backward one lie the loss and the start of backward, the moment every activation is
        alive, and weights gathered early would sit through it. The first backward fetch
        prefetches the rest while the output layer's backward runs."""
        budget = self.limits.prefetch_bucket_size
        if self._trace is None or budget <= 0:
            return []
        sharded = [shard_of(p) for p in self._live.values() if not shard_of(p).persistent]
        ahead = sum(s.numel for s in sharded if s.status is ParamStatus.INFLIGHT)
        if ahead * 2 >= budget:
            # Top up only when half the bucket has been consumed: fewer, larger prefetches
            # (each costs an order check and a collective launch).
            return []
        live = sum(s.numel for s in sharded) + extra_live
        picked: list[torch.nn.Parameter] = []
        seen: set[int] = set(exclude)
        numel = 0
        end = len(self._trace)
        if phase == "forward" and self._pos <= self._trace_backward:
            end = self._trace_backward
        for m in self._trace[self._pos : end]:
            for p in self._direct[id(m)]:
                s = shard_of(p)
                if id(p) in seen or s.status is not ParamStatus.NOT_AVAILABLE:
                    continue
                if live + numel + s.numel > self.limits.max_live_parameters:
                    break
                seen.add(id(p))
                picked.append(p)
                numel += s.numel
            if numel >= budget:
                break
        return picked

    def _reused_soon(self, module: torch.nn.Module) -> bool:
        if self._trace is None:
            return False
        distance = 0
        for m in self._trace[self._pos :]:
            if m is module:
                return True
            distance += sum(shard_of(p).numel for p in self._direct[id(m)])
            if distance > self.limits.max_reuse_distance:
                return False
        return False

    # -- gradients -----------------------------------------------------------------------------
    def flush_grads(self) -> None:
        """Reduce every pending gradient and wait for all reductions."""
        self.grads.finish()

    def after_backward(self) -> None:
        """Finish a backward pass: reduce the last gradients, release everything, keep the trace."""
        self.flush_grads()
        self.coll.verify()
        for p in list(self._live.values()):
            if shard_of(p).pending is not None:
                shard_of(p).pending.wait()
        self._backward_end_queued = False
        self._in_use.clear()
        self._running.clear()  # modules an early-stopped checkpoint recompute left entered
        self.release_all()
        self.pool.collect()
        if self.swapper is not None:
            self.swapper.discard()  # the optimizer step rewrites the shards
        self.end_trace()

    def end_trace(self) -> None:
        fits = 0 < len(self._recording) <= 16 * len(self._direct) + 64
        if fits and (self._trace is None or self._pos != len(self._trace)):
            self._trace = self._recording
            rb = self._recording_backward
            self._trace_backward = len(self._recording) if rb is None else rb
        self._recording = []
        self._recording_backward = None
        self._pos = 0

    def refresh_persistent(self) -> None:
        """Re-gather the small always-whole parameters after their shards changed."""
        pers = [p for p in self.params if shard_of(p).persistent]
        if pers:
            for p in pers:
                self.coll.release_param(p)  # its buffer goes back to the pool
            self._gather(pers).wait()
