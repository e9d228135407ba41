"""Building a ds engine for Lightning: the config from strategy arguments and Trainer settings,
the engine from the composition root found through the registry, and an optimizer proxy."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ds.interfaces import registry
from ds.interfaces.errors import ConfigError


def initializer() -> Callable[..., tuple[Any, Any, Any, Any]]:
    """``ds.full.initialize`` via the ``ds.initialize`` entry point (ds-full provides it)."""
    fn: Callable[..., tuple[Any, Any, Any, Any]] = registry.get(registry.INITIALIZE, "default")
    return fn


def consolidated_state_dict(engine: Any) -> dict[str, torch.Tensor]:
    """Whole weights at any stage; every rank must call it (stage 3 gathers)."""
    fn = registry.get(registry.INITIALIZE, "consolidated_state_dict")
    out: dict[str, torch.Tensor] = fn(engine)
    return out


def build_config(
    base: Mapping[str, Any] | None,
    *,
    stage: int,
    offload_optimizer: bool,
    offload_parameters: bool,
    micro_batch_size: int,
    accumulate_grad_batches: int,
    gradient_clip_val: float | None,
    precision: str,
) -> dict[str, Any]:
    """A DeepSpeed-style config: the user's ``config`` wins; strategy arguments fill the rest."""
    cfg: dict[str, Any] = copy.deepcopy(dict(base)) if base else {}
    zero = cfg.setdefault("zero_optimization", {})
    zero.setdefault("stage", stage)
    if offload_optimizer:
        zero.setdefault("offload_optimizer", {"device": "cpu"})
        # The LightningModule's own torch optimizer runs on ds's host kernels (Adam, AdamW,
        # Adagrad), which a bare ds config refuses unless told, as DeepSpeed does.
        cfg.setdefault("zero_force_ds_cpu_optimizer", False)
    if offload_parameters:
        zero.setdefault("offload_param", {"device": "cpu"})
    # Lightning's DeepSpeed strategy allows any optimizer configure_optimizers returns.
    cfg.setdefault("zero_allow_untested_optimizer", True)
    cfg.setdefault("train_micro_batch_size_per_gpu", micro_batch_size)
    gas = cfg.setdefault("gradient_accumulation_steps", accumulate_grad_batches)
    if gas != accumulate_grad_batches:
        raise ConfigError(
            f"config gradient_accumulation_steps={gas} but Trainer(accumulate_grad_batches="
            f"{accumulate_grad_batches}); set one of them so that they agree"
        )
    # Lightning's DeepSpeed strategy fills an absent key with the Trainer's value or 0.0 (no
    # clipping), not with DeepSpeed's own default of 1.0.
    cfg.setdefault("gradient_clipping", float(gradient_clip_val or 0.0))
    if "bf16" in precision and "bf16" not in cfg:
        cfg["bf16"] = {"enabled": True}
    elif precision.startswith("16") and "fp16" not in cfg:
        cfg["fp16"] = {"enabled": True}
    return cfg


# The registered names: (name, ZeRO stage, CPU offload of optimizer and parameters).
STRATEGIES: tuple[tuple[str, int, bool], ...] = (
    ("ds_zero1", 1, False),
    ("ds_zero2", 2, False),
    ("ds_zero3", 3, False),
    ("ds_zero3_offload", 3, True),
)


class EngineOptions:
    """The ds arguments both strategies take (Trainer and Fabric) and the config they make."""

    _OPTIONS = ("stage", "offload_optimizer", "offload_parameters", "micro_batch_size")
    _STAGES = "0, 1, 2 or 3"  # how the stage error names the accepted stages

    def __init__(
        self,
        stage: int = 2,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        config: Mapping[str, Any] | None = None,
        micro_batch_size: int = 1,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)  # the framework's own strategy takes the rest
        if stage not in (0, 1, 2, 3):
            raise ConfigError(
                f"{type(self).__name__}(stage={stage}): the ZeRO stage must be {self._STAGES}"
            )
        self.stage = stage
        self.offload_optimizer = offload_optimizer
        self.offload_parameters = offload_parameters
        self.ds_config = dict(config) if config else None
        self.micro_batch_size = micro_batch_size
        self.engine: Any = None

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Register this strategy under each of :data:`STRATEGIES`' names."""
        for name, stage, offload in STRATEGIES:
            strategy_registry.register(
                name,
                cls,
                description=f"ds ZeRO stage {stage}" + (" with CPU offload" if offload else ""),
                override=True,
                stage=stage,
                offload_optimizer=offload,
                offload_parameters=offload,
            )

    def engine_config(
        self, accumulate_grad_batches: int, gradient_clip_val: float | None, precision: str
    ) -> dict[str, Any]:
        """:func:`build_config` from this strategy's arguments and the loop's settings."""
        options = {name: getattr(self, name) for name in self._OPTIONS}
        return build_config(
            self.ds_config,
            accumulate_grad_batches=accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            precision=precision,
            **options,
        )


def rebind_scheduler(scheduler: Any, old: Any, new: Any) -> None:
    """Point a scheduler built on the client optimizer at the engine's optimizer, if they differ
    (the engine re-uses a plain client optimizer in place; CPU offload replaces it)."""
    if scheduler is None or old is new or getattr(scheduler, "optimizer", None) is not old:
        return
    assert old is not None and new is not None
    for g_old, g_new in zip(old.param_groups, new.param_groups, strict=False):
        if "initial_lr" in g_old:
            g_new.setdefault("initial_lr", g_old["initial_lr"])
        g_new["lr"] = g_old["lr"]
    scheduler.optimizer = new
