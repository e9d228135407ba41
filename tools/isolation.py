"""Prove that every ds distribution installs and imports alone beside ds-interfaces.

Builds each distribution's wheel, then for each distribution creates a fresh virtual environment
that sees this interpreter's torch (linked through a .pth file, as if preinstalled: most
distributions need it, and copying it per venv would cost more than the check), installs
ds-interfaces and that one wheel (plus the third-party dependencies it declares), imports its
module, and checks that no other ds distribution got installed.

    python tools/isolation.py [--only ds-comm ...] [--keep DIR]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from importlib import metadata
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
    """Every wheel from one pip process (a pip start costs more than a pure-Python build)."""
    out.mkdir(parents=True, exist_ok=True)
    srcs = [str(ROOT / DISTS[name][0]) for name in names]
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
        "--disable-pip-version-check", "-w", str(out), *srcs])  # fmt: skip
    wheels: dict[str, Path] = {}
    for name in names:
        stem = name.replace("-", "_")
        found = sorted(out.glob(f"{stem}-*.whl"))
        if not found:
            raise RuntimeError(f"pip wheel wrote no wheel for {name}")
        wheels[name] = found[-1]
    return wheels


def _requirements(dist: metadata.Distribution) -> list[str]:
    names = []
    for req in dist.requires or []:
        name, _, marker = req.partition(";")
        if "extra" in marker or (marker.strip() and not _marker_holds(marker)):
            continue
        names.append(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0])
    return names


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()


def torch_site(work: Path) -> Path:
    """A folder of links to this interpreter's torch and everything torch requires: each checked
    venv sees it through a .pth file, as a preinstalled torch, instead of copying 1 GB per venv."""
    site = work / "torch-site"
    site.mkdir(parents=True, exist_ok=True)
    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        seen.add(key)
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        base = Path(str(dist.locate_file("")))
        for top in tops:
            link = site / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
        todo.extend(_requirements(dist))
    return site


def make_venv(path: Path, site: Path) -> Path:
    """A venv without pip (the checking interpreter's pip installs into it with ``--python``)
    that sees torch through ``site``."""
    sh([sys.executable, "-m", "venv", "--without-pip", str(path)])
    py = path / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "ds_isolation_torch.pth").write_text(str(site) + "\n")
    return py


def pip_into(py: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "--python", str(py), "-q", "--disable-pip-version-check"]


# Run in the checked venv: the ds distributions it holds, then the import.
_PROBE = """
import sys
from importlib import metadata
names = sorted({d.metadata["Name"].lower() for d in metadata.distributions()
                if (d.metadata["Name"] or "").lower().startswith("ds-")})
print("DS_DISTS=" + ",".join(names), flush=True)
if sys.argv[1]:
    __import__(sys.argv[1])
    print(sys.argv[2] + ": import " + sys.argv[1] + " ok")
"""


def ds_installed(py: Path, module: str = "", name: str = "") -> set[str]:
    out = subprocess.run(
        [str(py), "-c", _PROBE, module, name], capture_output=True, text=True, cwd=py.parent
    )
    if out.returncode:
        raise RuntimeError(f"import {module} failed:\n{out.stderr[-3000:]}")
    print(out.stdout.strip().splitlines()[-1], flush=True)
    line = next(x for x in out.stdout.splitlines() if x.startswith("DS_DISTS="))
    return {n for n in line.removeprefix("DS_DISTS=").split(",") if n}


def check_full(work: Path, wheels: dict[str, Path], site: Path) -> None:
    """`pip install ds-full` from the built wheels into a fresh venv (torch only), then the
    README's main job (2 ranks, shortened) through the installed `ds` command."""
    venv = work / "venv-ds-full"
    py = make_venv(venv, site)
    pip = pip_into(py)
    leftover = ds_installed(py)
    if leftover:
        raise RuntimeError(f"the fresh venv already holds {sorted(leftover)}")
    wheel_dir = wheels["ds-full"].parent
    sh([*pip, "install", "-c", str(CONSTRAINTS), "--find-links", str(wheel_dir), "ds-full"])
    present = ds_installed(py)
    # ds-full depends on every distribution but the framework integrations.
    expected = set(DISTS) - {"ds-hf", "ds-lightning"}
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
    print("ds-full: installed from wheels into a fresh venv; the main job ran", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None, help="distributions to check")
    ap.add_argument("--keep", type=Path, default=None, help="work directory to keep")
    ap.add_argument(
        "--full",
        action="store_true",
        help="also install the ds-full wheel set (into a fresh venv) and run the main job",
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
    site = torch_site(work)
    failures: list[str] = []
    for name in names:
        module = DISTS[name][1]
        declared = DECLARED.get(name, ())
        try:
            # A venv of its own: nothing a previous check installed can satisfy an import.
            py = make_venv(work / f"venv-{name}", site)
            sh(
                [
                    *pip_into(py),
                    "install",
                    "-c",
                    str(CONSTRAINTS),
                    str(wheels["ds-interfaces"]),
                    *(str(wheels[d]) for d in declared),
                    str(wheels[name]),
                ]
            )
            present = ds_installed(py, module, name)
            extra = present - {"ds-interfaces", name, *declared}
            if extra:
                raise RuntimeError(f"{name} pulled in other ds distributions: {sorted(extra)}")
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            failures.append(f"{name}: {exc}")
            print(f"FAILED {name}: {exc}", flush=True)
    if args.full:
        try:
            check_full(work, wheels, site)
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
