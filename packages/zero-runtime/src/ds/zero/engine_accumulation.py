"""Who ends a gradient-accumulation window, and when the window's gradients are reduced.

* Managed (the default; DeepSpeed's ``managed_gradient_accumulation: true``): the engine counts
  micro-steps and ``step()`` updates the weights on every ``gradient_accumulation_steps``-th call;
  ``set_gradient_accumulation_boundary`` moves the count for loops that decide the window.
* Unmanaged (``managed_gradient_accumulation: false``): the caller owns the window. Every
  ``step()`` ends one, however many ``backward()`` calls it had: stages 0-1 accumulate locally and
  reduce once in ``step()``, stages 2-3 reduce into their partitions every backward (as they do in
  managed mode), and ``global_samples`` advances by the micro-batches actually run.

Two context managers run backward passes without communication: ``no_sync()`` (stages 0-1, where
whole gradients live on every rank anyway) and ``coalesce_grad_reduction()`` (stages 0-3: the
backward passes inside accumulate locally, at stages 2-3 whole gradients, and the block's exit
reduces them once). Gradients a ``no_sync()`` block leaves unreduced are reduced by the next
synchronised backward, or by ``step()`` when it ends the window.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ds.interfaces.errors import ConfigError, DsError

if TYPE_CHECKING:
    from ds.zero.config import DsConfig, ResolvedConfig


class AccumulationConfigError(ConfigError, AssertionError):
    """``managed_gradient_accumulation: false`` combined with a setting it cannot serve
    (DeepSpeed asserts, hence AssertionError)."""


class AccumulationCallError(DsError, AssertionError):
    """A call that would break the accumulation window: ``step()`` inside a block without
    communication, nested blocks, a boundary set by hand in unmanaged mode (DeepSpeed asserts)."""


class AccumulationUnsupportedError(DsError, NotImplementedError):
    """``coalesce_grad_reduction()`` where the engine does not drive the backward passes."""


def check_accumulation_mode(cfg: DsConfig, pipeline: bool) -> None:
    """Refuse, before anything is built or communicated, what unmanaged accumulation cannot
    serve (the same combinations DeepSpeed refuses)."""
    if cfg.managed_gradient_accumulation is not False:
        return
    zero = cfg.zero_optimization
    if zero.stage < 2 and zero.overlap:
        raise AccumulationConfigError(
            "managed_gradient_accumulation=false supports zero_optimization.overlap_comm only "
            f"with ZeRO stage 2 or 3: at stage {zero.stage} the gradients are reduced once, in "
            "step(), so there is no backward pass to overlap it with; set overlap_comm to false"
        )
    if pipeline:
        raise AccumulationConfigError(
            "managed_gradient_accumulation=false is not supported with pipeline parallelism: "
            "train_batch() runs each step's gradient_accumulation_steps micro-batches itself; "
            "leave managed_gradient_accumulation at true"
        )
    if cfg.compile is not None and cfg.compile.deepcompile:
        raise AccumulationConfigError(
            "managed_gradient_accumulation=false is not supported with compile.deepcompile; "
            "drop one of them"
        )


class EngineAccumulation:
    """Mixed into :class:`ds.zero.engine.ZeroEngine`."""

    # True for an engine that drives a pipeline schedule (DeepSpeed's attribute name).
    pipeline_parallelism: bool = False

    config: ResolvedConfig
    strategy: Any
    micro_steps: int
    dp_size: int

    def _init_accumulation(self) -> None:
        self._no_sync = False
        self._coalescing = False
        self._stepping = False  # inside step(): the unmanaged window's boundary
        # set_gradient_accumulation_boundary's answer for the micro-steps up to the next step():
        # the counter alone cannot make a micro-step a non-boundary when every one is (GAS 1).
        self._boundary_next: bool | None = None
        self._window_backwards = 0  # backward() calls since the last step() (unmanaged)

    def managed_gradient_accumulation(self) -> bool:
        """False when the caller's ``step()`` ends every accumulation window."""
        return self.config.managed_gradient_accumulation

    def is_gradient_accumulation_boundary(self) -> bool:
        if not self.managed_gradient_accumulation():
            return self._stepping
        if self._boundary_next is not None:
            return self._boundary_next
        return self._counted_boundary()

    def _counted_boundary(self) -> bool:
        return (self.micro_steps + 1) % self.config.gradient_accumulation_steps == 0

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """Make the micro-steps up to the next ``step()`` end (or not end) an accumulation window.
        For training loops that decide the window themselves (a framework steps on an epoch's
        last batch, or after resuming mid-window; several backward passes, then one step): the
        micro-step counter also moves so the engine's boundary falls on the loop's after it."""
        if not self.managed_gradient_accumulation():
            raise AccumulationCallError(
                "set_gradient_accumulation_boundary() is refused with "
                "managed_gradient_accumulation=false: every step() ends the window there; drop "
                "the call, or set managed_gradient_accumulation to true"
            )
        self._boundary_next = bool(is_boundary)
        if self._counted_boundary() == is_boundary:
            return
        gas = self.config.gradient_accumulation_steps
        if is_boundary:
            self.micro_steps = (self.micro_steps // gas + 1) * gas - 1
        else:
            self.micro_steps += 1

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate gradients locally without communication (stages
        0-1); the next synchronised backward, or ``step()``, reduces them."""
        if self.config.stage >= 2:
            raise AccumulationCallError(
                f"no_sync() is refused at ZeRO stage {self.config.stage}: gradients are "
                "partitioned as backward produces them, so no rank keeps a whole one to "
                "accumulate; use engine.coalesce_grad_reduction() to reduce several backward "
                "passes once, or ZeRO stage 0-1"
            )
        if self._no_sync or self._coalescing:
            raise AccumulationCallError(
                "no_sync() inside no_sync() or coalesce_grad_reduction() is refused: the inner "
                "block's exit would end the outer one's; use one block"
            )
        self._no_sync = True
        try:
            yield
        finally:
            self._no_sync = False

    @contextlib.contextmanager
    def coalesce_grad_reduction(self) -> Iterator[None]:
        """Backward passes inside accumulate their gradients locally (whole ones, at stages 2-3
        too); leaving the block reduces them once, as one window's reduction. Call ``step()``
        after the block. An exception inside leaves them unreduced (no communication from a
        failing rank); ``step()`` or ``zero_grad()`` settles them."""
        if not self.managed_gradient_accumulation():
            raise AccumulationCallError(
                "coalesce_grad_reduction() is refused with managed_gradient_accumulation=false: "
                "there step() already reduces each window once at stages 0-1; drop the block"
            )
        if self.pipeline_parallelism:
            raise AccumulationUnsupportedError(
                "coalesce_grad_reduction() is not supported under pipeline parallelism: "
                "train_batch() runs the backward passes and their reduction itself"
            )
        if self._no_sync or self._coalescing:
            raise AccumulationCallError(
                "coalesce_grad_reduction() cannot be nested inside no_sync() or another "
                "coalesce_grad_reduction(); use one block"
            )
        self._coalescing = True
        try:
            yield
        except BaseException:
            self._coalescing = False
            raise
        self._coalescing = False
        self.strategy.reduce_deferred()

    # -- what backward() and step() ask ----------------------------------------------------------
    def _begin_backward(self) -> None:
        """Before a backward: tell the strategy whether it ends a window and may communicate."""
        if self.managed_gradient_accumulation():
            # Inside coalesce_grad_reduction() the block's exit ends the window.
            boundary = self.is_gradient_accumulation_boundary() and not self._coalescing
        else:
            boundary = False  # step() ends it
            self._window_backwards += 1
        self.strategy.begin_micro_step(boundary, self._no_sync or self._coalescing)

    def _check_step(self) -> None:
        if self._no_sync or self._coalescing:
            raise AccumulationCallError(
                "step() inside no_sync() or coalesce_grad_reduction() is refused: the gradients "
                "of the backward passes inside are not reduced yet; call step() after the block"
            )

    def _take_window_end(self) -> bool:
        """Whether this ``step()`` ends the window; a boundary set by hand is used up."""
        ends = not self.managed_gradient_accumulation() or self.is_gradient_accumulation_boundary()
        self._boundary_next = None
        return ends

    @contextlib.contextmanager
    def _window_end(self) -> Iterator[None]:
        """Around the update of a ``step()`` that ends a window."""
        self._stepping = True
        try:
            self.strategy.reduce_deferred()
            yield
        finally:
            self._stepping = False

    def _take_window_samples(self) -> int:
        """Samples the window that ends now trained on (over the data-parallel ranks)."""
        if self.managed_gradient_accumulation():
            return self.config.train_batch_size
        backwards, self._window_backwards = self._window_backwards, 0
        return self.config.train_micro_batch_size_per_gpu * self.dp_size * backwards
