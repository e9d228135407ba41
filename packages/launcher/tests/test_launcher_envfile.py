from __future__ import annotations

from pathlib import Path

import pytest

from ds.interfaces.errors import ConfigError
from ds.launcher.envfile import exported, load_env_file, parse_env_flags, parse_env_lines


def test_env_file_lines() -> None:
    text = "# c\nA=1\nexport B='two words'\nC=\"x=y\"\n\n"
    assert parse_env_lines(text, "f") == {"A": "1", "B": "two words", "C": "x=y"}


def test_env_file_error_names_line() -> None:
    with pytest.raises(ConfigError, match=r"^f:2: expected KEY=VALUE"):
        parse_env_lines("A=1\nnot a pair\n", "f")


def test_ds_env_preferred_over_deepspeed_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / ".deepspeed_env").write_text("X=old\n")
    assert load_env_file(tmp_path) == {"X": "old"}
    (tmp_path / ".ds_env").write_text("X=new\n")
    assert load_env_file(tmp_path) == {"X": "new"}


def test_env_flags_and_exported() -> None:
    assert parse_env_flags(["A=1", "B="]) == {"A": "1", "B": ""}
    with pytest.raises(ConfigError, match="KEY=VAL"):
        parse_env_flags(["novalue"])
    assert exported({"NCCL_DEBUG": "INFO", "HOME": "/root", "PYTHONPATH": "/x"}) == {
        "NCCL_DEBUG": "INFO",
        "PYTHONPATH": "/x",
    }
