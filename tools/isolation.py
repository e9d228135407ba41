"""Prove that every ds distribution installs and imports alone beside ds-interfaces.

Builds each distribution's wheel, creates one fresh virtual environment (with the pinned torch
preinstalled, since most distributions need it), then for each distribution: installs ds-interfaces
and that one wheel (plus the third-party dependencies it declares), imports its module, checks that
no other ds distribution got installed, and uninstalls it again before the next one.

    python tools/isolation.py [--only ds-comm ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "tools" / "constraints-dev.txt"

# distribution -> (source directory, module to import, extra check code)
DISTS: dict[str, tuple[str, str]] = {
    "ds-interfaces": ("interfaces", "ds.interfaces.registry"),
    "ds-accel-abstraction": ("packages/accel-abstraction", "ds.accel"),
    "ds-comm": ("packages/comm", "ds.comm"),
    "ds-ops-kernels": ("packages/ops-kernels", "ds.ops"),
    "ds-zero-runtime": ("packages/zero-runtime", "ds.zero"),
    "ds-inference-v2": ("packages/inference-v2", "ds.inference"),
    "ds-checkpoint-ledger": ("packages/checkpoint-ledger", "ds.checkpoint"),
    "ds-launcher": ("packages/launcher", "ds.launcher"),
    "ds-monitor": ("packages/monitor", "ds.monitor"),
    "ds-sim": ("packages/sim", "ds.sim.world"),
    "ds-autotune": ("packages/autotune", "ds.autotune"),
    "ds-parallel": ("packages/parallel", "ds.parallel.mesh"),
    "ds-hf": ("integrations/hf", "ds.integrations.hf"),
    "ds-lightning": ("integrations/lightning", "ds.integrations.lightning"),
    "ds-full": ("packages/ds-full", "ds.full"),
}

# The ds distributions a distribution declares besides ds-interfaces: installed beside it (from the
# built wheels) and allowed in its environment. ds-sim builds on the packages it simulates;
# ds-autotune's `ds estimate` runs on ds-sim.
DECLARED: dict[str, tuple[str, ...]] = {
    "ds-sim": ("ds-accel-abstraction", "ds-comm"),
    "ds-autotune": ("ds-sim", "ds-accel-abstraction", "ds-comm"),
}

# ds-full is checked differently: with every sibling wheel, in the same venv once the others are
# uninstalled (torch and ds-interfaces only), by running the README's main job from the wheels.
PER_DIST = [n for n in DISTS if n not in ("ds-interfaces", "ds-full")]


def sh(cmd: list[str], **kw: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kw)  # type: ignore[call-overload, no-any-return]


def build_wheels(out: Path, names: list[str]) -> dict[str, Path]:
    wheels: dict[str, Path] = {}
    for name in names:
        src = ROOT / DISTS[name][0]
        before = set(out.glob("*.whl"))
        sh(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(out),
                str(src),
            ]
        )
        new = set(out.glob("*.whl")) - before
        stem = name.replace("-", "_")
        wheels[name] = next(iter(new)) if new else next(out.glob(f"{stem}-*.whl"))
    return wheels


def ds_installed(py: Path) -> set[str]:
    out = subprocess.run(
        [str(py), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        line.split("==")[0].lower() for line in out.splitlines() if line.lower().startswith("ds-")
    }


def check_full(work: Path, wheels: dict[str, Path], venv: Path) -> None:
    """`pip install ds-full` from the built wheels into ``venv`` (torch and ds-interfaces only:
    every other distribution was uninstalled after its own check), then the README's main job
    (2 ranks, shortened) through the installed `ds` command."""
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "-q", "--disable-pip-version-check"]
    leftover = ds_installed(py) - {"ds-interfaces"}
    if leftover:
        raise RuntimeError(f"the venv still holds {sorted(leftover)} before ds-full installs")
    wheel_dir = wheels["ds-full"].parent
    sh([*pip, "install", "-c", str(CONSTRAINTS), "--find-links", str(wheel_dir), "ds-full"])
    present = ds_installed(py)
    expected = {
        "ds-full",
        "ds-interfaces",
        "ds-accel-abstraction",
        "ds-comm",
        "ds-ops-kernels",
        "ds-zero-runtime",
        "ds-inference-v2",
        "ds-checkpoint-ledger",
        "ds-launcher",
        "ds-monitor",
        "ds-autotune",
        "ds-sim",
        "ds-parallel",
    }
    if not expected <= present:
        raise RuntimeError(f"ds-full did not install {sorted(expected - present)}")
    out = work / "main-job"
    sh(
        [
            str(venv / "bin" / "ds"),
            "run",
            "--nproc",
            "2",
            str(ROOT / "examples" / "train_gpt.py"),
            "--config",
            str(ROOT / "examples" / "ds_config_zero2.json"),
            "--steps",
            "12",
            "--out",
            str(out),
        ],
        cwd=work,
    )
    if not (out / "checkpoints").exists():
        raise RuntimeError("the main job ran but wrote no checkpoint")
    print("ds-full: installed from wheels into the emptied venv; the main job ran", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="distributions to check")
    ap.add_argument("--keep", type=Path, default=None, help="work directory to keep")
    ap.add_argument(
        "--full",
        action="store_true",
        help="also install the ds-full wheel set (into the emptied venv) and run the main job",
    )
    args = ap.parse_args()
    names = args.only or PER_DIST
    work = args.keep or Path(tempfile.mkdtemp(prefix="ds-isolation-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    wanted = ["ds-interfaces", *names, *(d for n in names for d in DECLARED.get(n, ()))]
    wanted = list(dict.fromkeys(wanted))
    if args.full:
        wanted = list(dict.fromkeys([*wanted, *PER_DIST, "ds-full"]))
    wheels = build_wheels(work / "wheels", wanted)
    venv = work / "venv"
    sh([sys.executable, "-m", "venv", str(venv)])
    py = venv / "bin" / "python"
    pip = [str(py), "-m", "pip", "-q", "--disable-pip-version-check"]
    sh([*pip, "install", "-c", str(CONSTRAINTS), "torch"])
    failures: list[str] = []
    for name in names:
        module = DISTS[name][1]
        declared = DECLARED.get(name, ())
        try:
            sh(
                [
                    *pip,
                    "install",
                    "-c",
                    str(CONSTRAINTS),
                    str(wheels["ds-interfaces"]),
                    *(str(wheels[d]) for d in declared),
                    str(wheels[name]),
                ]
            )
            present = ds_installed(py)
            extra = present - {"ds-interfaces", name, *declared}
            if extra:
                raise RuntimeError(f"{name} pulled in other ds distributions: {sorted(extra)}")
            sh([str(py), "-c", f"import {module}; print('{name}: import {module} ok')"], cwd=work)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            failures.append(f"{name}: {exc}")
            print(f"FAILED {name}: {exc}", flush=True)
        finally:
            subprocess.run([*pip, "uninstall", "-y", name, *declared], check=False)
    if args.full:
        try:
            check_full(work, wheels, venv)
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            failures.append(f"ds-full: {exc}")
            print(f"FAILED ds-full: {exc}", flush=True)
    dt = time.perf_counter() - t0
    if failures:
        print(f"isolation: {len(failures)} of {len(names)} distributions failed ({dt:.0f} s)")
        for f in failures:
            print("  " + f)
        return 1
    print(f"isolation: all {len(names)} distributions install and import alone ({dt:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
