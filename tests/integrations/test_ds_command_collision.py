"""ds reinstalled over DeepSpeed: both RECORDs list ``bin/ds``, so ``pip uninstall deepspeed``
deletes ds's command. ``ds report`` names the real owner (from the script's content and the entry
point it starts), warns before the uninstall, says the command is gone after it, and the restore
command it prints brings it back. Real pip in a throwaway venv; DeepSpeed is a local wheel that
installs its ``bin/ds`` as DeepSpeed 0.19.8's setup.py does (a ``scripts=`` file), so nothing is
downloaded."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _compat_env import make_env
from test_deepspeed_coexistence import DEEPSPEED_DS_SCRIPT

from ds.launcher.owner import classify_script

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow]


def _fake_deepspeed_wheel(out: Path) -> Path:
    name = "deepspeed-0.19.8"
    files = {
        "deepspeed/__init__.py": "__version__ = '0.19.8'\n",
        f"{name}.data/scripts/ds": DEEPSPEED_DS_SCRIPT.replace("#!/usr/bin/python3", "#!python"),
        f"{name}.dist-info/METADATA": "Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n",
        f"{name}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{path},,\n" for path in files) + f"{name}.dist-info/RECORD,,\n"
    wheel = out / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in {**files, f"{name}.dist-info/RECORD": record}.items():
            z.writestr(path, text)
    return wheel


def _pip(py: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", str(py), "--disable-pip-version-check", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def _ds_command(py: Path) -> dict[str, object]:
    proc = subprocess.run(
        [str(py), "-m", "ds.launcher", "report", "--json"],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    entry: dict[str, object] = json.loads(proc.stdout)["ds command"]["in this environment"]
    return entry


@pytest.mark.timeout(600)
def test_uninstalling_deepspeed_over_ds_is_detected_and_repaired(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    deepspeed = _fake_deepspeed_wheel(wheels)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    proc = subprocess.run(
        [*build, "--no-index", "-w", str(wheels), str(ROOT / "packages" / "launcher")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher = next(wheels.glob("ds_launcher-*.whl"))

    py = make_env(tmp_path / "venv")  # sees the dev environment for ds-launcher's dependencies
    bin_ds = py.parent / "ds"
    _pip(py, "install", "--no-index", "--no-deps", str(deepspeed))
    assert classify_script(bin_ds.read_text()) == "deepspeed"
    _pip(py, "install", "--no-index", "--no-deps", str(launcher))  # ds over DeepSpeed
    assert classify_script(bin_ds.read_text()) == "ds"

    entry = _ds_command(py)
    assert entry["starts"] == "ds" and entry["installed by"] == "ds-launcher 0.1.0"
    assert entry["also listed by"] == "deepspeed 0.19.8"
    warning = str(entry["warning"])
    assert "'pip uninstall deepspeed' deletes ds's 'ds' command" in warning
    restore = warning.split("restore it with '")[1].split("'")[0]
    assert restore == f"{py} -m pip install --no-deps --force-reinstall ds-launcher==0.1.0"

    _pip(py, "uninstall", "-y", "deepspeed")  # what the warning is about: it takes bin/ds along
    assert not bin_ds.exists()
    gone = _ds_command(py)
    assert gone["starts"] == "(missing)" and restore in str(gone["warning"])

    # The printed restore command (this venv has no pip of its own: the dev pip drives it, and
    # the wheel comes from the local directory instead of an index).
    args = restore.split(" -m pip ")[1].split()
    _pip(py, *args[:-1], "--no-index", "--find-links", str(wheels), args[-1])
    assert classify_script(bin_ds.read_text()) == "ds"
    again = _ds_command(py)
    assert again["installed by"] == "ds-launcher 0.1.0" and "warning" not in again
