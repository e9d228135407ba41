"""Find rank, world size, local rank and the rendezvous address from the environment.

Sources, first complete one wins:

1. ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``MASTER_ADDR``/``MASTER_PORT`` (the ds launcher, torchrun)
2. OpenMPI: ``OMPI_COMM_WORLD_RANK``/``_SIZE``/``_LOCAL_RANK``/``_LOCAL_SIZE``
3. MPICH / Intel MPI (hydra): ``PMI_RANK``/``PMI_SIZE``, ``MPI_LOCALRANKID``/``MPI_LOCALNRANKS``
4. SLURM: ``SLURM_PROCID``/``SLURM_NTASKS``/``SLURM_LOCALID``, the first host of
   ``SLURM_JOB_NODELIST`` as the rendezvous address

Under MPI without ``MASTER_ADDR``: a job on one node rendezvouses on 127.0.0.1; a multi-node job
asks mpi4py for rank 0's host name when it is installed, and otherwise is a ConfigError that says
to export ``MASTER_ADDR``.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from ds.interfaces.errors import ConfigError

DEFAULT_PORT = 29500


@dataclass(frozen=True)
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str  # "env", "openmpi", "mpich", "slurm", "single", "explicit"


def _int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment variable {key}={value!r} is not an integer") from None


def _first_bracket_item(spec: str) -> str:
    """'01-04,07' -> '01' (zero padding kept)."""
    first = spec.split(",")[0]
    return first.split("-")[0]


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM host list: 'node[01-03],gpu7' -> ['node01', 'node02', 'node03', 'gpu7']."""
    hosts: list[str] = []
    for item in _split_top(nodelist):
        hosts.extend(_expand_item(item))
    return hosts


def _split_top(nodelist: str) -> list[str]:
    items: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in nodelist.strip():
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            items.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        items.append("".join(cur))
    return [i for i in items if i]


def _expand_item(item: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", item)
    if m is None:
        return [item]
    head, tail = item[: m.start()], item[m.end() :]
    out: list[str] = []
    for part in m.group(1).split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            width = len(lo)
            for n in range(int(lo), int(hi) + 1):
                out.extend(head + str(n).zfill(width) + rest for rest in _expand_item(tail))
        else:
            out.extend(head + part + rest for rest in _expand_item(tail))
    return out


def first_host(nodelist: str) -> str:
    """First host of a SLURM node list without expanding all of it."""
    items = _split_top(nodelist)
    if not items:
        raise ConfigError(f"SLURM node list {nodelist!r} is empty; cannot pick a rendezvous host")
    item = items[0]
    while "[" in item:
        m = re.search(r"\[([^\]]*)\]", item)
        if m is None:
            raise ConfigError(f"cannot parse SLURM node list {nodelist!r}")
        item = item[: m.start()] + _first_bracket_item(m.group(1)) + item[m.end() :]
    return item


def _mpi_master_addr(world: int, local_size: int | None, source: str) -> str:
    if local_size is not None and local_size == world:
        return "127.0.0.1"
    try:
        from mpi4py import MPI  # type: ignore[import-not-found]
    except ImportError:
        raise ConfigError(
            f"started by {source} across several nodes but MASTER_ADDR is not set; export "
            "MASTER_ADDR=<host of rank 0> (e.g. mpirun -x MASTER_ADDR=...) or install mpi4py "
            "so ds can discover it"
        ) from None
    comm = MPI.COMM_WORLD
    return str(comm.bcast(socket.gethostname() if comm.Get_rank() == 0 else None, root=0))


def _port(env: Mapping[str, str], default_port: int) -> int:
    port = _int(env, "MASTER_PORT")
    return port if port is not None else default_port


def discover(
    env: Mapping[str, str] | None = None,
    default_port: int = DEFAULT_PORT,
    auto_mpi_discovery: bool = True,
) -> DistEnv | None:
    """The distributed environment this process was started in, or None when there is none.

    Raises ConfigError when a source is only partly present (e.g. RANK without WORLD_SIZE).
    """
    env = os.environ if env is None else env
    rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    if rank is not None or world is not None:
        if rank is None or world is None:
            missing = "WORLD_SIZE" if world is None else "RANK"
            raise ConfigError(
                f"{'RANK' if rank is not None else 'WORLD_SIZE'} is set but {missing} is not; "
                "set both (plus MASTER_ADDR and MASTER_PORT), or start the job with `ds run`"
            )
        _check_range(rank, world, "RANK", "WORLD_SIZE")
        local = _int(env, "LOCAL_RANK")
        addr = env.get("MASTER_ADDR")
        if addr is None:
            if world > 1:
                raise ConfigError(
                    "RANK and WORLD_SIZE are set but MASTER_ADDR is not; export "
                    "MASTER_ADDR=<host of rank 0> and MASTER_PORT=<free port>"
                )
            addr = "127.0.0.1"
        return DistEnv(rank, world, local or 0, addr, _port(env, default_port), "env")
    if not auto_mpi_discovery:
        return None
    for source, rk, sz, lr, ls in (
        (
            "openmpi",
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ):
        rank, world = _int(env, rk), _int(env, sz)
        if rank is None and world is None:
            continue
        if rank is None or world is None:
            raise ConfigError(
                f"{rk if rank is not None else sz} is set but {sz if world is None else rk} "
                f"is not; the {source} environment is incomplete"
            )
        _check_range(rank, world, rk, sz)
        local = _int(env, lr)
        if local is None and source == "mpich":
            local = _int(env, "PMI_LOCAL_RANK")
        addr = env.get("MASTER_ADDR") or _mpi_master_addr(world, _int(env, ls), source)
        return DistEnv(rank, world, local or 0, addr, _port(env, default_port), source)
    rank = _int(env, "SLURM_PROCID")
    world = _int(env, "SLURM_NTASKS")
    if world is None:
        world = _int(env, "SLURM_NPROCS")
    if rank is not None or world is not None:
        if rank is None or world is None:
            raise ConfigError(
                "SLURM_PROCID and SLURM_NTASKS must both be set under SLURM (run inside srun); "
                f"got SLURM_PROCID={env.get('SLURM_PROCID')!r} "
                f"SLURM_NTASKS={env.get('SLURM_NTASKS')!r}"
            )
        _check_range(rank, world, "SLURM_PROCID", "SLURM_NTASKS")
        addr = env.get("MASTER_ADDR")
        if not addr:
            nodelist = (
                env.get("SLURM_JOB_NODELIST")
                or env.get("SLURM_NODELIST")
                or env.get("SLURM_STEP_NODELIST")
            )
            if not nodelist:
                raise ConfigError(
                    "started by SLURM but neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; "
                    "export MASTER_ADDR=<host of rank 0>"
                )
            addr = first_host(nodelist)
        local = _int(env, "SLURM_LOCALID")
        return DistEnv(rank, world, local or 0, addr, _port(env, default_port), "slurm")
    return None


def _check_range(rank: int, world: int, rank_key: str, world_key: str) -> None:
    if world < 1 or not 0 <= rank < world:
        raise ConfigError(
            f"{rank_key}={rank} is not a valid rank for {world_key}={world}; "
            f"expected 0 <= {rank_key} < {world_key}"
        )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


__all__ = ["DEFAULT_PORT", "DistEnv", "discover", "expand_nodelist", "first_host", "free_port"]
