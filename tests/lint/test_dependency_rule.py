"""The dependency rule is enforced mechanically: import-linter contracts must all be kept."""

import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _lint_imports() -> subprocess.CompletedProcess[str]:
    exe = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).parent / "lint-imports")
    return subprocess.run(
        [exe, "--config", str(ROOT / ".importlinter"), "--no-cache"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )


def test_import_contracts_kept():
    out = _lint_imports()
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "broken" in out.stdout and " 0 broken" in out.stdout


def test_mypy_strict_on_interfaces():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--config-file",
            str(ROOT / "mypy.ini"),
            "-p",
            "ds.interfaces",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-4000:]


def test_ruff_lint_clean():
    exe = shutil.which("ruff") or str(pathlib.Path(sys.executable).parent / "ruff")
    out = subprocess.run(
        [exe, "check", "interfaces", "packages", "integrations", "tests", "tools", "conftest.py"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
    )
    assert out.returncode == 0, out.stdout[-4000:]
