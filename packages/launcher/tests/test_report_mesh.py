"""``ds report --config``: the mesh groups a config gives, and this rank's inside a job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ds.interfaces.errors import ConfigError
from ds.launcher.report_mesh import mesh_report


def _config(tmp_path: Path, **cfg: object) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 8, **cfg}))
    return str(path)


def test_groups_follow_the_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    path = _config(tmp_path, tensor_parallel={"autotp_size": 2}, sequence_parallel_size=2)
    out = mesh_report(path, 8)
    assert out["sizes"] == {"dp": 2, "sp": 2, "tp": 2}
    assert out["groups"]["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out["groups"]["dp_sp"] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert out["this rank"] == {
        "rank": 5,
        "tp": [4, 5],
        "sp": [5, 7],
        "dp": [1, 5],
        "dp_sp": [1, 3, 5, 7],
    }


def test_sizes_that_do_not_divide_are_refused(tmp_path: Path) -> None:
    path = _config(tmp_path, tensor_parallel={"tp": {"tp_size": 3}})
    with pytest.raises(ConfigError, match="3 does not divide the world size 4"):
        mesh_report(path, 4)


def test_cli_prints_the_mesh_section(tmp_path: Path) -> None:
    path = _config(tmp_path, sequence_parallel_size=2)
    env = dict(os.environ, WORLD_SIZE="4")
    env.pop("RANK", None)
    out = subprocess.run(
        [sys.executable, "-m", "ds.launcher", "report", "--json", "--config", path],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=True,
    )
    mesh = json.loads(out.stdout)["parallel mesh"]
    assert mesh["sizes"] == {"dp": 2, "sp": 2, "tp": 1}
    assert mesh["groups"]["sp"] == [[0, 1], [2, 3]]
