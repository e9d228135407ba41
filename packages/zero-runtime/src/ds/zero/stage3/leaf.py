"""ZeRO-3 leaf modules: modules whose whole subtree stage 3 gathers at once, on entry.

A module whose forward picks its children dynamically (a mixture-of-experts block choosing
experts per batch, a module choosing a sub-layer by step or rank) breaks per-submodule fetching:
ranks would gather different parameters in different orders. Marked as a leaf (the ``_z3_leaf``
attribute, DeepSpeed's spelling), the module gets one gather for all its descendants' parameters
before its forward and one release after, and its children get no hooks of their own.

Modules are marked by class (a type, its bare name or its fully qualified name), by name in
``named_modules()`` or by a suffix of that name; ``zero_optimization.leaf_module`` in the config
does the same at engine construction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ds.interfaces.logging import get_logger
from ds.zero.config.sections_aux import DEFAULT_LEAF_MODULE_CLASSES

log = get_logger(__name__)


def z3_leaf_module(module: torch.nn.Module) -> bool:
    return bool(getattr(module, "_z3_leaf", False))


def z3_leaf_parameter(param: torch.nn.Parameter) -> bool:
    """Whether ``param`` belongs to a leaf module (marked when stage 3 hooks the module)."""
    return hasattr(param, "ds_z3_leaf_module")


def get_z3_leaf_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if z3_leaf_module(m)]


def _qualname(module: torch.nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}"


def _matches(module: torch.nn.Module, spec: type | str) -> bool:
    if isinstance(spec, type):
        return isinstance(module, spec)
    return type(module).__name__ == spec or _qualname(module) == spec


def mark_by_class(
    model: torch.nn.Module,
    classes: Sequence[type | str],
    flag: bool = True,
    raise_if_not_found: bool = True,
) -> list[torch.nn.Module]:
    """Set (or clear, ``flag=False``) the leaf mark on every module matching one of ``classes``;
    returns the matched modules. No match at all is a ``ValueError`` unless told otherwise."""
    bad = [c for c in classes if not isinstance(c, (type, str))]
    if bad:
        raise TypeError(f"leaf module classes must be types or class names, got {bad!r}")
    matched = []
    for m in model.modules():
        if any(_matches(m, c) for c in classes):
            m._z3_leaf = flag  # type: ignore[assignment]
            matched.append(m)
    if not matched and raise_if_not_found:
        raise ValueError(f"no module of the classes {list(classes)!r} found in the model")
    return matched


def mark_by_name(
    model: torch.nn.Module,
    names: Iterable[str],
    flag: bool = True,
    raise_if_not_found: bool = True,
) -> tuple[list[torch.nn.Module], list[str]]:
    """Mark the modules named (as in ``named_modules()``) in ``names``; returns the matched
    modules and the names that matched nothing."""
    by_name = dict(model.named_modules())
    matched, missing = [], []
    for name in names:
        m = by_name.get(name)
        if m is None:
            missing.append(name)
            continue
        m._z3_leaf = flag  # type: ignore[assignment]
        matched.append(m)
    if missing and raise_if_not_found:
        raise ValueError(f"no modules named {missing} in the model")
    return matched, missing


def mark_by_suffix(
    model: torch.nn.Module,
    suffixes: Iterable[str],
    flag: bool = True,
    raise_if_not_found: bool = True,
) -> tuple[list[torch.nn.Module], list[str]]:
    """Mark every module whose ``named_modules()`` name ends with one of ``suffixes``; returns
    the matched modules (each once) and the suffixes that matched nothing."""
    named = list(model.named_modules())
    matched: dict[int, torch.nn.Module] = {}
    missing = []
    for suffix in suffixes:
        hits = [m for name, m in named if name.endswith(suffix)]
        if not hits:
            missing.append(suffix)
        for m in hits:
            m._z3_leaf = flag  # type: ignore[assignment]
            matched.setdefault(id(m), m)
    if missing and raise_if_not_found:
        raise ValueError(f"no modules whose names end with {missing} in the model")
    return list(matched.values()), missing


# Containers never become leaves by size: a ModuleList or ModuleDict runs no forward, so its
# children, left without hooks of their own, would never be gathered.
_CONTAINERS = (
    torch.nn.Sequential,
    torch.nn.ModuleList,
    torch.nn.ModuleDict,
    torch.nn.ParameterList,
    torch.nn.ParameterDict,
)
# Nor does a subtree this large (elements): gathered at once it would hold too much memory.
_MAX_LEAF_NUMEL = 1_000_000_000


def mark_by_granularity(model: torch.nn.Module, threshold: int) -> list[torch.nn.Module]:
    """``zero_optimization.module_granularity_threshold``: a module's granularity is the number
    of parameter elements in its subtree divided by the number of modules there (itself and its
    descendants, not counting containers and modules without parameters); the outermost modules
    whose granularity is at most ``threshold`` become leaves, so that a subtree of many small
    modules costs one gather instead of one per module. A module without children keeps its own
    hooks either way. Returns the marked modules."""
    if threshold <= 0:
        return []
    granularity: dict[int, float] = {}

    def walk(m: torch.nn.Module) -> tuple[int, int]:  # (modules, elements) in the subtree
        own = sum(int(getattr(p, "ds_numel", p.numel())) for p in m.parameters(recurse=False))
        children = list(m.children())
        if not children:
            return (1, own) if own else (0, 0)
        layers, numel = 0, own
        for c in children:
            n_layers, n_numel = walk(c)
            layers, numel = layers + n_layers, numel + n_numel
        if not numel or isinstance(m, _CONTAINERS):
            return layers, numel
        layers += 1
        if numel <= _MAX_LEAF_NUMEL:
            granularity[id(m)] = numel // layers
        return layers, numel

    walk(model)
    marked: list[torch.nn.Module] = []
    stack = [model]
    while stack:
        m = stack.pop()
        if granularity.get(id(m), float("inf")) <= threshold:
            m._z3_leaf = True  # type: ignore[assignment]
            marked.append(m)
        else:
            stack.extend(reversed(list(m.children())))
    if not marked:
        log.warning(
            "module_granularity_threshold marks no module: raise it to at least the smallest "
            "granularity to take effect",
            threshold=threshold,
            smallest=min(granularity.values(), default=None),
        )
    return marked


def apply_leaf_config(model: torch.nn.Module, cfg: Any) -> list[torch.nn.Module]:
    """Mark the leaves a ``zero_optimization.leaf_module`` section names; entries that match
    nothing are skipped (the defaults name transformers classes a model may not use)."""
    if cfg is None:
        return []
    found = {id(m): m for m in mark_by_class(model, list(cfg.classes), raise_if_not_found=False)}
    for m in mark_by_name(model, cfg.names, raise_if_not_found=False)[0]:
        found.setdefault(id(m), m)
    for m in mark_by_suffix(model, cfg.name_suffixes, raise_if_not_found=False)[0]:
        found.setdefault(id(m), m)
    return list(found.values())


__all__ = [
    "DEFAULT_LEAF_MODULE_CLASSES",
    "apply_leaf_config",
    "get_z3_leaf_modules",
    "mark_by_class",
    "mark_by_granularity",
    "mark_by_name",
    "mark_by_suffix",
    "z3_leaf_module",
    "z3_leaf_parameter",
]
