import subprocess
import sys

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


def test_entry_point_discovery_is_lazy_and_listed(tmp_path):
    # A real distribution (dist-info with entry_points.txt) registers two providers; one points at
    # a module that does not exist. Listing must not import anything, so it lists both; loading
    # the good one works; loading the broken one fails only then.
    dist = tmp_path / "ds_probe-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ds-probe\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[ds.probe]\ngood = probe_mod:VALUE\nbroken = no_such_module_xyz:VALUE\n"
    )
    (tmp_path / "probe_mod.py").write_text("VALUE = 41 + 1\n")
    code = (
        "import sys\n"
        "from ds.interfaces import registry\n"
        "ps = registry.list_providers('ds.probe')\n"
        "assert sorted(ps) == ['broken', 'good'], ps\n"
        "assert ps['good'].distribution == 'ds-probe'\n"
        "assert 'probe_mod' not in sys.modules\n"
        "assert registry.get('ds.probe', 'good') == 42\n"
        "try:\n"
        "    registry.get('ds.probe', 'broken')\n"
        "except ModuleNotFoundError:\n"
        "    print('ok')\n"
    )
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_refresh_clears_cache():
    registry.list_providers(registry.ACCELERATORS)
    registry.refresh()
    assert isinstance(registry.list_providers(registry.ACCELERATORS), dict)
