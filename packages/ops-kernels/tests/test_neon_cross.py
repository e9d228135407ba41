"""The NEON optimizer variant, proven on x86 hosts: the kernel library's optimizer sources are
cross-compiled for aarch64 together with native/tests/neon_check.cpp, which runs every kernel and
dtype combination at the NEON and the scalar level through the real dispatch and requires
bit-identical results; qemu-aarch64 executes it.

Needs a cross compiler (Debian: g++-aarch64-linux-gnu) and qemu user-mode emulation (qemu-user or
qemu-user-static); skipped with the reason when either is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[3] / "native"
KERNELS = NATIVE / "src" / "kernels"
# The optimizer family and what its dispatch needs (SIMD level, thread pool).
SOURCES = [
    KERNELS / "optim" / "optim.cpp",
    KERNELS / "optim" / "optim_scalar.cpp",
    KERNELS / "optim" / "optim_neon.cpp",
    KERNELS / "common" / "simd.cpp",
    KERNELS / "common" / "thread_pool.cpp",
]
# The library's own flags (native/CMakeLists.txt) plus what CMake adds on aarch64.
FLAGS = ["-std=gnu++17", "-pthread", "-fno-math-errno", "-ffp-contract=off", "-Wall"]
FLAGS += ["-DDS_HAVE_NEON=1", f"-I{NATIVE / 'include'}"]


def _first(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


CXX = _first("aarch64-linux-gnu-g++", "aarch64-linux-gnu-g++-12")
QEMU = _first("qemu-aarch64", "qemu-aarch64-static")


def _compile(cxx: str, src: Path, obj: Path, opt: str) -> subprocess.Popen[bytes]:
    cmd = [cxx, *FLAGS, opt, "-c", str(src), "-o", str(obj)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.skipif(CXX is None, reason="no aarch64 cross compiler (apt: g++-aarch64-linux-gnu)")
@pytest.mark.skipif(QEMU is None, reason="no qemu-aarch64 (apt: qemu-user or qemu-user-static)")
def test_neon_variant_equals_scalar_under_qemu(tmp_path: Path) -> None:
    assert CXX is not None and QEMU is not None
    objs = [tmp_path / f"{src.stem}.o" for src in SOURCES]
    # Kernels at the library's -O3; the driver at -O1 (gcc 12's aarch64 vectoriser fails on
    # its reduction loops at -O3, and the driver's speed does not matter).
    jobs = [_compile(CXX, s, o, "-O3") for s, o in zip(SOURCES, objs, strict=True)]
    driver = tmp_path / "neon_check.o"
    jobs.append(_compile(CXX, NATIVE / "tests" / "neon_check.cpp", driver, "-O1"))
    for job in jobs:
        out, _ = job.communicate()
        assert job.returncode == 0, out.decode()
    exe = tmp_path / "neon_check"
    link = subprocess.run(
        [CXX, "-static", "-pthread", *map(str, objs), str(driver), "-o", str(exe)],
        capture_output=True,
        text=True,
    )
    assert link.returncode == 0, link.stderr
    run = subprocess.run([QEMU, str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "built levels: scalar,neon" in run.stdout
    assert "neon_check ok: 198 cases" in run.stdout, run.stdout
