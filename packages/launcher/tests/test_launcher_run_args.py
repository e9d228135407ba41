from __future__ import annotations

from pathlib import Path

import pytest

from ds.launcher.agent import parse_core_list
from ds.launcher.run_args import UsageError, parse


def test_deepspeed_and_torchrun_spellings() -> None:
    a = parse(["--num_accelerators", "2", "--master-port", "1", "t.py"])
    assert (a.num_gpus, a.master_port) == (2, 1)
    b = parse(["--nproc_per_node", "3", "--nnodes", "1", "-H", "hf", "-i", "x", "t.py"])
    assert (b.nproc, b.num_nodes, b.hostfile, b.include) == (3, 1, "hf", "x")


def test_script_arguments_are_left_alone() -> None:
    a = parse(["--nproc", "2", "t.py", "--nproc", "9", "--launcher_args", "-x"])
    assert a.nproc == 2
    assert a.script_args == ["--nproc", "9", "--launcher_args", "-x"]


def test_launcher_args_value_may_start_with_dash() -> None:
    a = parse(["--launcher_args", "-i key -o X=1", "t.py"])
    assert a.launcher_args == "-i key -o X=1"


def test_each_rank_log_directory_is_optional(tmp_path: Path) -> None:
    script = tmp_path / "t.py"
    script.write_text("")
    assert parse(["--enable_each_rank_log", str(script)]).enable_each_rank_log == ""
    assert parse(["--enable_each_rank_log", "logs", str(script)]).enable_each_rank_log == "logs"


def test_usage_errors_are_one_line() -> None:
    with pytest.raises(UsageError, match=r"unrecognized arguments: --what .*ds run --help"):
        parse(["--what", "t.py"])


def test_core_list() -> None:
    assert parse_core_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    with pytest.raises(ValueError, match="is not N or N-M"):
        parse_core_list("a-b")
