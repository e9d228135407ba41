"""Layer specifications: a layer described by its class and arguments, built only on its stage.

A model that does not fit one device cannot be built whole and then cut; a ``LayerSpec`` defers
the construction so each pipeline stage builds only its own layers (DeepSpeed's names).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class LayerSpec:
    """``typename(*module_args, **module_kwargs)``, built when the stage that holds it asks."""

    def __init__(self, typename: type, *module_args: Any, **module_kwargs: Any) -> None:
        if not (isinstance(typename, type) and issubclass(typename, torch.nn.Module)):
            raise TypeError(
                f"LayerSpec needs a torch.nn.Module subclass, got {typename!r}; pass the class "
                "itself (LayerSpec(torch.nn.Linear, 8, 8)), not an instance"
            )
        self.typename = typename
        self.module_args = module_args
        self.module_kwargs = module_kwargs

    def build(self) -> torch.nn.Module:
        return self.typename(*self.module_args, **self.module_kwargs)

    def __repr__(self) -> str:
        return f"LayerSpec({self.typename.__name__})"


class TiedLayerSpec(LayerSpec):
    """A layer whose weights are shared with every other ``TiedLayerSpec`` of the same ``key``
    (a GPT's token embedding and its LM head). Each stage holding the key builds the module once;
    ``forward_fn(module, x)``, when given, is how this occurrence uses it (the head's
    ``x @ module.weight.T``); ``tied_weight_attr`` names the attributes whose gradients are summed
    over the stages holding the key."""

    def __init__(
        self,
        key: str,
        typename: type,
        *module_args: Any,
        forward_fn: Callable[[torch.nn.Module, Any], Any] | None = None,
        tied_weight_attr: str | list[str] = "weight",
        **module_kwargs: Any,
    ) -> None:
        super().__init__(typename, *module_args, **module_kwargs)
        self.key = key
        self.forward_fn = forward_fn
        self.tied_weight_attr = (
            [tied_weight_attr] if isinstance(tied_weight_attr, str) else list(tied_weight_attr)
        )

    def __repr__(self) -> str:
        return f"TiedLayerSpec({self.key!r}, {self.typename.__name__})"


__all__ = ["LayerSpec", "TiedLayerSpec"]
