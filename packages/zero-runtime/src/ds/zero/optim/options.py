"""Optimizer options: each is honoured on every path (host, device kernels, CPU offload, NVMe) or
refused on every path with one line saying what to do; none is dropped.

Keys that choose an implementation rather than the arithmetic (``torch_adam``, ``fused``,
``foreach``, ``set_grad_none``, ``fp32_optimizer_states``: ds keeps fp32 masters and moments and
clears gradients itself) are accepted; only ``torch_adam: true`` is acted on, by the host Adam
(torch's single-tensor arithmetic instead of its fused kernel, an ulp apart at most).
"""

from __future__ import annotations

from typing import Any

import torch

from ds.interfaces.errors import ConfigError

IMPLEMENTATION_KEYS = ("torch_adam", "fused", "foreach", "set_grad_none", "fp32_optimizer_states")

# Keys of a client torch optimizer's defaults that no ds path implements when set.
_CLIENT_REFUSED = {"amsgrad": True, "maximize": True}


def config_params(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """``optimizer.params`` as keyword arguments of the optimizer classes, after refusing what no
    path implements."""
    out = {k: v for k, v in params.items() if k not in IMPLEMENTATION_KEYS}
    if out.pop("amsgrad", False):
        raise ConfigError(
            f"optimizer.params.amsgrad=true: ds's {kind} has no AMSGrad variant (neither does "
            "DeepSpeed's fused or CPU Adam); remove it, or pass torch.optim.AdamW(amsgrad=True) "
            "to initialize() without offload_optimizer"
        )
    if "betas" in out:
        out["betas"] = tuple(out["betas"])
    return out


def refuse_client_options(client: torch.optim.Optimizer) -> None:
    """A client torch optimizer re-created on ds's kernels (offload): its options must carry over."""
    for group in [client.defaults, *client.param_groups]:
        for key, bad in _CLIENT_REFUSED.items():
            if group.get(key) == bad:
                raise ConfigError(
                    f"{type(client).__name__}({key}={bad}) cannot run on the offloaded optimizer's "
                    f"kernels, which have no {key}; drop {key} or set "
                    "zero_optimization.offload_optimizer.device to 'none'"
                )


def adam_is_decoupled(client: torch.optim.Optimizer) -> bool:
    """AdamW, or torch.optim.Adam(decoupled_weight_decay=True)."""
    return isinstance(client, torch.optim.AdamW) or bool(
        client.defaults.get("decoupled_weight_decay")
    )
