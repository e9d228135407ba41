"""ds beside an installed DeepSpeed: ds's CLI under a name DeepSpeed does not install (and as
``python -m ds.launcher``), ``ds report`` naming the owner of ``ds``, and the deepspeed import hook
standing aside for a real DeepSpeed (import and distribution metadata alike)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ds.launcher.owner import ALT_NAME, classify_script, ds_command_owner

BIN = Path(sys.executable).parent
# DeepSpeed 0.19.8's bin/ds, verbatim (an alias of its launcher).
DEEPSPEED_DS_SCRIPT = """#!/usr/bin/python3

from deepspeed.launcher.runner import main

if __name__ == '__main__':
    main()
"""


@pytest.mark.slow  # starts Python processes (seconds each on an idle machine)
def test_alternative_name_and_module_form_run_ds() -> None:
    for cmd in ([str(BIN / ALT_NAME), "--version"], [sys.executable, "-m", "ds.launcher", "-V"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and proc.stdout.startswith("ds "), (cmd, proc.stderr)


def test_report_names_the_owner_of_ds(tmp_path: Path) -> None:
    mine = ds_command_owner(path_env="", bin_dir=str(BIN))
    assert mine["in this environment"]["starts"] == "ds"
    assert mine["in this environment"]["installed by"].startswith("ds-launcher ")
    assert mine[ALT_NAME] == str(BIN / ALT_NAME)
    # an environment where DeepSpeed was installed last: its bin/ds replaced ds's
    (tmp_path / "ds").write_text(DEEPSPEED_DS_SCRIPT)
    (tmp_path / "ds").chmod(0o755)
    theirs = ds_command_owner(path_env="", bin_dir=str(tmp_path))
    entry = theirs["in this environment"]
    assert entry["starts"] == "deepspeed"
    assert ALT_NAME in entry["warning"] and "python -m ds.launcher" in entry["warning"]
    # and on PATH, when PATH finds DeepSpeed's before this environment's
    on_path = ds_command_owner(path_env=str(tmp_path), bin_dir=str(BIN))
    assert on_path["on PATH"]["starts"] == "deepspeed"
    assert classify_script((BIN / "ds").read_text()) == "ds"


@pytest.mark.slow  # starts Python processes (seconds each on an idle machine)
def test_report_command_prints_the_section() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ds.launcher", "report", "--json"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert '"ds command"' in proc.stdout


def _fake_real_deepspeed(root: Path) -> None:
    """A stand-in for an installed DeepSpeed: a package and its dist-info on sys.path."""
    (root / "deepspeed").mkdir()
    (root / "deepspeed" / "__init__.py").write_text("REAL = True\n__version__ = '0.19.8'\n")
    info = root / "deepspeed-0.19.8.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: deepspeed\nVersion: 0.19.8\n")


PROBE = textwrap.dedent(
    """
    import importlib.metadata as md, sys
    from ds.full.compat import _hook
    _hook.activate()  # what 'ds compat enable' does at interpreter start
    import deepspeed
    print("module", getattr(deepspeed, "REAL", False), deepspeed.__name__)
    print("version", md.version("deepspeed"))
    import ds.full.compat as compat
    try:
        compat.install()
        print("install ok")
    except Exception as e:
        print("install refused", type(e).__name__)
    """
)


@pytest.mark.slow  # starts Python processes (seconds each on an idle machine)
def test_hook_never_shadows_a_real_deepspeed(tmp_path: Path) -> None:
    _fake_real_deepspeed(tmp_path)
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env
    )
    assert proc.returncode == 0, proc.stderr
    assert "module True deepspeed" in proc.stdout
    assert "version 0.19.8\n" in proc.stdout  # the real distribution answers, not ds's
    assert "install refused ConfigError" in proc.stdout
    assert "served by ds" not in proc.stderr  # nothing was announced: ds served nothing


@pytest.mark.slow  # starts Python processes (seconds each on an idle machine)
def test_hook_serves_and_announces_where_no_deepspeed_is_installed() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "module False ds.full.compat.deepspeed" in proc.stdout
    assert "version 0.19.8+ds" in proc.stdout and "install ok" in proc.stdout
    lines = [ln for ln in proc.stderr.splitlines() if "served by ds" in ln]
    assert len(lines) == 1 and "'deepspeed' API" in lines[0]


@pytest.mark.parametrize("spec", ["deepspeed>=0.9.3", "deepspeed>=0.16.4"])
def test_served_version_satisfies_what_integrations_require(spec: str) -> None:
    from packaging.requirements import Requirement

    from ds.full.compat._hook import served_version

    assert Requirement(spec).specifier.contains(served_version(), prereleases=True)


REAL_DS_SITE = Path(
    os.environ.get("DS_REFERENCE_DEEPSPEED_SITE", "/work/dsref/lib/python3.11/site-packages")
)


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(600)
@pytest.mark.skipif(
    not (REAL_DS_SITE / "deepspeed").is_dir(),
    reason="needs a real DeepSpeed install (set DS_REFERENCE_DEEPSPEED_SITE to its site-packages)",
)
def test_with_real_deepspeed_installed(tmp_path: Path) -> None:
    """A throwaway venv holding ds and a real DeepSpeed 0.19.8, with 'ds compat enable' done:
    'import deepspeed' is DeepSpeed's, and ds's routes still run (2 ranks)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from _compat_env import make_env

    py = make_env(tmp_path / "venv", extra_site=[str(REAL_DS_SITE)])
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=500)
    enabled = run([str(py), "-m", "ds.launcher", "compat", "enable"])
    assert enabled.returncode == 0 and "a real DeepSpeed is installed" in enabled.stdout
    probe = run([str(py), "-c", PROBE], env=dict(os.environ, DS_ACCELERATOR="cpu"))
    assert probe.returncode == 0, probe.stderr[-3000:]
    assert "version 0.19.8\n" in probe.stdout and "install refused ConfigError" in probe.stdout
    assert "served by ds" not in probe.stderr
    here = Path(__file__).with_name("deepspeed_style")
    train = run(
        [str(py), "-m", "ds.launcher", "run", "--nproc", "2", str(here / "run_with_shim.py"),
         str(here / "train.py"), "--deepspeed", "--deepspeed_config", str(here / "ds_config.json"),
         "--out", str(tmp_path / "out.json"), "--ckpt", str(tmp_path / "ckpt")],
        cwd=tmp_path,
    )  # fmt: skip
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text())["global_steps"] == 12
