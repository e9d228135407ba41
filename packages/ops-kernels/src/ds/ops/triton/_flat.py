"""What the Triton optimizer steps share: argument checks and the launch on the tensors' device.

Every step is one kernel launch over the whole flat buffer (a 1-D grid of ``BLOCK``-element
programs, 64-bit offsets), never a Python loop over chunks.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from ds.interfaces.errors import KernelError

BLOCK = 1024
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def step_like(
    reference: Callable[..., None],
) -> Callable[[Callable[[Any], None]], Callable[..., None]]:
    """Make a Triton step take ``reference``'s arguments (names, order, defaults): the body gets
    them as attributes of one namespace, so a kernel and its definition share one argument list.
    """
    sig = inspect.signature(reference)

    def wrap(body: Callable[[Any], None]) -> Callable[..., None]:
        @functools.wraps(body)
        def step(*args: Any, **kwargs: Any) -> None:
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            body(SimpleNamespace(**bound.arguments))

        step.__signature__ = sig  # type: ignore[attr-defined]
        return step

    return wrap


def kernels(module: str, reference: str) -> Any:
    """Import ``ds.ops.triton.<module>`` (needs triton), or a KernelError naming the fallback."""
    try:
        import importlib

        return importlib.import_module(f"ds.ops.triton.{module}")
    except ImportError as e:
        raise KernelError(
            f"the Triton step in ds.ops.triton.{module} needs the 'triton' package "
            f"(pip install 'ds-ops-kernels[triton]'); {reference} is the pure-torch equivalent"
        ) from e


def check(
    what: str,
    params: torch.Tensor,
    low_precision_out: torch.Tensor | None = None,
    **others: torch.Tensor,
) -> None:
    """Flat, contiguous, same-device, same-size buffers of supported dtypes, none requiring grad."""
    if params.dtype not in DTYPES:
        raise KernelError(f"params has dtype {params.dtype}; use float32, bfloat16 or float16")
    named = dict(others)
    if low_precision_out is not None:
        if params.dtype != torch.float32 or low_precision_out.dtype not in DTYPES[1:]:
            raise KernelError(
                "low_precision_out is a bfloat16 or float16 copy of float32 params; got params "
                f"{params.dtype} and low_precision_out {low_precision_out.dtype}"
            )
        named["low_precision_out"] = low_precision_out
    for name, t in named.items():
        if t.numel() != params.numel():
            raise KernelError(f"{name} has {t.numel()} elements but params has {params.numel()}")
        if t.device != params.device:
            raise KernelError(f"{name} is on {t.device} but params is on {params.device}")
        if t.dtype not in DTYPES:
            raise KernelError(f"{name} has dtype {t.dtype}; use float32, bfloat16 or float16")
    for name, t in {"params": params, **named}.items():
        if not t.is_contiguous():
            raise KernelError(f"{name} is not contiguous; call .contiguous() on it first")
        if t.requires_grad:
            raise KernelError(f"{name} requires grad; pass t.detach()")
    if params.device.type == "cpu" and not interpreted():
        raise KernelError(
            f"the Triton {what} step runs on GPU tensors; on CPU use ds.ops.cpu_optim "
            "(or set TRITON_INTERPRET=1 to interpret the kernel)"
        )


@contextlib.contextmanager
def on_device(t: torch.Tensor) -> Iterator[None]:
    """Launch on ``t``'s device: Triton launches on the current device, which may be another."""
    if t.device.type == "cuda" and t.device.index is not None:
        with torch.cuda.device(t.device.index):
            yield
    else:
        yield


def launch(kernel: Callable[..., Any], params: torch.Tensor, *args: Any, **meta: Any) -> None:
    n = params.numel()
    grid = ((n + BLOCK - 1) // BLOCK,)
    with on_device(params):
        kernel[grid](*args, n, BLOCK=BLOCK, **meta)  # type: ignore[index]


def run(what: str, a: Any, states: tuple[str, ...], *scalars: Any, **meta: Any) -> None:
    """Check and step the buffers of ``a`` (params, grads, the ``states`` named, optional
    low-precision copy) with the kernel of ``what`` (``Adagrad``: ``adagrad_kernels.
    adagrad_kernel``), its scalar arguments after the buffers."""
    params, lp = a.params, a.low_precision_out
    named = {n: getattr(a, n) for n in states}
    check(what, params, lp, grads=a.grads, **named)
    if params.numel() == 0:
        return
    stem = what.lower()
    k = kernels(f"{stem}_kernels", f"ds.ops.reference.{stem}_step")
    out = lp if lp is not None else params
    kernel = getattr(k, f"{stem}_kernel")
    launch(
        kernel,
        params,
        params,
        a.grads,
        *named.values(),
        out,
        *scalars,
        HAS_LP=lp is not None,
        **meta,
    )
