"""The ``deepspeed`` import hook: ds serves ``import deepspeed`` where no DeepSpeed is installed.

A meta-path finder maps ``deepspeed`` and ``deepspeed.*`` onto ``ds.full.compat.deepspeed`` and,
for libraries that check the installed distribution (transformers, accelerate), answers
``importlib.metadata`` for ``deepspeed`` with a distribution that says what it is: version
``0.19.8+ds<ds version>`` (the DeepSpeed API level ds follows, with a local label) and a summary
naming ds. It is honest by construction:

- it never shadows: for ``deepspeed`` it first asks every other finder, and serves nothing when a
  real DeepSpeed module or distribution is found (unless ``shadow=True`` was asked for in-process);
- it exists only in processes that opted in (``ds compat enable`` writes a ``.pth`` file that
  activates it; ``ds compat disable`` removes it), nothing is written into any package metadata;
- the first time it serves, it prints one line on stderr saying that ds serves the deepspeed API.

This module imports nothing from ds at import time: the ``.pth`` line runs it at every interpreter
start, so it must cost next to nothing until ``deepspeed`` is actually imported.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys

TYPE_CHECKING = False  # typing itself is not imported at start-up either
if TYPE_CHECKING:
    from typing import Any

# importlib.abc, importlib.util and importlib.metadata are not imported here: together they cost tens of
# milliseconds, and this module runs at every interpreter start of an enabled environment. The
# finder and loader only need the protocol methods; the distribution class is built on first use.

SHIM = "ds.full.compat.deepspeed"
API_LEVEL = "0.19.8"  # the DeepSpeed release whose API and config acceptance ds follows
_announced = False


def _ds_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("ds-full")
    except importlib.metadata.PackageNotFoundError:
        return "0.1.0"


def served_version() -> str:
    return f"{API_LEVEL}+ds{_ds_version().replace('-', '.')}"


def announce() -> None:
    """One line on stderr (rank 0 only), the first time ds serves the deepspeed API."""
    global _announced
    if _announced:
        return
    _announced = True
    if os.environ.get("RANK", "0") not in ("", "0"):
        return
    print(
        f"ds: the 'deepspeed' API in this process is served by ds (ds-full {_ds_version()}), "
        "not by DeepSpeed; no DeepSpeed is installed here ('ds compat disable' turns this off)",
        file=sys.stderr,
        flush=True,
    )


class _AliasLoader:
    """Makes ``deepspeed.x`` the very module object ``ds.full.compat.deepspeed.x``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return importlib.import_module(self.target)

    def exec_module(self, module: Any) -> None:
        return None  # already executed under its own name


def _distribution() -> Any:
    import importlib.metadata
    import pathlib

    class _Distribution(importlib.metadata.Distribution):
        def read_text(self, filename: str) -> str | None:
            if filename in ("METADATA", "PKG-INFO"):
                return (
                    "Metadata-Version: 2.1\n"
                    "Name: deepspeed\n"
                    f"Version: {served_version()}\n"
                    "Summary: NOT DeepSpeed: the deepspeed API served by ds "
                    f"(ds-full {_ds_version()}) in this process; see ds docs/integrations.md\n"
                    "Author: the ds project\n"
                )
            return None

        def locate_file(self, path: Any) -> Any:
            return pathlib.Path(__file__).parent / str(path)

    return _Distribution()


def _is_ours(finder: Any) -> bool:
    # A marker, not isinstance: the .pth bootstrap may load this file as a second module object.
    return bool(getattr(finder, "_ds_deepspeed_api_finder", False))


class DeepSpeedApiFinder:
    _ds_deepspeed_api_finder = True

    def __init__(self, *, shadow: bool = False) -> None:
        self.shadow = shadow

    def _others(self) -> list[Any]:
        return [f for f in sys.meta_path if not _is_ours(f)]

    def real_deepspeed_spec(self) -> Any:
        for finder in self._others():
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            try:
                spec = find("deepspeed", None)
            except Exception:
                continue
            if spec is not None:
                return spec
        return None

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname == "deepspeed":
            if not self.shadow and self.real_deepspeed_spec() is not None:
                return None  # a real DeepSpeed is installed: it is the one imported
            announce()
        elif fullname.startswith("deepspeed."):
            top = sys.modules.get("deepspeed")
            if top is None or getattr(top, "__name__", "") != SHIM:
                return None
        else:
            return None
        import importlib.util

        target_name = SHIM + fullname[len("deepspeed") :]
        if importlib.util.find_spec(target_name) is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(target_name))

    def find_distributions(self, context: Any = None) -> Any:
        name = getattr(context, "name", None)
        if name is None or name.lower().replace("_", "-") != "deepspeed":
            return iter(())
        if not self.shadow:
            for finder in self._others():
                find = getattr(finder, "find_distributions", None)
                if find is not None and next(iter(find(context)), None) is not None:
                    return iter(())  # the real distribution answers
            if self.real_deepspeed_spec() is not None:
                return iter(())
        announce()
        return iter((_distribution(),))


def active() -> DeepSpeedApiFinder | None:
    for f in sys.meta_path:
        if _is_ours(f):
            return f  # type: ignore[no-any-return]
    return None


def activate(*, shadow: bool = False) -> DeepSpeedApiFinder:
    """Put the finder first on ``sys.meta_path`` (it defers to a real DeepSpeed unless shadow)."""
    finder = active()
    if finder is None:
        finder = DeepSpeedApiFinder(shadow=shadow)
        sys.meta_path.insert(0, finder)
    finder.shadow = finder.shadow or shadow
    return finder


def deactivate() -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not _is_ours(f)]
