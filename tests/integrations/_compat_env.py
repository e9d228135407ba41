"""A throwaway environment for the ``deepspeed`` API routes: a venv (no pip, a second or so) that
sees the dev environment's packages, so ``ds compat enable`` can write its ``.pth`` there without
touching the shared environment. ``extra_site`` adds more site dirs (e.g. a real DeepSpeed)."""

from __future__ import annotations

import site
import subprocess
import sys
import sysconfig
from pathlib import Path


def make_env(root: Path, extra_site: list[str] | None = None) -> Path:
    """Create the venv under ``root``; returns its python."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120
    )
    py = root / "bin" / "python"
    purelib = subprocess.run(
        [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    dev = [sysconfig.get_paths()["purelib"], *site.getsitepackages()]
    dirs = list(dict.fromkeys(d for d in [*dev, *(extra_site or [])] if Path(d).is_dir()))
    # addsitedir (unlike a plain path line) also runs the .pth files there: the editable installs.
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in dirs)
    Path(purelib, "ds_dev_env.pth").write_text(lines)
    return py
