"""DeepSpeed's ZeRO optimizer classes as ``isinstance`` views of ds's engines' optimizers.

ds's ZeRO engines step a real ``torch.optim.Optimizer`` over their fp32 masters; DeepSpeed wraps
one in ``DeepSpeedZeroOptimizer`` (stages 1-2) or ``DeepSpeedZeroOptimizer_Stage3``. Code that
asks ``isinstance(engine.optimizer, DeepSpeedZeroOptimizer)`` to learn the ZeRO stage gets the
answer for the engine ``deepspeed.initialize`` made: the class holds for that engine's optimizer
(and its ZeRO strategy) when the engine runs one of the class's stages. The classes are not
constructed directly (ds's engine builds its optimizer from the config)."""

from __future__ import annotations

from typing import Any, NoReturn

from ds.full.compat.deepspeed._missing import FeatureNotAvailableError


def _engine_stage(obj: Any) -> int | None:
    from ds.full.compat.deepspeed.utils.tensor_fragment import _ENGINES, _strategy

    for engine in list(_ENGINES):
        strategy = _strategy(engine)
        if strategy is None:
            continue
        held = (getattr(engine, "optimizer", None), strategy, getattr(strategy, "optimizer", None))
        if any(obj is h for h in held if h is not None):
            return int(getattr(strategy, "stage", getattr(engine.config, "stage", -1)))
    return None


class ZeroOptimizerClass(type):
    """Metaclass: ``isinstance(x, cls)`` holds for the optimizer of an engine at ``cls.stages``."""

    stages: tuple[int, ...]

    def __instancecheck__(cls, obj: Any) -> bool:
        if type.__instancecheck__(cls, obj):
            return True
        return _engine_stage(obj) in cls.stages


def refuse(cls: type, *args: Any, **kwargs: Any) -> NoReturn:
    raise FeatureNotAvailableError(
        f"{cls.__module__}.{cls.__name__}: constructing DeepSpeed's ZeRO optimizer directly is "
        "not available in ds; the engine deepspeed.initialize returns builds its optimizer from "
        "the config's zero_optimization.stage (isinstance checks against this class hold for it)"
    )
