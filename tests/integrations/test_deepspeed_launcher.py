"""DeepSpeed's launcher surface: ``deepspeed.launcher.runner``'s hostfile helpers with DeepSpeed's
return shapes, its argument rules, and the ``deepspeed`` command ``ds compat enable`` installs
(2 CPU ranks through ``ds run``), which ``disable`` removes and which never replaces a
``deepspeed`` command that is not ds's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _compat_env import make_env

from ds.full.compat.deepspeed.launcher import runner

HOSTS = {"worker-0": [0, 1, 2, 3], "worker-1": [0, 1, 2, 3]}


def test_resource_filters_keep_deepspeeds_semantics() -> None:
    f = runner.parse_resource_filter
    assert f(HOSTS) == HOSTS
    assert f(HOSTS, include_str="worker-1:0,3") == {"worker-1": [0, 3]}
    assert f(HOSTS, include_str="worker-0:1@worker-0:0,1") == {"worker-0": [0, 1]}
    assert f(HOSTS, exclude_str="worker-1") == {"worker-0": [0, 1, 2, 3]}
    assert f(HOSTS, exclude_str="worker-0:0,1@worker-1:3") == {
        "worker-0": [2, 3], "worker-1": [0, 1, 2],
    }  # fmt: skip
    assert f({"worker-0": [0, 1]}, exclude_str="worker-0") == {}
    assert list(f(HOSTS, include_str="worker-1@worker-0")) == ["worker-0", "worker-1"]
    for kwargs, match in [
        ({"include_str": "A", "exclude_str": "B"}, "mutually exclusive"),
        ({"include_str": "worker-9"}, "not in the hostfile"),
        ({"exclude_str": "worker-0:7"}, "no slot"),
    ]:
        with pytest.raises(ValueError, match=match):
            f(HOSTS, **kwargs)


def test_hostfile_and_world_info(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# nodes\nworker-1 slots=2\n\nlocalhost slots=4\n")
    assert runner.fetch_hostfile(str(hostfile)) == {"worker-1": 2, "localhost": 4}
    assert runner.fetch_hostfile(str(tmp_path / "none")) is None
    for bad in ("worker-1 slots=2\nworker-1 slots=1", "this is bad slots=1", "missingslots", ""):
        with pytest.raises(ValueError):
            runner._parse_hostfile(bad.splitlines())
    encoded = runner.encode_world_info({"worker-0": [0, 1]})
    assert runner.decode_world_info(encoded) == {"worker-0": [0, 1]}
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_=")


def test_launcher_arguments_map_onto_ds_run() -> None:
    argv = "--num_gpus 2 --log_level warning --launcher_arg=-x --master_port 1234 t.py --lr 1"
    assert runner.ds_run_argv(argv.split()) == [
        "run", "--num_gpus", "2", "--master_port", "1234", "--launcher_args", "-x",
        "t.py", "--lr", "1",
    ]  # fmt: skip
    args = runner.parse_args(["--no_local_rank", "-H", "hf", "t.py", "x"])
    assert args.no_local_rank and args.hostfile == "hf" and args.user_args == ["x"]
    for argv, match in [
        ("--num_nodes 1 -i localhost foo.py", "cannot be combined"),
        ("--num_gpus 1 -e localhost foo.py", "cannot be combined"),
        ("--autotuning tune foo.py", "ds autotune"),
        ("--elastic_training foo.py", "max_restarts"),
    ]:
        with pytest.raises(ValueError, match=match):
            runner.main(argv.split())


SCRIPT = """
import json, sys
import deepspeed, torch
deepspeed.init_distributed()
import deepspeed.comm as dist
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    json.dump({"world": dist.get_world_size(), "sum": float(t)}, open(sys.argv[-1], "w"))
"""


@pytest.mark.multiprocess
@pytest.mark.timeout(300)
def test_enable_installs_a_deepspeed_command_and_disable_removes_it(tmp_path: Path) -> None:
    py = make_env(tmp_path / "venv")
    command = tmp_path / "venv" / "bin" / "deepspeed"

    def compat(action: str) -> str:
        cmd = [str(py), "-m", "ds.launcher", "compat", action]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc.stdout + proc.stderr

    assert "deepspeed command:" in compat("enable") and os.access(command, os.X_OK)
    (tmp_path / "s.py").write_text(SCRIPT)
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [str(command), "--num_gpus", "2", "--master_port", "29617", "s.py", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads(out.read_text()) == {"world": 2, "sum": 3.0}
    bad = subprocess.run(
        [str(command), "--num_gpus", "1", "-i", "localhost", "s.py"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert bad.returncode != 0 and "cannot be combined" in bad.stderr
    compat("disable")
    assert not command.exists()
    command.write_text("#!/bin/sh\necho real deepspeed\n")  # e.g. DeepSpeed's own script
    assert "is not ds's" in compat("enable")
    assert command.read_text() == "#!/bin/sh\necho real deepspeed\n"
    compat("disable")
    assert command.exists()  # not ours: left in place


def test_no_deepspeed_command_beside_a_real_deepspeed(tmp_path: Path) -> None:
    real = tmp_path / "real"
    (real / "deepspeed").mkdir(parents=True)
    (real / "deepspeed" / "__init__.py").write_text("__version__ = '0.19.8'\n")
    py = make_env(tmp_path / "venv", extra_site=[str(real)])
    cmd = [str(py), "-m", "ds.launcher", "compat", "enable"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no deepspeed command written" in proc.stderr
    assert not (tmp_path / "venv" / "bin" / "deepspeed").exists()


def test_core_range_lists_follow_deepspeeds_rules() -> None:
    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.utils import numa

    assert numa.parse_range_list("0,2-4,6,8-9") == [0, 2, 3, 4, 6, 8, 9]
    for bad in ("0,2-6,5-9", "8,2-6", "1,6-2", "x"):
        with pytest.raises(ValueError):
            numa.parse_range_list(bad)
    with pytest.raises(FeatureNotAvailableError, match="bind_cores_to_rank"):
        numa.get_numactl_cmd("0-3", 2, 0)
