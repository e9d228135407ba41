"""What travels to the GPU machine: the ds distributions built here as wheels, and the third-party
distributions they need (transitively, extras left out) that the machine's image lacks, pinned to
the versions installed in this environment (the versions the suite runs).

    python tools/gpu/carry.py dists     # the directories of the pure-Python ds distributions
    python tools/gpu/carry.py missing   # NAME==VERSION of each distribution to carry
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]
IMAGE = Path(__file__).with_name("image-packages.txt")
# ops-kernels' native extension is built on the machine for its Python; its source travels.
NATIVE = "packages/ops-kernels"
# Carried although the image has them: pydantic needs a recent typing-extensions, and one that
# is too old would stop every row; a carried copy comes first on the path.
ALWAYS = ("typing-extensions",)


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def image_packages(path: Path = IMAGE) -> set[str]:
    names: set[str] = set()
    for line in path.read_text().splitlines():
        names.update(canonical(n) for n in line.split("#", 1)[0].split())
    return names


def ds_dists(root: Path = ROOT) -> list[Path]:
    """Every distribution directory the check needs (interfaces and packages/*), native last."""
    dirs = [root / "interfaces", *sorted(p.parent for p in root.glob("packages/*/pyproject.toml"))]
    return [d for d in dirs if d != root / NATIVE] + [root / NATIVE]


def _requirements(reqs: list[str]) -> list[str]:
    out = []
    for req in reqs:
        if "extra ==" in req or "extra==" in req:
            continue
        out.append(canonical(re.split(r"[\s;<>=!~\[(]", req.strip(), maxsplit=1)[0]))
    return out


def missing(root: Path = ROOT, image: Path = IMAGE) -> dict[str, str]:
    """{name: version installed here} for every non-ds requirement the image lacks."""
    have = image_packages(image)
    todo: list[str] = list(ALWAYS)
    for d in ds_dists(root):
        project = tomllib.loads((d / "pyproject.toml").read_text())["project"]
        todo += _requirements(project.get("dependencies", []))
    found: dict[str, str] = {}
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name.startswith("ds-") or (name in have and name not in ALWAYS):
            continue
        seen.add(name)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"carry.py: {name} is needed but not installed here") from None
        found[name] = dist.version
        todo += _requirements(dist.requires or [])
    return dict(sorted(found.items()))


def main(argv: list[str]) -> int:
    if argv == ["dists"]:
        print("\n".join(str(d.relative_to(ROOT)) for d in ds_dists() if d != ROOT / NATIVE))
    elif argv == ["missing"]:
        print("\n".join(f"{n}=={v}" for n, v in missing().items()))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
