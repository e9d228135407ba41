"""Building blocks shared by the model families: linears, norms, activations, checkpoint access.

Each operation keeps the operation order of its transformers counterpart, so that fp32 results
agree to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ds.interfaces.errors import ConfigError

LinearFn = Callable[[torch.Tensor], torch.Tensor]
LinearFactory = Callable[[torch.Tensor, "torch.Tensor | None"], LinearFn]


class DenseLinear:
    __slots__ = ("bias", "weight")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


# Rows of x up to which the CPU head is taken as weight @ x^T. Past them F.linear is faster: for
# SmolLM2's 49152 x 576 head out of cache, one thread, AVX-512, F.linear against weight @ x^T
# took 28.7 / 35.0 / 40.8 / 57.1 ms against 40.6 / 42.7 / 59.2 / 95.9 at 33 / 48 / 64 / 128 rows.
HEAD_TRANSPOSED_MAX_ROWS = 32


class DenseHead(DenseLinear):
    """The output head: a [vocab, hidden] weight against a few rows. On CPU, up to
    :data:`HEAD_TRANSPOSED_MAX_ROWS` rows, the product is taken as weight @ x^T (MKL streams the
    large weight once in its stored layout: 21 against 26 ms for 16 rows of SmolLM2's 49152 x 576
    head, one thread, when it was measured), then laid out [rows, vocab] again."""

    __slots__ = ()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if (
            x.device.type != "cpu"
            or x.dim() != 2
            or not 2 <= x.shape[0] <= HEAD_TRANSPOSED_MAX_ROWS
        ):
            return F.linear(x, self.weight, self.bias)
        y = torch.mm(self.weight, x.t()).t().contiguous()
        return y if self.bias is None else y.add_(self.bias)


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    # transformers' NewGELUActivation, written out (F.gelu's tanh mode rounds differently).
    return (
        0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))
    )


def _gelu_fast(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "swish": F.silu,
    "gelu": F.gelu,
    "gelu_new": _gelu_new,
    "gelu_fast": _gelu_fast,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "relu": F.relu,
}


def activation(name: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    if name not in ACTIVATIONS:
        raise ConfigError(f"unsupported activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama's RMSNorm: normalise in fp32, cast back, then scale."""
    dtype = x.dtype
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: scale by ``1 + weight`` in fp32, then cast back."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * (1.0 + weight.float())).type_as(x)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, eps: float
) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), weight, bias, eps)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    return torch.tanh(x / cap) * cap


def required(config: dict[str, Any], *keys: str) -> list[Any]:
    """Values of ``keys`` (the first key of each ``a|b`` alternative that is present)."""
    out = []
    for key in keys:
        names = key.split("|")
        for name in names:
            if config.get(name) is not None:
                out.append(config[name])
                break
        else:
            raise ConfigError(f"model config.json lacks {names[0]!r}")
    return out


def max_context(config: dict[str, Any]) -> int | None:
    """Longest sequence the model serves: ``max_position_embeddings`` (or an alias), stretched by
    the rope scaling types that extend it from the trained length (vLLM's rule: dynamic and linear
    multiply it by ``factor``, yarn multiplies ``original_max_position_embeddings``; llama3 and
    longrope configs already state the extended length)."""
    base = None
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            base = value
            break
    scaling = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    rope_type = scaling.get("rope_type", scaling.get("type"))
    factor = scaling.get("factor")
    if base is None or not isinstance(factor, (int, float)) or factor <= 1:
        return base
    if rope_type in ("dynamic", "linear"):
        return int(base * factor)
    if rope_type == "yarn":
        orig = scaling.get("original_max_position_embeddings") or base
        return max(base, int(orig * factor))
    return base


class Weights:
    """A checkpoint's tensors (prefix stripped, cast and moved) taken out by name.

    ``finish()`` refuses tensors nobody took, so a checkpoint of another layout fails loudly.
    """

    def __init__(
        self,
        weights: dict[str, torch.Tensor],
        prefixes: tuple[str, ...],
        dtype: torch.dtype,
        device: torch.device | str,
        make: LinearFactory | None,
    ) -> None:
        self.w: dict[str, torch.Tensor] = {}
        for k, v in weights.items():
            for p in prefixes:
                if k.startswith(p):
                    k = k[len(p) :]
                    break
            self.w[k] = v.to(device=device, dtype=dtype)
        self.make: LinearFactory = make or DenseLinear

    def __contains__(self, name: str) -> bool:
        return name in self.w

    def take(self, name: str) -> torch.Tensor:
        try:
            return self.w.pop(name)
        except KeyError:
            raise ConfigError(f"checkpoint lacks weight {name!r}") from None

    def maybe(self, name: str) -> torch.Tensor | None:
        return self.w.pop(name, None)

    def linear(self, name: str, bias: bool | None = None) -> LinearFn:
        """``name.weight`` (and ``name.bias``: when ``bias`` is None, if present)."""
        weight = self.take(f"{name}.weight")
        b = self.take(f"{name}.bias") if bias else None
        if bias is None:
            b = self.maybe(f"{name}.bias")
        return self.make(weight, b)

    def dense(self, name: str, bias: bool | None = None) -> DenseLinear:
        """Like :meth:`linear` but never quantized (embeddings, output heads, routers)."""
        weight = self.take(f"{name}.weight")
        b = self.take(f"{name}.bias") if bias else None
        if bias is None:
            b = self.maybe(f"{name}.bias")
        return DenseLinear(weight, b)

    def finish(self) -> None:
        leftover = [k for k in self.w if "rotary_emb" not in k and not k.endswith(".inv_freq")]
        if leftover:
            raise ConfigError(f"unexpected weights in checkpoint: {leftover[:5]}")
