"""Who owns the ``ds`` command on PATH: ds's launcher or DeepSpeed's alias of its own launcher.

DeepSpeed's wheel installs a ``bin/ds`` too; in an environment with both, whichever was installed
last wins. ds's CLI is therefore also installed as ``ds-cli`` (a name DeepSpeed does not use) and
runs as ``python -m ds.launcher``; ``ds report`` says which package the ``ds`` on PATH belongs to.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from importlib import metadata
from typing import Any

ALT_NAME = "ds-cli"


def _listing_distributions(path: str) -> list[metadata.Distribution]:
    """The installed distributions whose RECORD lists ``path``: after ds is reinstalled over
    DeepSpeed (or the other way round) both list ``bin/ds``, and uninstalling either deletes it."""
    real = os.path.realpath(path)
    found: list[metadata.Distribution] = []
    for dist in metadata.distributions():
        for f in dist.files or ():
            if f.name != os.path.basename(path) or "bin" not in str(f).replace("\\", "/"):
                continue
            try:
                if os.path.realpath(str(dist.locate_file(f))) == real:
                    found.append(dist)
                    break
            except Exception:  # a broken RECORD entry: look at the next one
                continue
    return found


def _label(dist: metadata.Distribution) -> str:
    return f"{dist.metadata['Name']} {dist.version}"


def _starts(dist: metadata.Distribution, program: str) -> bool:
    """Whether ``dist`` declares the console script ``ds`` that the file's content starts."""
    for ep in dist.entry_points:
        if ep.group == "console_scripts" and ep.name == "ds":
            return classify_script(ep.value) == program
    return False


def restore_command(dist: metadata.Distribution) -> str:
    """The command that puts ``dist``'s scripts back (its editable source when it has one)."""
    pip = f"{sys.executable} -m pip install --no-deps --force-reinstall"
    try:
        origin = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        origin = {}
    url = str(origin.get("url", ""))
    if origin.get("dir_info", {}).get("editable") and url.startswith("file://"):
        return f"{pip} -e {url[len('file://') :]}"
    return f"{pip} {dist.metadata['Name']}=={dist.version}"


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
    listers = _listing_distributions(path)
    # The owner is the distribution whose entry point the script's content starts, not whichever
    # RECORD happens to list the file first.
    owner = next((d for d in listers if _starts(d, program)), listers[0] if listers else None)
    out: dict[str, Any] = {
        "path": path,
        "starts": program,
        "installed by": _label(owner) if owner is not None else "?",
    }
    others = [d for d in listers if d is not owner]
    if program != "ds":
        out["warning"] = (
            f"this 'ds' is DeepSpeed's launcher, not ds's; run ds as '{ALT_NAME}' or "
            "'python -m ds.launcher' (or reinstall ds-launcher to take the 'ds' name back)"
        )
    elif others and owner is not None:
        names = ", ".join(_label(d) for d in others)
        first = str(others[0].metadata["Name"])
        out["also listed by"] = names
        out["warning"] = (
            f"{names} also lists this file in its RECORD: 'pip uninstall {first}' deletes ds's "
            f"'ds' command; afterwards restore it with '{restore_command(owner)}' (or run ds "
            f"as '{ALT_NAME}')"
        )
    return out


def _missing(path: str) -> dict[str, Any] | None:
    """ds-launcher installed but its ``bin/ds`` gone (another package's uninstall took it)."""
    try:
        dist = metadata.distribution("ds-launcher")
    except metadata.PackageNotFoundError:
        return None
    want = os.path.abspath(path)
    listed = [f for f in dist.files or () if f.name == "ds" and "bin" in str(f)]
    if not any(os.path.abspath(str(dist.locate_file(f))) == want for f in listed):
        return None
    return {
        "path": path,
        "starts": "(missing)",
        "warning": (
            f"ds's 'ds' command is gone (uninstalling a package that also listed it, such as "
            f"deepspeed, deletes it); restore it with '{restore_command(dist)}' or run ds as "
            f"'{ALT_NAME}'"
        ),
    }


def ds_command_owner(path_env: str | None = None, bin_dir: str | None = None) -> dict[str, Any]:
    """Which program and package the ``ds`` of this environment (and the one on PATH) belong to."""
    bin_dir = bin_dir or os.path.dirname(sys.executable)
    out: dict[str, Any] = {}
    here = os.path.join(bin_dir, "ds")
    out["in this environment"] = _describe(here) if os.path.exists(here) else _missing(here)
    found = shutil.which("ds", path=path_env)
    if found is not None and os.path.realpath(found) != os.path.realpath(here):
        out["on PATH"] = _describe(found)
    elif found is None:
        out["on PATH"] = None
    alt = os.path.join(bin_dir, ALT_NAME)
    out[ALT_NAME] = alt if os.path.exists(alt) else shutil.which(ALT_NAME, path=path_env)
    return out
