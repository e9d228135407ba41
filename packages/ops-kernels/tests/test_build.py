"""Build properties of the native module: DLPack only (no libtorch link), portable ISA flags."""

from __future__ import annotations

from pathlib import Path

import ds.ops
from ds.ops import _C


def _module_bytes() -> bytes:
    path = Path(_C.__file__)
    assert path.suffix in {".so", ".pyd", ".dylib"}
    return path.read_bytes()


def test_native_module_does_not_link_torch() -> None:
    # Tensors cross through DLPack, so one build serves any torch: no libtorch/libc10 reference.
    data = _module_bytes()
    for lib in (b"libtorch", b"libc10", b"libtorch_python", b"libgomp", b"libomp"):
        assert lib not in data, lib


def test_build_flags_are_portable() -> None:
    info = ds.ops.info()
    assert "-march=native" not in info["build_flags"]
    assert "-O3" in info["build_flags"]
    built = info["simd_built"].split(",")
    assert "scalar" in built
    assert info["simd_detected"] in built
    if info["arch"] in {"x86_64", "AMD64"}:
        assert {"avx2", "avx512"} <= set(built)


def test_simd_level_can_be_lowered_and_restored() -> None:
    best = _C.detected_simd_level()
    try:
        assert _C.set_simd_level("scalar")
        assert ds.ops.simd_level() == "scalar"
    finally:
        assert _C.set_simd_level(best)
    assert ds.ops.simd_level() == best
    # A level the CPU or build cannot run is refused, not silently taken.
    other = "neon" if best != "neon" else "avx2"
    assert not _C.set_simd_level(other)
    assert ds.ops.simd_level() == best
