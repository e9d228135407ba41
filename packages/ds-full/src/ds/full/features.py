"""What this installation of ds has: distribution versions, registered implementations per
plug-in group, and which framework integrations can be used."""

from __future__ import annotations

from typing import Any

from ds.interfaces import registry

DISTRIBUTIONS = (
    "ds-interfaces",
    "ds-accel-abstraction",
    "ds-comm",
    "ds-ops-kernels",
    "ds-zero-runtime",
    "ds-inference-v2",
    "ds-checkpoint-ledger",
    "ds-launcher",
    "ds-monitor",
    "ds-sim",
    "ds-autotune",
    "ds-parallel",
    "ds-full",
    "ds-hf",
    "ds-lightning",
)
FRAMEWORKS = {"ds-hf": ("transformers", "accelerate"), "ds-lightning": ("lightning",)}


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def version() -> str:
    """The installed ds-full version."""
    return _version("ds-full") or "unknown"


def feature_report() -> dict[str, Any]:
    """A JSON-ready summary: ``distributions`` (name -> version or None), ``providers`` (group ->
    registered names), ``integrations`` (ds-hf / ds-lightning -> usable, and the framework
    versions they found), ``kernels`` (kernel provider -> devices it serves, optimizer backend)."""
    dists = {d: _version(d) for d in DISTRIBUTIONS}
    groups = sorted(set(registry.PROVIDING_DISTRIBUTION))
    providers = {g: sorted(registry.list_providers(g)) for g in groups}
    integrations: dict[str, Any] = {}
    for dist, frameworks in FRAMEWORKS.items():
        found = {f: _version(f) for f in frameworks}
        integrations[dist] = {
            "installed": dists[dist] is not None,
            "usable": dists[dist] is not None and all(found.values()),
            "frameworks": found,
        }
    return {
        "version": version(),
        "distributions": dists,
        "providers": providers,
        "integrations": integrations,
        "kernels": _kernels(),
    }


def _kernels() -> dict[str, Any]:
    """Each kernel provider's devices (ds.full steps a model on device type D with the provider
    named D, see docs/ops.md) and, where it has one, its optimizer backend."""
    out: dict[str, Any] = {}
    for name in sorted(registry.list_providers(registry.KERNELS)):
        try:
            provider = registry.get(registry.KERNELS, name)()
        except Exception as exc:  # a broken plug-in is reported, not fatal to the report
            out[name] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        entry: dict[str, Any] = {"devices": list(provider.devices())}
        backend = getattr(provider, "backend", None)
        if isinstance(backend, str):
            entry["optimizer_backend"] = backend
        out[name] = entry
    return out


__all__ = ["feature_report", "version"]
