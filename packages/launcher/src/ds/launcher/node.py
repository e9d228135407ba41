"""The local launcher: start this node's ranks with their environment and supervise them.

``ds run`` uses it directly on one machine; on many machines the multi-node runners start it on
every node as ``python -m ds.launcher.node ...`` (one agent per node).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ds.launcher.accel_env import devices_for_slots
from ds.launcher.procgroup import Member

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


@dataclass
class NodePlan:
    """Everything one node needs to start its ranks."""

    hosts: dict[str, list[int]]  # the whole job, in node order
    node_rank: int
    master_addr: str
    master_port: int
    user_command: list[str]
    extra_env: dict[str, str] = field(default_factory=dict)
    visible_device_vars: list[str] = field(default_factory=list)
    bind_cores: bool = False
    core_list: list[int] | None = None
    log_dir: Path | None = None
    local_rank_arg: bool = False

    @property
    def world_size(self) -> int:
        return sum(len(s) for s in self.hosts.values())

    @property
    def host(self) -> str:
        return list(self.hosts)[self.node_rank]

    @property
    def local_slots(self) -> list[int]:
        return self.hosts[self.host]

    @property
    def rank_offset(self) -> int:
        return sum(len(s) for s in list(self.hosts.values())[: self.node_rank])


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def split_cores(cores: Sequence[int], parts: int) -> list[list[int]]:
    """Contiguous, near-equal chunks; earlier ranks get the remainder cores."""
    if parts > len(cores):
        # More ranks than cores: share round-robin rather than fail.
        return [[cores[i % len(cores)]] for i in range(parts)]
    base, extra = divmod(len(cores), parts)
    out, start = [], 0
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(list(cores[start : start + n]))
        start += n
    return out


def rank_env(
    plan: NodePlan, local_rank: int, restart: int, base: Mapping[str, str], threads: int
) -> dict[str, str]:
    env = dict(base)
    env.update(plan.extra_env)
    nlocal = len(plan.local_slots)
    env.update(
        {
            "RANK": str(plan.rank_offset + local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(plan.world_size),
            "LOCAL_WORLD_SIZE": str(nlocal),
            "NODE_RANK": str(plan.node_rank),
            "GROUP_RANK": str(plan.node_rank),
            "CROSS_RANK": str(plan.node_rank),
            "CROSS_SIZE": str(len(plan.hosts)),
            "MASTER_ADDR": plan.master_addr,
            "MASTER_PORT": str(plan.master_port),
            "DS_RESTART_COUNT": str(restart),
            "TORCHELASTIC_RESTART_COUNT": str(restart),
            "PYTHONUNBUFFERED": env.get("PYTHONUNBUFFERED", "1"),
        }
    )
    # A user's explicit thread count wins; otherwise never oversubscribe the cores.
    for var in THREAD_VARS:
        if var not in base and var not in plan.extra_env:
            env[var] = str(threads)
    # Every local rank sees the node's selected devices in local-rank order and computes on index
    # LOCAL_RANK of them; a list the user set (here or with --env) is indexed, not overwritten.
    devices = devices_for_slots(plan.local_slots, plan.visible_device_vars, env)
    for var in plan.visible_device_vars:
        env[var] = devices
    return env


def build_members(plan: NodePlan, restart: int, base: Mapping[str, str]) -> list[Member]:
    nlocal = len(plan.local_slots)
    cores = plan.core_list if plan.core_list else available_cores()
    chunks = split_cores(cores, nlocal) if plan.bind_cores else None
    threads_default = max(1, len(cores) // nlocal)
    members = []
    for lr in range(nlocal):
        rank = plan.rank_offset + lr
        cpus = chunks[lr] if chunks is not None else None
        threads = len(cpus) if cpus is not None else threads_default
        argv = list(plan.user_command)
        if plan.local_rank_arg:
            argv.append(f"--local_rank={lr}")
        log_path = None
        if plan.log_dir is not None:
            suffix = f".restart{restart}" if restart else ""
            log_path = plan.log_dir / f"rank{rank}{suffix}.log"
        members.append(
            Member(
                label=f"rank {rank}",
                argv=argv,
                env=rank_env(plan, lr, restart, base, threads),
                prefix=f"[rank{rank}] ",
                log_path=log_path,
                cpus=cpus,
            )
        )
    return members
