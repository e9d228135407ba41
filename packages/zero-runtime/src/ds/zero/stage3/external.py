"""Parameters a module's forward reads although another module owns them (a tied output head
reading the embedding weight): declared before the stage-3 engine is built, gathered for both."""

from __future__ import annotations

import torch


def register_external_parameter(module: torch.nn.Module, param: torch.nn.Parameter) -> None:
    """Declare that ``module``'s forward uses ``param`` although another module owns it (for
    example a tied output head reading the embedding weight); stage 3 then gathers it for both.
    Call before the stage-3 engine is built."""
    ext = module.__dict__.setdefault("_ds_external_params", [])
    if all(p is not param for p in ext):
        ext.append(param)


def external_parameters(root: torch.nn.Module) -> dict[torch.nn.Module, list[torch.nn.Parameter]]:
    return {
        m: m.__dict__["_ds_external_params"]
        for m in root.modules()
        if "_ds_external_params" in m.__dict__
    }


__all__ = ["external_parameters", "register_external_parameter"]
