"""Stand-ins for DeepSpeed names whose feature ds does not have.

They import fine, so a script that only imports them (and never uses MoE, pipelines, ...) runs;
calling or instantiating one raises a :class:`FeatureNotAvailableError` naming the feature.
"""

from __future__ import annotations

from typing import Any, NoReturn

from ds.interfaces.errors import ConfigError


class FeatureNotAvailableError(ConfigError, NotImplementedError):
    """A DeepSpeed feature that ds does not provide was used."""


def _raise(qualname: str, feature: str, hint: str) -> NoReturn:
    msg = f"{qualname}: {feature} is not available in ds"
    raise FeatureNotAvailableError(f"{msg}; {hint}" if hint else msg)


def missing_class(qualname: str, feature: str, hint: str = "") -> type:
    """A class that raises when instantiated (isinstance checks against it are simply False)."""

    def __new__(cls: type, *args: Any, **kwargs: Any) -> NoReturn:
        _raise(qualname, feature, hint)

    module, _, name = qualname.rpartition(".")
    return type(name, (), {"__new__": __new__, "__module__": module, "__doc__": feature})


def missing_function(qualname: str, feature: str, hint: str = "") -> Any:
    def fn(*args: Any, **kwargs: Any) -> NoReturn:
        _raise(qualname, feature, hint)

    fn.__name__ = fn.__qualname__ = qualname.rpartition(".")[2]
    fn.__doc__ = feature
    return fn
