"""Migration aids for scripts written against other training libraries.

``ds.full.compat.deepspeed`` maps the ``deepspeed.*`` names scripts use onto ds. ``install()`` makes
it importable as ``deepspeed`` (every submodule, through an import hook) so that such a script runs
unchanged; it refuses to hide an installed DeepSpeed unless asked to (``shadow=True``).
``ds compat enable`` does the same for every process of an environment without DeepSpeed (see
:mod:`ds.full.compat.enable`), for scripts and libraries that are not edited at all.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

from ds.full.compat import _hook
from ds.interfaces.errors import ConfigError
from ds.interfaces.logging import get_logger

log = get_logger(__name__)

SHIM = _hook.SHIM


def install(*, shadow: bool = False) -> None:
    """Make ``import deepspeed`` (and ``deepspeed.*``) give ds's shim in this process.

    With a real DeepSpeed installed this raises unless ``shadow=True``, which then replaces it for
    this process only (and says so in the log).
    """
    current = sys.modules.get("deepspeed")
    if current is not None and current.__name__ == SHIM:
        return
    finder = _hook.active()
    real = current is not None or (
        (finder.real_deepspeed_spec() if finder is not None else None) is not None
        or (finder is None and importlib.util.find_spec("deepspeed") is not None)
    )
    if real:
        if not shadow:
            raise ConfigError(
                "a DeepSpeed installation is importable as 'deepspeed'; ds.full.compat.install() "
                "will not hide it silently: call install(shadow=True) to use ds under that name "
                "in this process, or import ds.full.compat.deepspeed directly"
            )
        log.warning("the 'deepspeed' module name now refers to ds in this process")
        for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
            del sys.modules[name]
    _hook.activate(shadow=shadow)
    importlib.import_module("deepspeed")


def uninstall() -> None:
    """Forget the ``deepspeed`` alias (a later ``import deepspeed`` finds whatever is installed)."""
    _hook.deactivate()
    for name in [n for n in sys.modules if n == "deepspeed" or n.startswith("deepspeed.")]:
        if sys.modules[name].__name__.startswith(SHIM):
            del sys.modules[name]


__all__ = ["install", "uninstall"]
