"""Device slots per node: counting visible devices, mapping slots through the user's visibility
list, and refusing more ranks than devices before anything starts.

There is no GPU here, so the device count comes from the visibility variable (as on a real node)
or from the injectable driver probe that ``prepare`` takes in place of /proc/driver/nvidia.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ds.launcher import accel_env, agent, run_cmd
from ds.launcher.node import NodePlan, build_members


@pytest.fixture
def script(tmp_path: Path) -> str:
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


@pytest.fixture
def cuda_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    for var in ("CUDA_VISIBLE_DEVICES", "DS_HOSTFILE", "RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def _visible(sup: object) -> list[str]:
    members = sup.make_members(0)  # type: ignore[attr-defined]
    return [m.env["CUDA_VISIBLE_DEVICES"] for m in members]


def test_nproc_above_probed_count_is_one_line_exit_2(
    cuda_env: pytest.MonkeyPatch, script: str, capsys: pytest.CaptureFixture[str]
) -> None:
    def two(kind: str) -> int:
        return 2

    assert run_cmd.main(["--nproc", "8", script], device_probe=two) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "--nproc 8 needs 8 cuda device(s) on this node but 2 are visible" in err[0]
    assert "reported by the driver" in err[0]


def test_user_visibility_list_is_the_count_and_the_map(
    cuda_env: pytest.MonkeyPatch, script: str
) -> None:
    def eight(kind: str) -> int:
        return 8

    cuda_env.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    # The user's list, not the driver's 8, bounds the node: 4 ranks by default.
    assert _visible(run_cmd.prepare([script], device_probe=eight)) == ["4,5,6,7"] * 4
    sup = run_cmd.prepare(["--include", "localhost:1,3", script], device_probe=eight)
    assert _visible(sup) == ["5,7", "5,7"]
    with pytest.raises(accel_env.DeviceCountError, match=r"CUDA_VISIBLE_DEVICES='4,5,6,7'"):
        run_cmd.prepare(["--nproc", "5", script], device_probe=eight)


def test_default_rank_count_follows_the_probe(cuda_env: pytest.MonkeyPatch, script: str) -> None:
    def three(kind: str) -> int:
        return 3

    members = run_cmd.prepare([script], device_probe=three).make_members(0)  # type: ignore[attr-defined]
    assert [m.env["LOCAL_RANK"] for m in members] == ["0", "1", "2"]
    assert {m.env["CUDA_VISIBLE_DEVICES"] for m in members} == {"0,1,2"}


def test_hostfile_slots_beyond_visible_devices_are_refused(
    cuda_env: pytest.MonkeyPatch, script: str, tmp_path: Path
) -> None:
    hf = tmp_path / "hostfile"
    hf.write_text("localhost slots=4\n")
    cuda_env.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(
        accel_env.DeviceCountError, match=r"localhost:3 \(device slot 3\) needs 4 cuda"
    ):
        run_cmd.prepare(["--hostfile", str(hf), "--include", "localhost:3", script])
    sup = run_cmd.prepare(["--hostfile", str(hf), "--include", "localhost:0,1", script])
    assert _visible(sup) == ["0,1", "0,1"]


def test_cpu_ranks_are_not_counted(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")

    def none(kind: str) -> int:
        return 0

    members = run_cmd.prepare(["--nproc", "3", script], device_probe=none).make_members(0)  # type: ignore[attr-defined]
    assert len(members) == 3


def test_rank_env_maps_slots_through_a_list_given_with_env() -> None:
    plan = NodePlan(
        hosts={"a": [0, 2]},
        node_rank=0,
        master_addr="a",
        master_port=1,
        user_command=["x"],
        extra_env={"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb,GPU-cc"},
        visible_device_vars=["CUDA_VISIBLE_DEVICES"],
    )
    envs = [m.env for m in build_members(plan, 0, {"CUDA_VISIBLE_DEVICES": "9"})]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["GPU-aa,GPU-cc"] * 2
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]


def test_agent_refuses_slots_its_node_cannot_see(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from ds.launcher.runners.base import encode_hosts

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    rc = agent.main(
        [
            f"--world_info={encode_hosts({'nodeb': [0, 1]})}",
            "--node_rank=0",
            "--master_addr=a",
            "--master_port=1",
            "--accelerator=cuda",
            "--",
            "true",
        ]
    )
    assert rc == 2
    err = capsys.readouterr().err
    assert "needs 2 cuda device(s) on this node but 1 are visible" in err
