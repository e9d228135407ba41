"""The measurement drivers in native/tests (not part of the build) still compile against the
working tree's kernel headers, so the numbers in docs/benchmarks.md can be reproduced. ab_optim.cpp
and ab_quant.cpp also need a baseline copy of the headers; here the working tree serves as both.
Compile only (-fsyntax-only): no AVX-512 hardware is needed. Skipped without g++ on x86-64."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

import pytest

NATIVE = Path(__file__).resolve().parents[3] / "native"
FLAGS = [
    "-std=c++17",
    "-fsyntax-only",
    "-fno-math-errno",
    "-ffp-contract=off",
    "-mavx512f",
    "-mavx512bw",
    "-mavx512vl",
    "-mavx512dq",
    "-mfma",
    "-mf16c",
    "-mavx512bf16",
    f"-I{NATIVE / 'include'}",
    f"-I{NATIVE / 'src' / 'kernels' / 'optim'}",
    f"-I{NATIVE / 'src' / 'kernels' / 'quant'}",
]
# (driver, extra defines): ab_quant.cpp is built in three parts (its header says how).
DRIVERS = [
    ("compute_f16.cpp", []),
    ("placement_optim.cpp", []),
    ("incache_optim.cpp", []),
    ("pipes_optim.cpp", []),
    ("layout_optim.cpp", []),
    ("ab_optim.cpp", []),
    ("ab_quant.cpp", ["-DAB_PART=1"]),
    ("ab_quant.cpp", ["-DAB_PART=2"]),
    ("ab_quant.cpp", []),
]

pytestmark = pytest.mark.skipif(
    shutil.which("g++") is None or platform.machine() not in ("x86_64", "AMD64"),
    reason="needs g++ on an x86-64 host",
)


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("driver", "defines"), DRIVERS)
def test_driver_compiles(driver: str, defines: list[str], tmp_path: Path) -> None:
    source = NATIVE / "tests" / driver
    # The A/B drivers include a baseline copy of the kernel headers from base/.
    base = tmp_path / "base"
    base.mkdir()
    for header in (NATIVE / "src" / "kernels" / "optim").glob("*.h"):
        shutil.copy(header, base / header.name)
    for header in (NATIVE / "src" / "kernels" / "quant").glob("*.h"):
        shutil.copy(header, base / header.name)
    proc = subprocess.run(
        ["g++", *FLAGS, *defines, f"-I{tmp_path}", str(source)],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
