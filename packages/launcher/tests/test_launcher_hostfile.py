from __future__ import annotations

from pathlib import Path

import pytest

from ds.interfaces.errors import ConfigError
from ds.launcher.hostfile import (
    apply_filters,
    limit,
    parse_filter,
    parse_hostfile_text,
    read_hostfile,
)

TEXT = """
# cluster
worker-0 slots=4   # first
worker-1 slots=2

worker-2 slots=3
"""


def test_parse_hostfile_comments_blank_lines_and_order() -> None:
    res = parse_hostfile_text(TEXT)
    assert list(res) == ["worker-0", "worker-1", "worker-2"]
    assert res["worker-0"] == [0, 1, 2, 3]
    assert res["worker-1"] == [0, 1]


@pytest.mark.parametrize(
    ("text", "line", "needle"),
    [
        ("a slots=2\nb slots=x\n", 2, "slots=N"),
        ("a slots=2\n\nb\n", 3, "HOST slots=N"),
        ("a slots=0\n", 1, "slots must be >= 1"),
        ("a slots=1\na slots=2\n", 2, "listed twice"),
        ("a slots=1 extra\n", 1, "HOST slots=N"),
    ],
)
def test_invalid_hostfile_names_file_and_line(text: str, line: int, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_hostfile_text(text, source="hf")
    assert str(err.value).startswith(f"hf:{line}:")
    assert needle in str(err.value)


def test_empty_hostfile(tmp_path: Path) -> None:
    p = tmp_path / "hosts"
    p.write_text("# nothing here\n\n")
    with pytest.raises(ConfigError, match="no hosts found"):
        read_hostfile(p)


def test_missing_hostfile(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_hostfile(tmp_path / "nope")


def test_parse_filter() -> None:
    assert parse_filter("h1:0,2@h2", "--include") == {"h1": [0, 2], "h2": None}
    with pytest.raises(ConfigError, match="not a non-negative integer"):
        parse_filter("h1:a", "--include")
    with pytest.raises(ConfigError, match="empty host entry"):
        parse_filter("h1@@h2", "--include")


def test_include_keeps_named_slots_in_hostfile_order() -> None:
    res = parse_hostfile_text(TEXT)
    out = apply_filters(res, include="worker-2@worker-0:1,3")
    assert out == {"worker-0": [1, 3], "worker-2": [0, 1, 2]}


def test_exclude_drops_slots_and_hosts() -> None:
    res = parse_hostfile_text(TEXT)
    out = apply_filters(res, exclude="worker-1@worker-0:0")
    assert out == {"worker-0": [1, 2, 3], "worker-2": [0, 1, 2]}


def test_filter_errors() -> None:
    res = parse_hostfile_text(TEXT)
    with pytest.raises(ConfigError, match="unknown host 'worker-9'"):
        apply_filters(res, include="worker-9")
    with pytest.raises(ConfigError, match="has no slot 5"):
        apply_filters(res, include="worker-1:5")
    with pytest.raises(ConfigError, match="mutually exclusive"):
        apply_filters(res, include="worker-1", exclude="worker-0")
    with pytest.raises(ConfigError, match="leaves no hosts"):
        apply_filters({"a": [0]}, exclude="a:0")


def test_limit_nodes_and_slots() -> None:
    res = parse_hostfile_text(TEXT)
    assert limit(res, 2, 2) == {"worker-0": [0, 1], "worker-1": [0, 1]}
    with pytest.raises(ConfigError, match="only 3 host"):
        limit(res, 4, None)
    with pytest.raises(ConfigError, match="has only 2 slot"):
        limit(res, None, 3)
