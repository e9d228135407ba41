"""Who owns the ``ds`` command on PATH: ds's launcher or DeepSpeed's alias of its own launcher.

DeepSpeed's wheel installs a ``bin/ds`` too; in an environment with both, whichever was installed
last wins. ds's CLI is therefore also installed as ``ds-cli`` (a name DeepSpeed does not use) and
runs as ``python -m ds.launcher``; ``ds report`` says which package the ``ds`` on PATH belongs to.
"""

from __future__ import annotations

import os
import shutil
import sys
from importlib import metadata
from typing import Any

ALT_NAME = "ds-cli"


def _owning_distribution(path: str) -> str | None:
    """The installed distribution whose RECORD lists ``path`` (None if none does)."""
    real = os.path.realpath(path)
    for dist in metadata.distributions():
        for f in dist.files or ():
            if f.name != os.path.basename(path) or "bin" not in str(f).replace("\\", "/"):
                continue
            try:
                if os.path.realpath(str(dist.locate_file(f))) == real:
                    return f"{dist.metadata['Name']} {dist.version}"
            except Exception:  # a broken RECORD entry: look at the next one
                continue
    return None


def classify_script(text: str) -> str:
    """Which program a console script starts, from its text."""
    if "ds.launcher" in text:
        return "ds"
    if "deepspeed" in text:
        return "deepspeed"
    return "unknown"


def _describe(path: str) -> dict[str, Any]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read(4096)
    except OSError:
        text = ""
    program = classify_script(text)
    out: dict[str, Any] = {
        "path": path,
        "starts": program,
        "installed by": _owning_distribution(path) or "?",
    }
    if program != "ds":
        out["warning"] = (
            f"this 'ds' is DeepSpeed's launcher, not ds's; run ds as '{ALT_NAME}' or "
            "'python -m ds.launcher' (or reinstall ds-launcher to take the 'ds' name back)"
        )
    return out


def ds_command_owner(path_env: str | None = None, bin_dir: str | None = None) -> dict[str, Any]:
    """Which program and package the ``ds`` of this environment (and the one on PATH) belong to."""
    bin_dir = bin_dir or os.path.dirname(sys.executable)
    out: dict[str, Any] = {}
    here = os.path.join(bin_dir, "ds")
    out["in this environment"] = _describe(here) if os.path.exists(here) else None
    found = shutil.which("ds", path=path_env)
    if found is not None and os.path.realpath(found) != os.path.realpath(here):
        out["on PATH"] = _describe(found)
    elif found is None:
        out["on PATH"] = None
    alt = os.path.join(bin_dir, ALT_NAME)
    out[ALT_NAME] = alt if os.path.exists(alt) else shutil.which(ALT_NAME, path=path_env)
    return out
