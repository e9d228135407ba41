from __future__ import annotations

from pathlib import Path

from ds.launcher.node import NodePlan, build_members, split_cores


def plan(**kw: object) -> NodePlan:
    base: dict[str, object] = {
        "hosts": {"a": [0, 1], "b": [0, 2, 3]},
        "node_rank": 1,
        "master_addr": "a",
        "master_port": 1234,
        "user_command": ["python", "-u", "x.py"],
        "extra_env": {"FOO": "bar"},
        "visible_device_vars": ["CUDA_VISIBLE_DEVICES"],
    }
    base.update(kw)
    return NodePlan(**base)  # type: ignore[arg-type]


def test_rank_environment_on_second_node() -> None:
    members = build_members(plan(core_list=[0, 1, 2, 3, 4, 5]), restart=2, base={"HOME": "/r"})
    assert [m.label for m in members] == ["rank 2", "rank 3", "rank 4"]
    env = members[1].env
    assert env["RANK"] == "3"
    assert env["LOCAL_RANK"] == "1"
    assert env["WORLD_SIZE"] == "5"
    assert env["LOCAL_WORLD_SIZE"] == "3"
    assert env["NODE_RANK"] == env["CROSS_RANK"] == env["GROUP_RANK"] == "1"
    assert env["CROSS_SIZE"] == "2"
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("a", "1234")
    assert env["CUDA_VISIBLE_DEVICES"] == "0,2,3"
    assert env["DS_RESTART_COUNT"] == "2"
    assert env["FOO"] == "bar" and env["HOME"] == "/r"
    # 6 cores shared by 3 local ranks: 2 threads each, never more than the machine has.
    assert env["OMP_NUM_THREADS"] == "2"
    assert members[1].prefix == "[rank3] "
    assert members[0].cpus is None


def test_user_thread_count_wins_and_binding() -> None:
    members = build_members(
        plan(bind_cores=True, core_list=[0, 1, 2, 3, 4, 5, 6]),
        restart=0,
        base={"OMP_NUM_THREADS": "5"},
    )
    assert [m.cpus for m in members] == [[0, 1, 2], [3, 4], [5, 6]]
    assert members[0].env["OMP_NUM_THREADS"] == "5"
    assert members[0].env["MKL_NUM_THREADS"] == "3"
    assert members[1].env["MKL_NUM_THREADS"] == "2"


def test_local_rank_arg_and_log_paths(tmp_path: Path) -> None:
    members = build_members(plan(local_rank_arg=True, log_dir=tmp_path), restart=1, base={})
    assert members[2].argv[-1] == "--local_rank=2"
    assert members[2].log_path == tmp_path / "rank4.restart1.log"


def test_split_cores() -> None:
    assert split_cores([0, 1], 2) == [[0], [1]]
    assert split_cores([0, 1], 3) == [[0], [1], [0]]
    assert split_cores(list(range(5)), 2) == [[0, 1, 2], [3, 4]]
