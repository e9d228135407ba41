"""Prove that one ds-ops-kernels wheel works with several torch releases.

The native module talks to tensors only through DLPack (nanobind ``nb::ndarray``) and links no
torch library, so a wheel built once should import and compute correctly under any torch 2.x.
This script builds the ds-interfaces and ds-ops-kernels wheels once (against whatever torch the
build environment has), then for each requested torch version creates a fresh virtual
environment, installs that torch from the package index plus the two wheels, and runs the
ops-kernels test files that exercise the native module (optimizers, quantizers, async I/O,
provider, the no-compiler check) against the installed wheel, not the source tree.

    python tools/torch_compat.py 2.12.0 2.6.0 [--keep DIR] [--tests test_optim_kernels.py ...]

Not part of the test suite: each torch release from the index is a CUDA build of several GB.
Exit status is non-zero if any version fails; a summary table is printed at the end.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "packages" / "ops-kernels" / "tests"
DEFAULT_TESTS = [
    "test_optim_kernels.py",
    "test_optim_classes.py",
    "test_provider.py",
    "test_quant_native.py",
    "test_quant_reference.py",
    "test_aio.py",
    "test_import_time.py",
]
TEST_DEPS = ["pytest", "pytest-timeout", "hypothesis", "numpy"]


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]


def build_wheels(out: Path) -> list[Path]:
    for src in ("interfaces", "packages/ops-kernels"):
        sh(
            [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out)]
            + [str(ROOT / src)]
        )
    wheels = sorted(out.glob("*.whl"))
    names = [w.name for w in wheels]
    if not any(n.startswith("ds_ops_kernels") for n in names):
        sys.exit(f"torch_compat: no ds_ops_kernels wheel was built in {out} (got {names})")
    return wheels


def check_version(version: str, wheels: list[Path], work: Path, tests: list[str]) -> dict:
    venv = work / f"venv-torch-{version}"
    py = venv / "bin" / "python"
    row: dict = {"torch": version, "ok": False}
    t0 = time.perf_counter()
    sh([sys.executable, "-m", "venv", str(venv)])
    sh([str(py), "-m", "pip", "install", "-q", f"torch=={version}", *TEST_DEPS])
    # Same version string as a wheel from an earlier run in a kept venv: force the fresh build in.
    sh([str(py), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", *map(str, wheels)])
    row["install_s"] = round(time.perf_counter() - t0, 1)
    probe = (
        "import torch, ds.ops, ds.ops._C as C; "
        "print(torch.__version__, ds.ops.__file__, C.simd_level())"
    )
    row["probe"] = sh([str(py), "-c", probe], capture_output=True).stdout.strip()
    # Run a copy of the tests outside the source tree so `ds` resolves only to the installed wheel.
    tdir = work / f"tests-{version}"
    shutil.copytree(TESTS, tdir, dirs_exist_ok=True)
    t1 = time.perf_counter()
    res = subprocess.run(
        [str(py), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=600", *tests],
        cwd=tdir,
        text=True,
        capture_output=True,
    )
    row["test_s"] = round(time.perf_counter() - t1, 1)
    tail = res.stdout.strip().splitlines()[-1:] or [res.stderr.strip()[-300:]]
    row["pytest"] = tail[0]
    row["ok"] = res.returncode == 0
    if not row["ok"]:
        print(res.stdout[-4000:], res.stderr[-2000:], sep="\n")
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("versions", nargs="+", help="torch versions to install from the index")
    p.add_argument("--keep", type=Path, help="work directory to keep (default: a temp dir)")
    p.add_argument("--tests", nargs="*", default=DEFAULT_TESTS)
    args = p.parse_args()
    work = args.keep or Path(tempfile.mkdtemp(prefix="ds-torch-compat-"))
    work.mkdir(parents=True, exist_ok=True)
    wheels = build_wheels(work / "wheels")
    rows = []
    for v in args.versions:
        try:
            rows.append(check_version(v, wheels, work, args.tests))
        except subprocess.CalledProcessError as exc:
            rows.append({"torch": v, "ok": False, "pytest": f"setup failed: {exc}"})
    print("\n| torch | probe (torch, module, SIMD) | pytest | ok |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['torch']} | {r.get('probe', '-')} | {r['pytest']} | {r['ok']} |")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
