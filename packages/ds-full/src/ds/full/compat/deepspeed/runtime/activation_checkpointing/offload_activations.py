"""``deepspeed.runtime.activation_checkpointing.offload_activations``: offload the hidden states
entering each checkpointed transformers layer to host memory (ds.zero's
:class:`~ds.zero.activation_checkpointing.offload.MarkedActivationOffload`).

While a :class:`CheckpointHiddenStatesOffload` context is active, every transformers
``GradientCheckpointingLayer`` called in training with gradient checkpointing on marks its
hidden states (the first positional argument) for offload; the layer class is restored when the
last active context exits. Host buffers are pinned through the accelerator's ``pin_memory``.
"""

from __future__ import annotations

import importlib.util
import threading
from typing import Any

import torch

from ds.zero.activation_checkpointing.offload import MarkedActivationOffload, OffloadStats

CheckpointActivationOffloadStats = OffloadStats

_LOCK = threading.Lock()
_LOCAL = threading.local()
_patch: dict[str, Any] = {"users": 0, "wrapper": None, "owned": None}


def _stack() -> list[CheckpointHiddenStatesOffload]:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack  # type: ignore[no-any-return]


def _install_marker() -> None:
    from transformers import GradientCheckpointingLayer

    original = GradientCheckpointingLayer.__call__

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        manager = _stack()[-1] if _stack() else None
        hidden = args[0] if args else None
        marked = (
            manager is not None
            and self.training
            and torch.is_grad_enabled()
            and getattr(self, "gradient_checkpointing", False)
            and torch.is_tensor(hidden)
        )
        if marked:
            manager.mark(hidden)  # type: ignore[union-attr]
        try:
            return original(self, *args, **kwargs)
        finally:
            if marked:  # a mark the checkpoint did not use must not outlive the id it names
                manager.consume_mark(hidden)  # type: ignore[union-attr]

    _patch["owned"] = GradientCheckpointingLayer.__dict__.get("__call__")
    _patch["wrapper"] = call
    GradientCheckpointingLayer.__call__ = call


def _remove_marker() -> None:
    from transformers import GradientCheckpointingLayer

    if GradientCheckpointingLayer.__dict__.get("__call__") is _patch["wrapper"]:
        if _patch["owned"] is None:
            del GradientCheckpointingLayer.__call__
        else:
            GradientCheckpointingLayer.__call__ = _patch["owned"]
    _patch["wrapper"] = _patch["owned"] = None


def _transformers_has_layer() -> bool:
    if importlib.util.find_spec("transformers") is None:
        return False
    import transformers

    return hasattr(transformers, "GradientCheckpointingLayer")


class CheckpointHiddenStatesOffload(MarkedActivationOffload):
    """DeepSpeed's signature. ``max_fwd_stash_count`` is accepted and has no effect: ds keeps an
    offloaded tensor's device memory alive exactly until its copy has been read
    (``record_stream``), so there is no stash to size."""

    def __init__(
        self,
        use_pin_memory: bool = True,
        use_streams: bool = True,
        min_offload_bytes: int = 1024,
        max_fwd_stash_count: int = 2,
        max_cpu_buffer_pool_count: int = 64,
        keep_last_count: int = 1,
    ) -> None:
        if max_fwd_stash_count < 0:
            raise ValueError(f"max_fwd_stash_count must be >= 0, got {max_fwd_stash_count}")
        super().__init__(
            use_pin_memory=use_pin_memory,
            use_streams=use_streams,
            min_offload_bytes=min_offload_bytes,
            keep_last_count=keep_last_count,
            max_cpu_buffer_pool_count=max_cpu_buffer_pool_count,
            pin=_pin,
        )

    # DeepSpeed's names for the host-buffer helpers
    def _empty_cpu_like(self, t: torch.Tensor) -> Any:
        return self.host_buffer(t)

    def _buffer_key(self, t: torch.Tensor) -> Any:
        return self.buffer_key(t)

    def _consume_mark(self, t: torch.Tensor) -> bool:
        return self.consume_mark(t)

    def __enter__(self) -> CheckpointHiddenStatesOffload:
        if self in _stack():
            raise RuntimeError(
                "CheckpointHiddenStatesOffload is not re-entrant; use a separate instance to nest"
            )
        with _LOCK:
            if _patch["users"] == 0 and _transformers_has_layer():
                _install_marker()
            _patch["users"] += 1
        _stack().append(self)
        try:
            super().__enter__()
        except BaseException:
            self._leave()
            raise
        return self

    def _leave(self) -> None:
        if self in _stack():
            _stack().remove(self)
        with _LOCK:
            _patch["users"] -= 1
            if _patch["users"] == 0 and _patch["wrapper"] is not None:
                _remove_marker()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            self._leave()


def _pin(host: torch.Tensor) -> torch.Tensor:
    from ds.full.compat.deepspeed.accelerator import get_accelerator

    return get_accelerator().pin_memory(host, make_copy=False)


# Same arguments, same result: a new context manager.
get_checkpoint_hidden_states_offloading_ctx_manager = CheckpointHiddenStatesOffload


__all__ = [
    "CheckpointActivationOffloadStats",
    "CheckpointHiddenStatesOffload",
    "get_checkpoint_hidden_states_offloading_ctx_manager",
]
