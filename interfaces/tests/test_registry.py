import pytest

from ds.interfaces import registry
from ds.interfaces.errors import DsError, ProviderNotFoundError


def test_runtime_registration_roundtrip():
    sentinel = object()
    registry.register("ds.test_group", "thing", lambda: sentinel)
    try:
        assert registry.get("ds.test_group", "thing") is sentinel
        assert "thing" in registry.list_providers("ds.test_group")
        assert registry.has_provider("ds.test_group", "thing")
    finally:
        registry.unregister("ds.test_group", "thing")
    assert not registry.has_provider("ds.test_group", "thing")


def test_missing_provider_names_distribution_and_available():
    with pytest.raises(ProviderNotFoundError) as err:
        registry.get(registry.KERNELS, "no-such-kernels")
    msg = str(err.value)
    assert "pip install ds-ops-kernels" in msg
    assert "no-such-kernels" in msg
    assert isinstance(err.value, DsError)


def test_unknown_group_has_generic_hint():
    with pytest.raises(ProviderNotFoundError, match="install the distribution"):
        registry.get("ds.unknown_group", "x")


def test_entry_point_discovery_is_lazy_and_listed():
    # Every installed ds distribution that registers a console verb shows up without being loaded.
    providers = registry.list_providers(registry.CLI)
    for p in providers.values():
        assert p.group == registry.CLI
        assert ":" in p.value


def test_refresh_clears_cache():
    registry.list_providers(registry.ACCELERATORS)
    registry.refresh()
    assert isinstance(registry.list_providers(registry.ACCELERATORS), dict)
