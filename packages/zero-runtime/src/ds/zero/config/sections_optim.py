"""The ``optimizer`` and ``scheduler`` sections: the types ds provides and the params each takes.

Unknown params are refused with a did-you-mean, as DeepSpeed's optimizer and schedule classes
refuse them when built. Re-exported by :mod:`ds.zero.config.sections`.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import Field, field_validator, model_validator

from ds.zero.config.base import Section

OPTIMIZERS_IMPLEMENTED = ("adam", "adamw", "adagrad", "lion", "sgd", "muon")
# Documented by DeepSpeed; not provided by ds (a config naming one is rejected, never substituted).
OPTIMIZERS_DOCUMENTED = (
    "lamb",
    "onebitadam",
    "zerooneadam",
    "onebitlamb",
    "muadam",
    "muadamw",
    "musgd",
)

OPTIMIZER_PARAMS: dict[str, frozenset[str]] = {
    "adam": frozenset(
        {
            "lr",
            "betas",
            "eps",
            "weight_decay",
            "amsgrad",
            "bias_correction",
            "adam_w_mode",
            "torch_adam",
            "fused",
            "foreach",
            "set_grad_none",
            "fp32_optimizer_states",
        }
    ),
    "adagrad": frozenset(
        {"lr", "eps", "weight_decay", "lr_decay", "initial_accumulator_value", "amsgrad"}
    ),
    "lion": frozenset({"lr", "betas", "weight_decay", "set_grad_none", "fp32_optimizer_states"}),
    "sgd": frozenset({"lr", "momentum", "dampening", "weight_decay", "nesterov"}),
    # Muon for matrices, AdamW for the rest: each half takes its keys, muon_lr / adam_lr one lr.
    "muon": frozenset(
        {
            "lr",
            "momentum",
            "weight_decay",
            "ns_method",
            "muon_lr",
            "adam_lr",
            "betas",
            "eps",
            "adam_w_mode",
            "set_grad_none",
            "fp32_optimizer_states",
        }
    ),
}
OPTIMIZER_PARAMS["adamw"] = OPTIMIZER_PARAMS["adam"]


class OptimizerConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    type: str
    params: dict[str, Any] = Field(default_factory=dict)
    legacy_fusion: bool = False

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        key = value.lower()
        if key in OPTIMIZERS_IMPLEMENTED:
            return key
        if key in OPTIMIZERS_DOCUMENTED:
            raise ValueError(
                f"optimizer {value!r} is a DeepSpeed optimizer ds does not provide; use one of "
                f"Adam, AdamW, Adagrad, Lion, SGD, Muon or pass your own torch optimizer to initialize()"
            )
        raise ValueError(
            f"unknown optimizer type {value!r}; use one of Adam, AdamW, Adagrad, Lion, SGD, Muon"
        )

    @model_validator(mode="after")
    def _known_params(self) -> OptimizerConfig:
        from ds.zero.config.suggest import unknown_keys_message

        allowed = OPTIMIZER_PARAMS[self.type]
        if "max_grad_norm" in self.params:
            raise ValueError(
                "optimizer.params.max_grad_norm is not an optimizer parameter (DeepSpeed refuses "
                "it too); clip with the top-level 'gradient_clipping' instead"
            )
        msg = unknown_keys_message(self.params, allowed, f"optimizer {self.type} params")
        if msg:
            raise ValueError(msg)
        if self.type in ("sgd", "adagrad"):
            # torch.optim builds these for DeepSpeed and checks their numbers on construction.
            for key in (
                "lr",
                "momentum",
                "dampening",
                "weight_decay",
                "eps",
                "lr_decay",
                "initial_accumulator_value",
            ):
                value = self.params.get(key, 0.0)
                if value == "auto":
                    continue
                if not isinstance(value, int | float) or not 0 <= value < math.inf:
                    raise ValueError(
                        f"optimizer.params.{key} must be a finite number >= 0, got {value!r}"
                    )
        lr = self.params.get("lr", 1e-3)
        if lr != "auto" and (
            not isinstance(lr, int | float) or isinstance(lr, bool) or not 0 <= lr < math.inf
        ):  # "not 0 <= lr" also refuses NaN, which JSON readers accept as a number
            raise ValueError(
                f"optimizer.params.lr must be a finite, non-negative number, got {lr!r}"
            )
        betas = self.params.get("betas")
        if betas is not None and betas != "auto":
            ok = isinstance(betas, list | tuple) and len(betas) == 2
            if not ok or not all(isinstance(b, int | float) and 0.0 <= b < 1.0 for b in betas):
                raise ValueError(
                    f"optimizer.params.betas must be two numbers in [0, 1), got {betas!r}"
                )
        return self


SCHEDULER_PARAMS: dict[str, dict[str, Any]] = {
    "WarmupLR": {
        "warmup_min_lr": 0.0,
        "warmup_max_lr": None,  # DeepSpeed's default: the optimizer's LR
        "warmup_num_steps": 1000,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "WarmupDecayLR": {
        "total_num_steps": None,
        "warmup_min_lr": 0.0,
        "warmup_max_lr": 0.001,
        "warmup_num_steps": 1000,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "WarmupCosineLR": {
        "total_num_steps": None,
        "warmup_min_ratio": 0.0,
        "warmup_num_steps": 1000,
        "cos_min_ratio": 0.0001,
        "warmup_type": "log",
        "last_batch_iteration": -1,
    },
    "OneCycle": {
        "cycle_min_lr": None,
        "cycle_max_lr": None,
        "decay_lr_rate": 0.0,
        "cycle_first_step_size": 2000,
        "cycle_second_step_size": None,
        "cycle_first_stair_count": 0,
        "cycle_second_stair_count": None,
        "decay_step_size": 0,
        "cycle_momentum": True,
        "cycle_min_mom": 0.8,
        "cycle_max_mom": 0.9,
        "decay_mom_rate": 0.0,
        "last_batch_iteration": -1,
    },
    "LRRangeTest": {
        "lr_range_test_min_lr": 0.001,
        "lr_range_test_step_size": 2000,
        "lr_range_test_step_rate": 1.0,
        "lr_range_test_staircase": False,
        "last_batch_iteration": -1,
    },
}


class SchedulerConfig(Section):
    RAW_AUTO: ClassVar[bool] = True  # read key by key by DeepSpeed
    type: str
    params: dict[str, Any] = Field(default_factory=dict)

    @field_validator("type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        from ds.zero.config.suggest import closest

        if value in SCHEDULER_PARAMS:
            return value
        hint = closest(value, SCHEDULER_PARAMS)
        raise ValueError(
            f"unknown scheduler type {value!r}{hint}; use one of {', '.join(SCHEDULER_PARAMS)}"
        )

    @model_validator(mode="after")
    def _known_params(self) -> SchedulerConfig:
        from ds.zero.config.suggest import unknown_keys_message

        defaults = SCHEDULER_PARAMS[self.type]
        msg = unknown_keys_message(self.params, defaults, f"scheduler {self.type} params")
        if msg:
            raise ValueError(msg)
        problems = [
            p for key, value in self.params.items() if (p := _param_problem(key, value)) is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))
        if self.params.get("warmup_type", "log") not in ("log", "linear", "auto"):
            import warnings

            from ds.zero.config.notices import UnimplementedConfigWarning

            # DeepSpeed warns and warms up logarithmically; ds does the same.
            warnings.warn(
                f"scheduler.params.warmup_type={self.params['warmup_type']!r} is neither 'log' "
                "nor 'linear'; the warm-up is logarithmic (DeepSpeed's fallback)",
                UnimplementedConfigWarning,
                stacklevel=2,
            )
            self.params["warmup_type"] = "log"
        merged = {**defaults, **self.params}
        needs = [
            k
            for k, v in merged.items()
            if v is None and k in ("total_num_steps", "cycle_min_lr", "cycle_max_lr")
        ]
        if needs:
            raise ValueError(f"scheduler {self.type} needs params {', '.join(needs)}")
        return self

    def resolved_params(self) -> dict[str, Any]:
        return {**SCHEDULER_PARAMS[self.type], **self.params}


# Scheduler params DeepSpeed's schedule classes check when they are built: positive integers,
# and numbers the constructor computes with.
_POSITIVE_INT = frozenset({"warmup_num_steps", "lr_range_test_step_size"})
_POSITIVE = frozenset({"cycle_first_step_size"})
_NON_NEGATIVE = frozenset({"cycle_second_step_size"})
# Bounds a schedule takes per param group: one number for all groups, or a list with one each
# (its length is checked against the optimizer's groups when the schedule is built).
_PER_GROUP = frozenset(
    {
        "warmup_min_lr",
        "warmup_max_lr",
        "cycle_min_lr",
        "cycle_max_lr",
        "cycle_min_mom",
        "cycle_max_mom",
        "lr_range_test_min_lr",
    }
)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _param_problem(key: str, value: Any) -> str | None:
    where = f"scheduler.params.{key}"
    if value == "auto" or key == "warmup_type":
        return None
    if key in _POSITIVE_INT:
        if not isinstance(value, int) or value <= 0:
            return f"{where} must be a positive integer, got {value!r}"
        return None
    if value is None and key in (
        "cycle_second_step_size",
        "cycle_second_stair_count",
        "warmup_max_lr",
    ):
        return None  # None: the same as the first half; for WarmupLR, the optimizer's LR
    if isinstance(value, list):
        if key not in _PER_GROUP:
            return f"{where}={value!r}: a list is taken only for per-group LR/momentum bounds"
        if not value or not all(_is_number(v) for v in value):
            return f"{where} must be a number or a list of numbers (one per group), got {value!r}"
        return None
    if isinstance(value, str) or not isinstance(value, int | float):
        return f"{where} must be a number, got {type(value).__name__} {value!r}"
    if key in _POSITIVE and value <= 0:
        return f"{where} must be positive, got {value!r}"
    if key in _NON_NEGATIVE and value < 0:
        return f"{where} must be >= 0, got {value!r}"
    return None


__all__ = [
    "OPTIMIZERS_DOCUMENTED",
    "OPTIMIZERS_IMPLEMENTED",
    "OPTIMIZER_PARAMS",
    "SCHEDULER_PARAMS",
    "OptimizerConfig",
    "SchedulerConfig",
]
