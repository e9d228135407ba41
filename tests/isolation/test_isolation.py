"""Every distribution installs from its wheel and imports alone beside ds-interfaces."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_each_distribution_installs_and_imports_alone(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "isolation.py"), "--full", "--keep", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=1750,
    )
    tail = (out.stdout + out.stderr)[-6000:]
    assert out.returncode == 0, tail
    assert "install and import alone" in out.stdout
    assert "the main job ran" in out.stdout
