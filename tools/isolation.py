"""Prove that every ds distribution installs and imports alone beside ds-interfaces.

Builds each distribution's wheel, then for each distribution creates a fresh virtual environment
holding ds-interfaces, the ds distributions it declares and that one wheel, unpacked as pip unpacks
a pure-Python wheel. Its third-party requirements, as its wheels declare them and as those declare
theirs, are linked in from this interpreter's environment through a .pth file (as if preinstalled:
resolving and copying them per venv would cost more than the check). The module must import with
only that: a ds distribution or third-party package it uses without declaring is missing.

ds-full is installed by pip from the wheel set, with its `ds` command, and runs the README's main
job.

    python tools/isolation.py [--only ds-comm ...] [--keep DIR] [--full]
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
import zipfile
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


def wheel_requirements(wheel: Path) -> list[str]:
    """The distribution names a wheel's METADATA requires (markers for this interpreter, no
    extras)."""
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    reqs = [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.startswith("Requires-Dist:")]  # fmt: skip
    return _names(reqs)


def _names(reqs: list[str]) -> list[str]:
    names = []
    for req in reqs:
        name, _, marker = req.partition(";")
        if "extra" in marker or (marker.strip() and not _marker_holds(marker)):
            continue
        names.append(re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0])
    return names


def _marker_holds(marker: str) -> bool:
    from packaging.markers import Marker

    return Marker(marker.strip()).evaluate()


def _key(name: str) -> str:
    return name.lower().replace("_", "-")


def link_farm(site: Path, roots: list[str]) -> Path:
    """A folder of links to ``roots`` and everything they require, as installed in this
    interpreter: a checked venv sees it through a .pth file instead of a copy (torch is 1 GB)."""
    site.mkdir(parents=True, exist_ok=True)
    todo, seen = list(roots), set()
    while todo:
        name = todo.pop()
        if _key(name) in seen or _key(name).startswith("ds-"):
            continue
        seen.add(_key(name))
        dist = metadata.distribution(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        base = Path(str(dist.locate_file("")))
        for top in tops:
            link = site / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
        todo.extend(_names(dist.requires or []))
    return site


def make_venv(path: Path, site: Path) -> Path:
    """A venv without pip that sees the third-party packages linked in ``site``."""
    sh([sys.executable, "-m", "venv", "--without-pip", str(path)])
    py = path / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "ds_isolation_site.pth").write_text(str(site) + "\n")
    return py


def unpack(py: Path, wheels: list[Path]) -> None:
    """Install pure-Python wheels as pip does (their files into purelib, dist-info included),
    without a resolver: the caller chose exactly which distributions the venv holds."""
    purelib = next((py.parent.parent / "lib").glob("python*/site-packages"))
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            if any(".data/" in n for n in zf.namelist()):
                raise RuntimeError(f"{wheel.name} has a .data folder; install it with pip")
            zf.extractall(purelib)


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


def ds_requirements(wheel: Path) -> set[str]:
    return {_key(n) for n in wheel_requirements(wheel) if _key(n).startswith("ds-")}


def third_party(wheels: list[Path]) -> list[str]:
    return sorted(
        {n for w in wheels for n in wheel_requirements(w) if not _key(n).startswith("ds-")}
    )


def check_full(work: Path, wheels: dict[str, Path]) -> None:
    """ds-full and every distribution it declares, installed by pip from the built wheels (with
    the `ds` command) into a fresh venv, then the README's main job (2 ranks, shortened) through
    that command."""
    expected = set(DISTS) - {"ds-hf", "ds-lightning", "ds-full"}
    declared, todo = set(), ["ds-full"]
    while todo:  # what `pip install ds-full` would bring: its ds requirements and theirs
        for dep in ds_requirements(wheels[todo.pop()]) - declared:
            declared.add(dep)
            todo.append(dep)
    if declared != expected:
        raise RuntimeError(
            f"ds-full should bring every distribution but the framework integrations; "
            f"missing {sorted(expected - declared)}, unexpected {sorted(declared - expected)}"
        )
    chosen = [wheels[n] for n in sorted(expected | {"ds-full"})]
    site = link_farm(work / "site-ds-full", third_party(chosen))
    venv = work / "venv-ds-full"
    py = make_venv(venv, site)
    leftover = ds_installed(py)
    if leftover:
        raise RuntimeError(f"the fresh venv already holds {sorted(leftover)}")
    # --no-deps: the set is chosen above; pip still writes the console scripts.
    sh([*pip_into(py), "install", "--no-deps", "--no-index", *map(str, chosen)])
    present = ds_installed(py, "ds.full", "ds-full")
    if present != expected | {"ds-full"}:
        raise RuntimeError(f"the ds-full venv holds {sorted(present)}")
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
            "6",
            "--out",
            str(out),
        ],
        cwd=work,
    )
    if not (out / "checkpoints").exists():
        raise RuntimeError("the main job ran but wrote no checkpoint")
    print("ds-full: installed from wheels into a fresh venv; the main job ran", flush=True)


def check_alone(work: Path, wheels: dict[str, Path], name: str) -> None:
    """``name`` beside ds-interfaces and the ds distributions it declares, in a venv of its own
    (nothing a previous check installed can satisfy an import), with only the third-party
    packages those wheels require."""
    allowed = {"ds-interfaces", name, *DECLARED.get(name, ())}
    chosen = [wheels[n] for n in sorted(allowed)]
    for wheel, n in zip(chosen, sorted(allowed)):
        undeclared = ds_requirements(wheel) - allowed
        if undeclared:
            raise RuntimeError(f"{n} requires {sorted(undeclared)}, beyond what {name} may use")
    site = link_farm(work / f"site-{name}", third_party(chosen))
    py = make_venv(work / f"venv-{name}", site)
    unpack(py, chosen)
    present = ds_installed(py, DISTS[name][1], name)
    if present != allowed:
        raise RuntimeError(f"{name}'s venv holds {sorted(present)}, expected {sorted(allowed)}")


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
    failures: list[str] = []
    checks = [(name, lambda n=name: check_alone(work, wheels, n)) for name in names]
    if args.full:
        checks.append(("ds-full", lambda: check_full(work, wheels)))
    for name, check in checks:
        try:
            check()
        except (subprocess.CalledProcessError, RuntimeError) as exc:
            failures.append(f"{name}: {exc}")
            print(f"FAILED {name}: {exc}", flush=True)
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
