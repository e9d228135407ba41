"""Muon (momentum orthogonalized by a Newton-Schulz iteration) for hidden weight matrices, with
AdamW for every other parameter, chosen per parameter group by its ``use_muon`` key.

Muon's update is a property of the whole matrix, so it cannot run on a flat ZeRO partition: a
ZeRO stage hands each Muon group's flat master over with a :class:`FlatMatrices` layout
(:meth:`Muon.bind_flat_layout`) saying where each matrix sits and how to gather the partitions,
and the step gathers the gradient and the momentum, orthogonalizes every matrix whole, and
applies this rank's slice of the result. The momentum stays partitioned like the master weights.

The Newton-Schulz iteration is Keller Jordan's quintic (coefficients 3.4445, -4.7750, 2.0315,
five steps, Frobenius normalization, wide orientation, update scaled by sqrt(rows / cols) for tall
matrices), run in fp32. ``ns_method="gram"`` iterates on the Gram matrix ``X X^T`` instead of
``X`` (fewer FLOPs for wide matrices, the same result in exact arithmetic).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ds.interfaces.errors import ConfigError
from ds.zero.optim.flat import Adam

NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 5
NS_METHODS = ("gram", "standard")
# Where the Gram iteration re-forms X and its Gram matrix, so rounding in the accumulated
# polynomial does not compound over all five steps.
_GRAM_RESTART = 2

MUON_DEFAULTS = {"lr": 0.02, "momentum": 0.95, "weight_decay": 0.0, "ns_method": "gram"}
ADAM_DEFAULTS = {"lr": 3e-4, "betas": (0.9, 0.95), "eps": 1e-10, "weight_decay": 0.0}


def _normalized_wide(g: torch.Tensor) -> tuple[torch.Tensor, bool]:
    x = g.to(torch.float32)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    return x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7), tall


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS, method: str = "gram") -> torch.Tensor:
    """An approximately orthogonal matrix with ``g``'s singular vectors (fp32, ``g``'s shape)."""
    a, b, c = NS_COEFFICIENTS
    x, tall = _normalized_wide(g)
    if method == "standard" or x.size(-2) == x.size(-1):
        for _ in range(steps):
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
        return x.mT if tall else x
    # Gram form: X_k = Q X_0 with Q a product of polynomials in R = X X^T, each of which commutes
    # with R, so R_{k+1} = P(R_k)^2 R_k and X is touched only at the restart and at the end.
    r = x @ x.mT
    q: torch.Tensor | None = None
    eye = torch.eye(r.size(-1), dtype=r.dtype, device=r.device)
    for i in range(steps):
        if i == _GRAM_RESTART and q is not None:
            x = q @ x
            r, q = x @ x.mT, None
        poly = a * eye + b * r + c * r @ r
        q = poly if q is None else poly @ q
        if i < steps - 1 and i + 1 != _GRAM_RESTART:
            r = poly @ poly @ r
    assert q is not None
    x = q @ x
    return x.mT if tall else x


def muon_direction(grad: torch.Tensor, momentum: torch.Tensor, beta: float, method: str) -> torch.Tensor:
    """Fold ``grad`` into ``momentum`` (in place) and return the orthogonalized Nesterov direction,
    scaled so tall matrices take steps of the same RMS as wide ones."""
    momentum.lerp_(grad, 1.0 - beta)
    direction = grad.lerp(momentum, beta)
    shape = direction.shape
    matrix = direction.reshape(shape[0], -1) if direction.dim() > 2 else direction
    rows, cols = matrix.shape[-2], matrix.shape[-1]
    out = newton_schulz(matrix, method=method)
    if rows > cols:
        out = out * math.sqrt(rows / cols)
    return out.reshape(shape).to(grad.dtype)


@dataclass(frozen=True)
class FlatMatrices:
    """Where the matrices of one flat, padded ZeRO buffer sit, and this rank's part of it."""

    shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    lo: int  # this rank's partition of the padded buffer
    hi: int
    padded: int
    # The whole padded buffer from this rank's partition (None when the rank holds all of it).
    gather: Callable[[torch.Tensor], torch.Tensor] | None = None


class Muon(Adam):
    """Muon for groups with ``use_muon`` true, AdamW (or Adam with L2 decay when
    ``adamw_mode`` is false) for the others; each group carries its own settings."""

    def __init__(self, params: Any, adamw_mode: bool = True) -> None:
        self._layouts: dict[int, FlatMatrices] = {}
        super().__init__(params, adamw_mode=adamw_mode)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        if "use_muon" not in param_group:
            raise ConfigError(
                "Muon needs every parameter group to say use_muon=True (hidden weight matrices) "
                "or use_muon=False (the rest, stepped with AdamW)"
            )
        own = MUON_DEFAULTS if param_group["use_muon"] else ADAM_DEFAULTS
        group = {**own, **param_group}
        if group["use_muon"] and group["ns_method"] not in NS_METHODS:
            raise ConfigError(
                f"optimizer.params.ns_method must be one of {NS_METHODS}, got {group['ns_method']!r}"
            )
        super().add_param_group(group)

    def bind_flat_layout(self, flat: torch.Tensor, layout: FlatMatrices) -> None:
        """Declare ``flat`` (a parameter of a Muon group) a ZeRO buffer holding ``layout``."""
        self._layouts[id(flat)] = layout

    def _update(
        self, group: dict[str, Any], p: torch.Tensor, grad: torch.Tensor, state: dict[str, Any]
    ) -> None:
        if not group["use_muon"]:
            super()._update(group, p, grad, state)
            return
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(p)
        momentum = state["momentum_buffer"]
        layout = self._layouts.get(id(p))
        if layout is None:
            if p.dim() < 2:
                raise ConfigError(
                    f"Muon got a {p.dim()}-D parameter in a use_muon group; Muon steps matrices "
                    "only: put vectors and scalars in a use_muon=False group"
                )
            update = muon_direction(grad, momentum, group["momentum"], group["ns_method"])
        else:
            update = self._flat_update(layout, group, grad, momentum)
        p.mul_(1.0 - group["lr"] * group["weight_decay"])
        p.add_(update, alpha=-group["lr"])

    @staticmethod
    def _flat_update(
        layout: FlatMatrices, group: dict[str, Any], grad: torch.Tensor, momentum: torch.Tensor
    ) -> torch.Tensor:
        gather = layout.gather
        whole_grad = grad if gather is None else gather(grad)
        whole_mom = momentum if gather is None else gather(momentum)
        update = torch.zeros_like(whole_grad)
        for shape, off in zip(layout.shapes, layout.offsets):
            n = math.prod(shape)
            update[off : off + n] = muon_direction(
                whole_grad[off : off + n].view(shape),
                whole_mom[off : off + n].view(shape),
                group["momentum"],
                group["ns_method"],
            ).reshape(-1)
        if gather is not None:
            momentum.copy_(whole_mom[layout.lo : layout.hi])
            return update[layout.lo : layout.hi]
        return update


# Which optimizer.params each half takes; muon_lr / adam_lr set one half's lr.
_MUON_KEYS = ("lr", "momentum", "weight_decay", "ns_method")
_ADAM_KEYS = ("lr", "betas", "eps", "weight_decay")
_NOT_MATRICES = ("embed", "lm_head")


def wants_muon(p: torch.Tensor, name: str) -> bool:
    """A parameter's own ``use_muon`` attribute when it has one, else DeepSpeed's rule: matrices
    (2-D and up) other than embeddings and output heads."""
    explicit = getattr(p, "use_muon", None)
    if explicit is not None:
        return bool(explicit)
    return p.dim() >= 2 and not any(word in name.lower() for word in _NOT_MATRICES)


def muon_param_groups(
    groups: list[dict[str, Any]], params: dict[str, Any], names: dict[int, str]
) -> list[dict[str, Any]]:
    """Each group split into its Muon half and its AdamW half (``use_muon`` true / false), each
    with its settings: the config's, then ``muon_lr`` / ``adam_lr``, then the group's own.
    Every parameter is tagged with ``use_muon``, as DeepSpeed's initialize does."""
    out: list[dict[str, Any]] = []
    for group in groups:
        trainable = [p for p in group["params"] if p.requires_grad]
        for p in trainable:
            p.use_muon = wants_muon(p, names.get(id(p), ""))  # type: ignore[attr-defined]
            if p.use_muon and p.dim() < 2:  # type: ignore[attr-defined]
                raise ConfigError(
                    f"parameter {names.get(id(p), '?')!r} of shape {tuple(p.shape)} has "
                    "use_muon=True; Muon steps matrices only, set use_muon=False on it"
                )
        for use_muon, keys, lr_key in ((True, _MUON_KEYS, "muon_lr"), (False, _ADAM_KEYS, "adam_lr")):
            half = [p for p in trainable if p.use_muon is use_muon]  # type: ignore[attr-defined]
            if not half:
                continue
            settings = {k: params[k] for k in keys if k in params}
            if lr_key in params:
                settings["lr"] = params[lr_key]
            settings.update({k: v for k, v in group.items() if k in keys})
            if "betas" in settings:
                settings["betas"] = tuple(settings["betas"])
            rest = {k: v for k, v in group.items() if k not in _MUON_KEYS + _ADAM_KEYS}
            out.append({**rest, **settings, "params": half, "use_muon": use_muon})
    return out
