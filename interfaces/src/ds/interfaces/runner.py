"""Runner contract: launcher back-ends that turn a job description into real command lines."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class LaunchSpec:
    """A resolved job: which hosts and slots, the user command and the environment to pass."""

    hosts: Mapping[str, Sequence[int]]  # host -> local slot indices, in order
    master_addr: str
    master_port: int
    user_command: Sequence[str]  # e.g. [python, -u, train.py, --arg]
    env: Mapping[str, str] = field(default_factory=dict)
    launcher_args: Sequence[str] = ()

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.hosts.values())


@runtime_checkable
class Runner(Protocol):
    def name(self) -> str: ...
    def backend_exists(self) -> bool: ...
    def get_cmd(self, spec: LaunchSpec) -> list[list[str]]: ...  # one argv per process to start
