"""Tiled compute along the sequence: run a per-token function a slice of the sequence at a time
so its intermediate activations (an MLP's 4x-wide hidden state, a vocabulary-wide logits tensor)
exist for one slice only, in the forward and in the backward.

Each autograd function runs the forward slice by slice without building a graph and keeps only
its inputs; the backward recomputes one slice at a time with a graph, backpropagates that slice's
share of the incoming gradient, and writes the input's gradient into its slice of one buffer.

Parameters used by the function receive one gradient contribution per slice. Under ZeRO a
gradient hook reduces a parameter's gradient as soon as it arrives, so every slice but the last
marks the ``compute_params`` with ``ds_grad_is_ready = False`` (the ZeRO engines then leave the
gradient accumulating in ``param.grad``) and the last slice sets it back to True, so each
parameter is reduced once, with the sum over all slices.

Autograd sees only the tensor arguments, so the backward (and with it every parameter's
gradient) runs when the sliced input needs a gradient, as hidden states inside a model do.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch


def _mark_ready(params: Sequence[torch.Tensor] | None, ready: bool) -> None:
    for p in params or ():
        p.ds_grad_is_ready = ready  # type: ignore[attr-defined]


def _trainable(params: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    return [p for p in params or () if p.requires_grad]


def _leaf(t: torch.Tensor, requires_grad: bool) -> torch.Tensor:
    return t.detach().requires_grad_(requires_grad)


def _reduce(out: torch.Tensor, reduction: str | None) -> torch.Tensor:
    if reduction is None:
        return out
    if reduction == "mean":
        return out.mean()
    if reduction == "sum":
        return out.sum()
    raise ValueError(f"output_reduction={reduction!r}: use None, 'mean' or 'sum'")


def _full_grad(grad: torch.Tensor, shape: torch.Size, reduction: str | None) -> torch.Tensor:
    """The gradient of the unreduced output, given the gradient of the reduced one."""
    if reduction is None:
        return grad
    if reduction == "mean":
        grad = grad / max(math.prod(shape), 1)
    return grad.expand(shape)


def _backprop_row_slices(
    slices: Sequence[tuple[torch.Tensor, ...]],
    requires_grad: bool,
    params: list[torch.Tensor],
    run: Callable[[torch.Tensor, tuple[torch.Tensor, ...]], torch.Tensor],
    grad_of: Callable[[int, int], torch.Tensor],
) -> torch.Tensor | None:
    """Recompute ``run(rows, rest)`` slice by slice with a graph and backpropagate
    ``grad_of(first_row, n_rows)``; return the gradient of the concatenated rows (None when they
    need none). A block of rows is contiguous, so each slice's gradient accumulates in place in
    the block of the result it aliases."""
    first = slices[0][0]
    total = sum(s[0].shape[0] for s in slices)
    x_grad = (
        torch.zeros((total, *first.shape[1:]), dtype=first.dtype, device=first.device)
        if requires_grad
        else None
    )
    start = 0
    for i, (rows, *rest) in enumerate(slices):
        n = rows.shape[0]
        _mark_ready(params, i == len(slices) - 1)
        leaf = _leaf(rows, requires_grad)
        if x_grad is not None:
            leaf.grad = x_grad[start : start + n]
        with torch.enable_grad():
            out = run(leaf, tuple(rest))
        if out.requires_grad:
            torch.autograd.backward(out, grad_of(start, n).view_as(out))
        start += n
    return x_grad


class TiledMLP(torch.autograd.Function):
    """``fn(module, x)`` over slices of ``x`` along its second-to-last (sequence) dimension;
    ``x`` is ``[batch, seq, hidden]`` or ``[tokens, hidden]``. The output is the concatenation."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        fn: Callable[..., torch.Tensor],
        module: Any,
        x: torch.Tensor,
        shards: int,
        compute_params: Sequence[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        ctx.fn, ctx.module, ctx.shards = fn, module, shards
        ctx.compute_params = _trainable(compute_params)
        ctx.save_for_backward(x)
        with torch.no_grad():
            return torch.cat([fn(module, piece) for piece in x.chunk(shards, dim=-2)], dim=-2)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        (x,) = ctx.saved_tensors
        rows = x.detach().reshape(-1, x.shape[-1])
        grad_rows = grad.reshape(-1, x.shape[-1])
        x_grad = _backprop_row_slices(
            [(piece,) for piece in rows.chunk(ctx.shards, dim=0)],
            x.requires_grad,
            ctx.compute_params,
            lambda leaf, _rest: ctx.fn(ctx.module, leaf),
            lambda start, n: grad_rows[start : start + n],
        )
        x_grad = None if x_grad is None else x_grad.view(x.shape)
        return None, None, x_grad, None, None


class SequenceTiledCompute(torch.autograd.Function):
    """The general form behind :func:`sequence_tiled_compute` (positional, since autograd
    functions take no dicts): ``args`` are the values of ``keys_to_shard`` then of
    ``keys_to_pass``."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        fn: Callable[..., torch.Tensor],
        seqlen: int,
        shards: int,
        keys_to_shard: Sequence[str],
        keys_to_pass: Sequence[str],
        grad_requiring_tensor_key: str,
        compute_params: Sequence[torch.Tensor] | None,
        output_unshard_dimension: int,
        output_reduction: str | None,
        *args: Any,
    ) -> torch.Tensor:
        sharded = dict(zip(keys_to_shard, args[: len(keys_to_shard)]))
        passed = dict(zip(keys_to_pass, args[len(keys_to_shard) :]))
        step = max(1, math.ceil(seqlen / shards))
        bounds = [(a, min(a + step, seqlen)) for a in range(0, seqlen, step)]
        ctx.fn, ctx.sharded, ctx.passed, ctx.bounds = fn, sharded, passed, bounds
        ctx.key, ctx.dim, ctx.reduction = (
            grad_requiring_tensor_key,
            output_unshard_dimension,
            output_reduction,
        )
        ctx.compute_params = _trainable(compute_params)
        ctx.arg_index = [*keys_to_shard, *keys_to_pass].index(grad_requiring_tensor_key)
        ctx.n_args = len(args)
        with torch.no_grad():
            outs = [fn(**{k: v[:, a:b] for k, v in sharded.items()}, **passed) for a, b in bounds]
            # Along dimension 0 the per-slice outputs are stacked (one loss per slice).
            out = (
                torch.stack(outs)
                if output_unshard_dimension == 0
                else torch.cat(outs, dim=output_unshard_dimension)
            )
        ctx.out_shape = out.shape
        return _reduce(out, output_reduction)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        target = ctx.sharded[ctx.key]
        full = _full_grad(grad, ctx.out_shape, ctx.reduction)
        t_grad = torch.zeros_like(target) if target.requires_grad else None
        offset = 0
        for i, (a, b) in enumerate(ctx.bounds):
            _mark_ready(ctx.compute_params, i == len(ctx.bounds) - 1)
            pieces = {k: v[:, a:b] for k, v in ctx.sharded.items()}
            leaf = _leaf(pieces[ctx.key], target.requires_grad)
            pieces[ctx.key] = leaf
            with torch.enable_grad():
                out = ctx.fn(**pieces, **ctx.passed)
            if ctx.dim == 0:
                g = full[i]
            else:
                g = full.narrow(ctx.dim, offset, out.shape[ctx.dim])
                offset += out.shape[ctx.dim]
            if out.requires_grad:
                torch.autograd.backward(out, g.reshape(out.shape))
            if t_grad is not None and leaf.grad is not None:
                t_grad[:, a:b] = leaf.grad
        grads: list[Any] = [None] * (9 + ctx.n_args)
        grads[9 + ctx.arg_index] = t_grad
        return tuple(grads)


def sequence_tiled_compute(
    fn: Callable[..., torch.Tensor],
    seqlen: int,
    shards: int,
    kwargs_to_shard: dict[str, torch.Tensor],
    kwargs_to_pass: dict[str, Any],
    grad_requiring_tensor_key: str,
    compute_params: Sequence[torch.Tensor] | None = None,
    output_unshard_dimension: int = 1,
    output_reduction: str | None = "mean",
) -> torch.Tensor:
    """``fn(**kwargs_to_shard sliced on dimension 1, **kwargs_to_pass)`` over ``shards`` slices
    of ``seqlen`` tokens (the last may be shorter); the gradient flows back to
    ``kwargs_to_shard[grad_requiring_tensor_key]``. The slice outputs are concatenated along
    ``output_unshard_dimension`` (0: stacked, for a scalar per slice) and reduced by
    ``output_reduction`` (None, ``"mean"`` or ``"sum"``)."""
    return SequenceTiledCompute.apply(  # type: ignore[no-any-return]
        fn,
        seqlen,
        shards,
        list(kwargs_to_shard),
        list(kwargs_to_pass),
        grad_requiring_tensor_key,
        compute_params,
        output_unshard_dimension,
        output_reduction,
        *kwargs_to_shard.values(),
        *kwargs_to_pass.values(),
    )


class TiledFusedLogitsLoss(torch.autograd.Function):
    """A loss ``fn(module, x, y[, mask])`` over slices of the flattened ``[batch, seq]`` tokens,
    so the logits exist for one slice at a time; the per-slice losses are averaged
    (``"mean"``) or added (``"sum"``; prefer it when slices hold different numbers of counted
    tokens, and normalise outside).

    The backward recomputes each slice rather than keeping gradients from the forward: the
    parameter gradients are then produced inside the caller's backward, scaled by whatever the
    loss was multiplied with (loss scaling, gradient-accumulation division)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        fn: Callable[..., torch.Tensor],
        module: Any,
        x: torch.Tensor,
        y: torch.Tensor,
        mask: torch.Tensor | None,
        shards: int,
        compute_params: Sequence[torch.Tensor] | None,
        output_reduction: str = "mean",
    ) -> torch.Tensor:
        if output_reduction not in ("mean", "sum"):
            raise ValueError(f"output_reduction={output_reduction!r}: use 'mean' or 'sum'")
        if x.dim() < 2 or y.dim() < 2 or x.shape[:2] != y.shape[:2]:
            raise ValueError(
                f"x {tuple(x.shape)} and y {tuple(y.shape)} must both start with [batch, seq]"
            )
        if mask is not None and mask.shape != x.shape[:2]:
            raise ValueError(
                f"mask {tuple(mask.shape)} must be [batch, seq] = {tuple(x.shape[:2])}"
            )
        flat = [x.reshape(-1, *x.shape[2:]), y.reshape(-1, *y.shape[2:])]
        if mask is not None:
            flat.append(mask.reshape(-1))
        slices = list(zip(*(t.chunk(shards, dim=0) for t in flat)))
        ctx.fn, ctx.module, ctx.slices, ctx.reduction = fn, module, slices, output_reduction
        ctx.x_shape, ctx.x_requires_grad = x.shape, x.requires_grad
        ctx.compute_params = _trainable(compute_params)
        with torch.no_grad():
            losses = torch.stack([fn(module, *s) for s in slices])
        return _reduce(losses, output_reduction)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        per_slice = grad / len(ctx.slices) if ctx.reduction == "mean" else grad
        x_grad = _backprop_row_slices(
            ctx.slices,
            ctx.x_requires_grad,
            ctx.compute_params,
            lambda leaf, rest: ctx.fn(ctx.module, leaf, *rest),
            lambda _start, _n: per_slice,
        )
        x_grad = None if x_grad is None else x_grad.view(ctx.x_shape)
        return None, None, x_grad, None, None, None, None, None


__all__ = ["SequenceTiledCompute", "TiledFusedLogitsLoss", "TiledMLP", "sequence_tiled_compute"]
