"""``deepspeed.runtime.zero.parameter_offload``: the parameter container through which ZeRO-3
finds parameters a forward reads from another module (ds.zero.stage3.external_access)."""

from __future__ import annotations

from ds.zero.stage3.external_access import ZeroParamDict as ZeROOrderedDict
from ds.zero.stage3.external_access import ensure_param_dict as _ensure


def ensure_zero_ordered_dict(module: object) -> None:
    """Give ``module`` a ``ZeROOrderedDict`` for ``_parameters`` (no-op when it has one, or has
    no parameter container)."""
    _ensure(module)


__all__ = ["ZeROOrderedDict", "ensure_zero_ordered_dict"]
