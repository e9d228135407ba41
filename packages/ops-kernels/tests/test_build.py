"""Build properties of the native module: DLPack only (no libtorch link), portable ISA flags."""

from __future__ import annotations

from pathlib import Path

import pytest

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
        assert {"avx2", "avx512", "avx512_bf16"} <= set(built)


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def test_avx512_bf16_level_follows_the_cpu() -> None:
    # The bf16-conversion variant is picked exactly when the CPU reports AVX512_BF16 on top of
    # the AVX-512 subsets the avx512 variant needs.
    flags = _cpu_flags()
    if ds.ops.info()["arch"] not in {"x86_64", "AMD64"} or not flags:
        pytest.skip("x86-64 Linux only (reads /proc/cpuinfo)")
    avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
    detected = _C.detected_simd_level()
    if avx512 and "avx512_bf16" in flags:
        assert detected == "avx512_bf16"
    elif avx512:
        assert detected == "avx512"
    else:
        assert detected in {"avx2", "scalar"}


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
