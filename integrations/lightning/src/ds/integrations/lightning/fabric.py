"""A Lightning Fabric strategy on the ds engine: ``Fabric(strategy="ds_zero3")``.

``fabric.setup(model, optimizer)`` builds the engine (one optimizer); ``fabric.backward(loss)``
runs ``engine.backward`` and ``optimizer.step()`` runs ``engine.step()``. The engine runs with one
micro-batch per step: call ``optimizer.step()`` after every backward.
"""

from __future__ import annotations

from typing import Any

import torch

from ds.integrations.lightning._engine import (
    EngineOptions,
    consolidated_state_dict,
    initializer,
    rebind_scheduler,
)
from ds.interfaces.errors import ConfigError
from lightning.fabric.strategies.ddp import DDPStrategy


class EngineModule(torch.nn.Module):
    """What Fabric wraps: calls go through the engine (its hooks run on the real module)."""

    def __init__(self, engine: Any) -> None:
        super().__init__()
        self.engine = engine
        self.module = engine.module

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)


class DsFabricStrategy(EngineOptions, DDPStrategy):
    """Fabric counterpart of :class:`ds.integrations.lightning.DsStrategy`."""

    _STAGES = "0-3"

    def setup_module_and_optimizers(
        self, module: torch.nn.Module, optimizers: list[Any], scheduler: Any = None
    ) -> tuple[torch.nn.Module, list[Any], Any]:
        if len(optimizers) != 1:
            raise ConfigError(
                f"fabric.setup() got {len(optimizers)} optimizers; the ds strategies train with "
                "exactly one"
            )
        cfg = self.engine_config(1, None, str(getattr(self.precision, "precision", "32-true")))
        client = optimizers[0]
        engine, optimizer, _, _ = initializer()(model=module, optimizer=client, config=cfg)
        self.engine = engine
        rebind_scheduler(scheduler, client, optimizer)
        return EngineModule(engine), [engine.optimizer_view()], scheduler

    def setup_module(self, module: torch.nn.Module) -> Any:
        raise ConfigError(
            "the ds strategies need the optimizer at setup: call fabric.setup(model, optimizer)"
        )

    def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        if self.engine is None:
            raise ConfigError("fabric.backward() before fabric.setup(model, optimizer)")
        self.engine.backward(tensor)

    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        self.engine.step()
        return None

    def get_module_state_dict(self, module: torch.nn.Module) -> dict[str, Any]:
        """Whole weights (gathered under ZeRO-3; every rank must call it)."""
        sd = consolidated_state_dict(self.engine)
        return {k.removeprefix("module."): v for k, v in sd.items()}

    def save_checkpoint(
        self,
        path: Any,
        state: dict[str, Any],
        storage_options: Any = None,
        filter: Any = None,
    ) -> None:
        """Every rank writes its shards to the directory ``path``; entries of ``state`` other
        than modules and optimizers ride along as client state."""
        client = {k: v for k, v in state.items() if not _is_model_or_optimizer(v)}
        self.engine.save_checkpoint(str(path), tag="checkpoint", client_state=client)

    def load_checkpoint(
        self,
        path: Any,
        state: Any = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        loaded, client = self.engine.load_checkpoint(str(path), tag="checkpoint")
        if loaded is None:
            raise ConfigError(f"no ds checkpoint in {path}; pass a directory it wrote")
        client = dict(client)
        if isinstance(state, dict):
            for key in list(client):
                if key in state and not _is_model_or_optimizer(state[key]):
                    state[key] = client.pop(key)
        return client


def _is_model_or_optimizer(value: Any) -> bool:
    return isinstance(value, torch.nn.Module | torch.optim.Optimizer) or hasattr(value, "engine")
