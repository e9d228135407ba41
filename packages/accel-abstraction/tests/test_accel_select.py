import subprocess
import sys
import textwrap

import pytest

import ds.accel as accel
from ds.interfaces import registry
from ds.interfaces.errors import AcceleratorError


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    accel.reset_accelerator()
    yield
    accel.reset_accelerator()


def test_builtins_are_registered_through_entry_points():
    names = accel.available_accelerators()
    assert {"cpu", "cuda", "mps"} <= set(names)
    assert names["cpu"] == "ds.accel.cpu:CpuAccelerator"


def test_detects_cpu_here_and_caches():
    a = accel.get_accelerator()
    assert a.name() == "cpu"
    assert accel.get_accelerator() is a


def test_env_override_selects(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "CPU")
    assert accel.get_accelerator().name() == "cpu"


def test_unknown_name_lists_valid_ones(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "bogus")
    with pytest.raises(AcceleratorError, match=r"valid names: cpu, cuda, mps"):
        accel.get_accelerator()


def test_unavailable_name_says_what_is_usable(monkeypatch):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible, so 'cuda' is available here")
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(AcceleratorError, match=r"not available on this machine.*usable here: cpu"):
        accel.get_accelerator()


def test_bogus_from_the_shell_is_one_line_without_traceback():
    out = subprocess.run(
        [sys.executable, "-c", "import ds.accel as a; a.get_accelerator()"],
        capture_output=True,
        text=True,
        env={"DS_ACCELERATOR": "bogus", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    assert "valid names: cpu, cuda, mps" in lines[0]


class _FakeXpu:
    """A plug-in accelerator built on the CPU one, standing in for a vendor distribution."""

    def __new__(cls):
        from ds.accel.cpu import CpuAccelerator

        obj = CpuAccelerator()
        obj._NAME = "xpu"  # type: ignore[attr-defined]
        return obj


def test_runtime_plugin_is_detected_before_builtins():
    registry.register(registry.ACCELERATORS, "xpu", lambda: _FakeXpu)
    try:
        assert "xpu" in accel.available_accelerators()
        assert accel.get_accelerator().name() == "xpu"
    finally:
        registry.unregister(registry.ACCELERATORS, "xpu")


def test_broken_plugin_is_a_clear_error():
    registry.register(registry.ACCELERATORS, "broken", lambda: object)
    try:
        with pytest.raises(AcceleratorError, match="does not implement"):
            accel.set_accelerator("broken")
    finally:
        registry.unregister(registry.ACCELERATORS, "broken")


def test_entry_point_plugin_from_another_distribution(tmp_path):
    # A real distribution (dist-info with entry_points.txt) on sys.path registers "npu".
    dist = tmp_path / "ds_npu_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ds-npu-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[ds.accelerators]\nnpu = npu_plugin:NpuAccelerator\n")
    (tmp_path / "npu_plugin.py").write_text(
        textwrap.dedent("""
        from ds.accel.cpu import CpuAccelerator
        class NpuAccelerator(CpuAccelerator):
            _NAME = "npu"
    """)
    )
    code = "import ds.accel as a; print(a.get_accelerator().name())"
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin", "DS_ACCELERATOR": "npu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "npu"
