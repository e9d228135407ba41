"""Argument checks shared by the functional kernels and the optimizer classes.

Single tensors travel to the native module through DLPack, which checks device, layout, sizes and
dtypes itself. Lists travel as address lists (one DLPack exchange per tensor would cost more than a
small step), so every tensor of a list is checked here first; the Python objects are held for the
whole call, so the addresses stay valid.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ds.interfaces.errors import ConfigError, KernelError

if TYPE_CHECKING:
    import torch

# dtype codes of the native module (ds::optim::DType)
F32, BF16, F16, NONE = 0, 1, 2, 3
_NAMES = {F32: "float32", BF16: "bfloat16", F16: "float16", NONE: "none"}


def check_nonneg(name: str, value: float) -> float:
    """``value`` as a float; ConfigError unless it is finite and >= 0 (NaN and inf included: an
    update with either would silently turn every parameter into NaN)."""
    v = float(value)
    if not (math.isfinite(v) and v >= 0.0):
        raise ConfigError(f"{name} = {value} must be >= 0 and finite")
    return v


def check_beta(name: str, value: float) -> float:
    """``value`` as a float; ConfigError unless it lies in [0, 1)."""
    v = float(value)
    if not 0.0 <= v < 1.0:  # also false for NaN
        raise ConfigError(f"{name} = {value} is outside [0, 1); use e.g. betas=(0.9, 0.999)")
    return v


def check_betas(betas: tuple[float, float]) -> tuple[float, float]:
    try:
        b1, b2 = betas
    except (TypeError, ValueError):
        raise ConfigError(f"betas must be two numbers, e.g. (0.9, 0.999), got {betas!r}") from None
    return check_beta("betas[0]", b1), check_beta("betas[1]", b2)


def dtype_codes() -> dict[object, int]:
    import torch

    return {torch.float32: F32, torch.bfloat16: BF16, torch.float16: F16}


def supported(param: int, grad: int, state: int, lowp: int) -> bool:
    if param == F32:
        return grad == F32 and state == F32 and lowp in (NONE, BF16, F16)
    return grad in (F32, param) and state in (F32, param) and lowp == NONE


def unsupported_message(param: int, grad: int, state: int, lowp: int) -> str:
    return (
        f"unsupported dtypes: params {_NAMES[param]}, grads {_NAMES[grad]}, state "
        f"{_NAMES[state]}, low_precision_out {_NAMES[lowp]}. fp32 params take fp32 grads and "
        "state (low-precision copy bf16/fp16 optional); bf16/fp16 params take grads and state of "
        "their own dtype or fp32, no copy"
    )


def diagnose(lists: dict[str, Sequence[torch.Tensor]]) -> KernelError | None:
    """The first problem among ``lists`` (params first) as a KernelError, or None."""
    import torch

    codes = dtype_codes()
    params = lists.get("params", ())
    for name, tensors in lists.items():
        if len(tensors) != len(params):
            return KernelError(
                f"{name} has {len(tensors)} tensors but params has {len(params)}; pass one per "
                "parameter"
            )
        first: object = None
        for i, t in enumerate(tensors):
            where = f"{name}[{i}]"
            if not isinstance(t, torch.Tensor):
                return KernelError(f"{where} is a {type(t).__name__}, not a torch.Tensor")
            if t.requires_grad:
                return KernelError(
                    f"{where} requires grad; the kernels update tensors in place outside "
                    "autograd: pass t.detach() (the optimizer classes do this for you)"
                )
            if t.device.type != "cpu":
                return KernelError(
                    f"{where} is on device {t.device}; the native optimizer kernels run on CPU "
                    "memory only (move it with .cpu(), or use a GPU kernel provider)"
                )
            if t.layout != torch.strided:
                return KernelError(f"{where} has layout {t.layout}; only dense tensors")
            if not t.is_contiguous():
                return KernelError(f"{where} is not contiguous; call .contiguous() on it first")
            if t.dtype not in codes:
                return KernelError(f"{where} has dtype {t.dtype}; use float32, bfloat16 or float16")
            if name == "low_precision_out" and t.dtype == torch.float32:
                return KernelError("low_precision_out must be bfloat16 or float16, not float32")
            if i == 0:
                first = t.dtype
            elif t.dtype != first:
                return KernelError(
                    f"{where} is {t.dtype} but {name}[0] is {first}; one call takes one dtype "
                    "per buffer kind"
                )
            if t.numel() != params[i].numel():
                return KernelError(
                    f"{where} has {t.numel()} elements but params[{i}] has {params[i].numel()}"
                )
    return None


def addresses(
    lists: dict[str, Sequence[torch.Tensor]],
) -> tuple[list[int], dict[str, list[int]], list[int]]:
    """Check every tensor of ``lists`` and return (dtype codes, addresses per list, numels)."""
    try:
        return _addresses(lists)
    except (AttributeError, TypeError, RuntimeError) as e:  # not tensors, sparse layouts, ...
        raise diagnose(lists) or KernelError(f"invalid kernel arguments: {e}") from e


def _addresses(
    lists: dict[str, Sequence[torch.Tensor]],
) -> tuple[list[int], dict[str, list[int]], list[int]]:
    codes = dtype_codes()
    params = lists["params"]
    numels = [p.numel() for p in params]
    ptrs: dict[str, list[int]] = {}
    kinds: dict[str, int] = {}
    ok = True
    for name, tensors in lists.items():
        if len(tensors) != len(params):
            ok = False
            break
        out: list[int] = []
        kind = codes.get(tensors[0].dtype, -1) if len(tensors) else F32
        for t, n in zip(tensors, numels, strict=True):
            if (
                codes.get(t.dtype, -2) != kind
                or not t.is_cpu
                or t.requires_grad
                or not t.is_contiguous()
                or t.numel() != n
            ):
                ok = False
                break
            out.append(t.data_ptr())
        if not ok:
            break
        ptrs[name] = out
        kinds[name] = kind
    if not ok:
        raise diagnose(lists) or KernelError("invalid kernel arguments")
    state = kinds.get("exp_avg", kinds.get("state_sum", F32))
    if "exp_avg_sq" in kinds and kinds["exp_avg_sq"] != state:
        raise KernelError("exp_avg_sq and exp_avg must share a dtype")
    types = [kinds["params"], kinds["grads"], state, kinds.get("low_precision_out", NONE)]
    if types[3] == F32:
        raise KernelError("low_precision_out must be bfloat16 or float16, not float32")
    if not supported(*types):
        raise KernelError(unsupported_message(*types))
    return types, ptrs, numels
