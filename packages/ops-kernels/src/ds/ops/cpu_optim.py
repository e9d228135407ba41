"""Functional fused CPU optimizer steps on flat buffers or lists of them, updated in place.

Each call takes either single tensors or equal-length sequences of tensors (one per parameter) and
makes one native call for the whole list: the elements of all tensors are spread over the kernel
thread pool (sized from ``torch.get_num_threads()``) with the GIL released.

Dtypes: fp32 params take fp32 grads and fp32 state and may write a bf16/fp16 copy of the updated
params into ``low_precision_out``; bf16/fp16 params take grads and state of their own dtype or
fp32. Tensors must be contiguous CPU tensors that do not require grad (pass ``p.detach()``).
Anything else raises :class:`~ds.interfaces.errors.KernelError` naming the tensor and the fix.
Hyperparameters are checked before any tensor is touched: ``lr``, ``eps`` and ``weight_decay``
must be finite and >= 0 and the betas in [0, 1), else :class:`~ds.interfaces.errors.ConfigError`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Union

from ds.interfaces.errors import KernelError
from ds.ops._checks import F32, addresses, check_beta, check_nonneg, diagnose
from ds.ops._native import native, sync_threads

if TYPE_CHECKING:
    import torch

TensorOrList = Union["torch.Tensor", Sequence["torch.Tensor"]]

__all__ = ["adagrad_step", "adam_step", "lion_step", "stream_4r3w"]


def _nonneg(**values: float) -> list[float]:
    return [check_nonneg(k, v) for k, v in values.items()]


def _lists(
    named: dict[str, TensorOrList], low: TensorOrList | None
) -> tuple[bool, dict[str, Sequence[torch.Tensor]]]:
    """(all single tensors?, name -> list of tensors)."""
    import torch

    single = all(isinstance(v, torch.Tensor) for v in named.values())
    out: dict[str, Sequence[torch.Tensor]] = {}
    for k, v in named.items():
        out[k] = [v] if isinstance(v, torch.Tensor) else v
    if low is not None:
        single = single and isinstance(low, torch.Tensor)
        out["low_precision_out"] = [low] if isinstance(low, torch.Tensor) else low
    return single, out


def _run(
    single: bool,
    lists: dict[str, Sequence[torch.Tensor]],
    dlpack_fn: Callable[..., None],
    ptrs_fn: Callable[..., None],
    order: Sequence[str],
    *hyper: object,
    step: int | None = None,
) -> None:
    sync_threads()
    low = lists.get("low_precision_out")
    if single:
        # DLPack checks the rest; autograd state is invisible to it, so check that here.
        for name, ts in lists.items():
            if ts[0].requires_grad:
                raise diagnose({name: ts, "params": lists["params"]}) or KernelError(name)
        args = [lists[k] for k in order]
        head = (*args, low) if step is None else (*args, low, step)
        try:
            dlpack_fn(*head, *hyper)
        except (TypeError, ValueError) as e:
            raise (diagnose(lists) or KernelError(str(e))) from e
        return
    types, ptrs, numels = addresses(lists)
    lowp = ptrs.get("low_precision_out", [])
    head2 = (types, *(ptrs[k] for k in order), lowp, numels)
    if step is not None:
        head2 = (*head2, step)
    try:
        ptrs_fn(*head2, *hyper)
    except ValueError as e:
        raise KernelError(str(e)) from e


def adam_step(
    params: TensorOrList,
    grads: TensorOrList,
    exp_avg: TensorOrList,
    exp_avg_sq: TensorOrList,
    *,
    step: int,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.0,
    adamw_mode: bool = True,
    bias_correction: bool = True,
    low_precision_out: TensorOrList | None = None,
) -> None:
    """One AdamW step (``adamw_mode=False``: Adam with L2 decay in the gradient); ``step`` >= 1."""
    lr, eps, weight_decay = _nonneg(lr=lr, eps=eps, weight_decay=weight_decay)
    beta1, beta2 = check_beta("beta1", beta1), check_beta("beta2", beta2)
    order = ("params", "grads", "exp_avg", "exp_avg_sq")
    single, lists = _lists(
        dict(zip(order, (params, grads, exp_avg, exp_avg_sq))), low_precision_out
    )
    c = native()
    _run(
        single,
        lists,
        c.adam_step,
        c.adam_step_ptrs,
        order,
        float(lr),
        float(beta1),
        float(beta2),
        float(eps),
        float(weight_decay),
        bool(adamw_mode),
        bool(bias_correction),
        step=int(step),
    )


def adagrad_step(
    params: TensorOrList,
    grads: TensorOrList,
    state_sum: TensorOrList,
    *,
    lr: float,
    eps: float = 1e-10,
    weight_decay: float = 0.0,
    low_precision_out: TensorOrList | None = None,
) -> None:
    """One Adagrad step (torch.optim.Adagrad semantics; fold any lr decay into ``lr``)."""
    lr, eps, weight_decay = _nonneg(lr=lr, eps=eps, weight_decay=weight_decay)
    order = ("params", "grads", "state_sum")
    single, lists = _lists(dict(zip(order, (params, grads, state_sum))), low_precision_out)
    c = native()
    _run(
        single,
        lists,
        c.adagrad_step,
        c.adagrad_step_ptrs,
        order,
        float(lr),
        float(eps),
        float(weight_decay),
    )


def lion_step(
    params: TensorOrList,
    grads: TensorOrList,
    exp_avg: TensorOrList,
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.99,
    weight_decay: float = 0.0,
    low_precision_out: TensorOrList | None = None,
) -> None:
    """One Lion step: p = p*(1 - lr*wd) - lr*sign(b1*m + (1-b1)*g); m = b2*m + (1-b2)*g."""
    lr, weight_decay = _nonneg(lr=lr, weight_decay=weight_decay)
    beta1, beta2 = check_beta("beta1", beta1), check_beta("beta2", beta2)
    order = ("params", "grads", "exp_avg")
    single, lists = _lists(dict(zip(order, (params, grads, exp_avg))), low_precision_out)
    c = native()
    _run(
        single,
        lists,
        c.lion_step,
        c.lion_step_ptrs,
        order,
        float(lr),
        float(beta1),
        float(beta2),
        float(weight_decay),
    )


def stream_4r3w(a: TensorOrList, b: TensorOrList, c: TensorOrList, d: TensorOrList) -> None:
    """Bandwidth reference with an fp32 Adam step's traffic: reads a, b, c, d; writes a, c, d.

    Single tensors, or equal-length lists (one entry per tensor, like an optimizer step's params,
    grads, exp_avg, exp_avg_sq): a list runs as one native call spread over the pool the way a
    step on that list is, so it measures the floor of the same memory layout.
    """
    import torch

    sync_threads()
    if all(isinstance(x, torch.Tensor) for x in (a, b, c, d)):
        try:
            native().stream_4r3w(a, b, c, d)
        except (TypeError, ValueError) as e:
            raise KernelError(f"stream_4r3w: {e}") from e
        return
    order = ("params", "grads", "exp_avg", "exp_avg_sq")
    _, lists = _lists(dict(zip(order, (a, b, c, d))), None)
    if len({getattr(t, "dtype", None) for ts in lists.values() for t in ts}) > 1:
        raise KernelError("stream_4r3w: all four lists must share one dtype")
    types, ptrs, numels = addresses(lists)
    elem = 4 if types[0] == F32 else 2
    try:
        native().stream_4r3w_ptrs(elem, *(ptrs[k] for k in order), numels)
    except ValueError as e:
        raise KernelError(f"stream_4r3w: {e}") from e
