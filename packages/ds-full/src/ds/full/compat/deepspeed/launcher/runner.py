"""``deepspeed.launcher.runner``: DeepSpeed's launcher entry (``deepspeed`` command), served by
``ds run``.

``parse_args`` reads DeepSpeed's launcher arguments; ``main`` checks them by DeepSpeed's rules
and hands the same command line to ``ds run``, which accepts DeepSpeed's spellings (``-H``,
``-i``/``-e``, ``--num_nodes``, ``--num_gpus``, ``--master_addr``, ``--launcher``, ...). The
hostfile helpers (``fetch_hostfile``, ``parse_resource_filter``, ``encode_world_info``) keep
DeepSpeed's return shapes. ds reads ``.deepspeed_env`` as DeepSpeed does (beside ``.ds_env``).
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import sys
from collections.abc import Iterable
from typing import Any

DEEPSPEED_ENVIRONMENT_NAME = ".deepspeed_env"
DLTS_HOSTFILE = "/job/hostfile"
PDSH_LAUNCHER = "pdsh"
OPENMPI_LAUNCHER = "openmpi"
MPICH_LAUNCHER = "mpich"
IMPI_LAUNCHER = "impi"
MVAPICH_LAUNCHER = "mvapich"
SLURM_LAUNCHER = "slurm"
TORCH_DISTRIBUTED_DEFAULT_PORT = 29500

# DeepSpeed launcher options ds run has no use for: (value it takes?, why it is refused).
_REFUSED = {
    "autotuning": "autotuning runs as 'ds autotune' (see docs/planning.md)",
    "venv_script": "source the environment before 'deepspeed'/'ds run' on every node instead",
}


def parse_args(args: list[str] | None = None) -> argparse.Namespace:
    """DeepSpeed's launcher arguments (the same names, defaults and ``user_script user_args``)."""
    p = argparse.ArgumentParser(prog="deepspeed", description="DeepSpeed's launcher, run by ds")
    p.add_argument("-H", "--hostfile", type=str, default=DLTS_HOSTFILE)
    p.add_argument("-i", "--include", type=str, default="")
    p.add_argument("-e", "--exclude", type=str, default="")
    p.add_argument("--num_nodes", type=int, default=-1)
    p.add_argument("--min_elastic_nodes", type=int, default=-1)
    p.add_argument("--max_elastic_nodes", type=int, default=-1)
    p.add_argument("--num_gpus", "--num_accelerators", type=int, default=-1)
    p.add_argument("--master_port", type=int, default=TORCH_DISTRIBUTED_DEFAULT_PORT)
    p.add_argument("--master_addr", type=str, default="")
    p.add_argument("--node_rank", type=int, default=-1)
    p.add_argument("--launcher", type=str, default=PDSH_LAUNCHER)
    p.add_argument("--launcher_args", type=str, default="")
    for flag in ("--module", "--no_python", "--no_local_rank", "--no_ssh", "--no_ssh_check",
                 "--force_multi", "--save_pid", "--elastic_training", "--bind_cores_to_rank",
                 "--quiet", "-q"):  # fmt: skip
        p.add_argument(flag, action="store_true")
    p.add_argument("--enable_each_rank_log", type=str, default="None")
    p.add_argument("--autotuning", type=str, default="", choices=["", "tune", "run"])
    p.add_argument("--bind_core_list", type=str, default=None)
    p.add_argument("--ssh_port", type=int, default=None)
    p.add_argument("--venv_script", type=str, default=None)
    p.add_argument("--log_level", type=str, default="info")
    p.add_argument("--comment", type=str, default="")
    p.add_argument("--account", type=str, default="")
    p.add_argument("user_script", type=str)
    p.add_argument("user_args", nargs=argparse.REMAINDER)
    return p.parse_args(args=args)


def _parse_hostfile(hostfile_lines: Iterable[str]) -> collections.OrderedDict[str, int]:
    """``host slots=N`` lines -> ordered ``{host: N}`` (ValueError naming a bad line)."""
    from ds.launcher.hostfile import parse_hostfile_text

    hosts = parse_hostfile_text("\n".join(line.strip() for line in hostfile_lines), "hostfile")
    return collections.OrderedDict((h, len(s)) for h, s in hosts.items())


def fetch_hostfile(hostfile_path: str) -> collections.OrderedDict[str, int] | None:
    """The hostfile's ``{host: slots}``, or None when there is no such file (local run)."""
    if not os.path.isfile(hostfile_path):
        return None
    with open(hostfile_path) as f:
        return _parse_hostfile(f.readlines())


def _node_specs(spec: str) -> dict[str, list[int]]:
    from ds.launcher.hostfile import parse_filter

    return {h: s or [] for h, s in parse_filter(spec, "filter").items()}


def parse_resource_filter(
    host_info: dict[str, list[int]], include_str: str = "", exclude_str: str = ""
) -> dict[str, list[int]]:
    """Keep (``include_str``) or drop (``exclude_str``) hosts and slots, ``NAME[:S[,S]][@...]``;
    a host without slots means all of them. The result keeps ``host_info``'s host order and
    leaves out hosts with no slot left."""
    if include_str and exclude_str:
        raise ValueError("include_str and exclude_str are mutually exclusive; give one")
    if not include_str and not exclude_str:
        return host_info
    picked = _node_specs(include_str or exclude_str)
    for host, slots in picked.items():
        if host not in host_info:
            raise ValueError(f"host {host!r} is not in the hostfile ({', '.join(host_info)})")
        missing = [s for s in slots if s not in host_info[host]]
        if missing:
            raise ValueError(f"host {host!r} has no slot(s) {missing} ({host_info[host]})")
    out: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
    for host, avail in host_info.items():
        if include_str:
            if host in picked:
                kept = picked[host] or list(avail)
            else:
                continue
        else:
            drop = picked.get(host)
            kept = [] if drop == [] else [s for s in avail if s not in (drop or [])]
        kept = list(dict.fromkeys(kept))
        if kept:
            out[host] = kept
    return out


def parse_inclusion_exclusion(
    resource_pool: dict[str, int], inclusion: str, exclusion: str
) -> dict[str, list[int]]:
    active = collections.OrderedDict((h, list(range(n))) for h, n in resource_pool.items())
    return parse_resource_filter(active, include_str=inclusion, exclude_str=exclusion)


def encode_world_info(world_info: dict[str, Any]) -> str:
    """``{host: slots}`` as URL-safe base64 of its JSON (what DeepSpeed's per-node launcher reads)."""
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def decode_world_info(text: str) -> dict[str, Any]:
    return dict(json.loads(base64.urlsafe_b64decode(text.encode("utf-8")).decode("utf-8")))


def _check(args: argparse.Namespace) -> None:
    for name, why in _REFUSED.items():
        if getattr(args, name):
            raise ValueError(f"deepspeed --{name}: not supported by ds; {why}")
    if args.elastic_training:
        raise ValueError(
            "deepspeed --elastic_training: ds restarts failed ranks with 'ds run "
            "--max_restarts N' instead of torch elastic agents"
        )
    if (args.num_nodes >= 0 or args.num_gpus >= 0) and (args.include or args.exclude):
        raise ValueError(
            "--num_nodes/--num_gpus cannot be combined with --include/--exclude; use one way "
            "of choosing resources"
        )


# Options passed on to ds run when set (its parser takes DeepSpeed's spellings); --log_level,
# --quiet and SLURM's --comment/--account only change DeepSpeed's own launcher and are not.
_VALUED = (
    "hostfile", "include", "exclude", "num_nodes", "num_gpus", "master_port", "master_addr",
    "node_rank", "launcher", "launcher_args", "ssh_port", "bind_core_list", "enable_each_rank_log",
)  # fmt: skip
_FLAGS = (
    "module", "no_python", "no_local_rank", "no_ssh", "no_ssh_check", "force_multi", "save_pid",
    "bind_cores_to_rank",
)  # fmt: skip


def ds_run_argv(argv: list[str]) -> list[str]:
    """``ds run``'s command line for DeepSpeed launcher arguments ``argv`` (checked first)."""
    args = parse_args(argv)
    _check(args)
    defaults = parse_args(["script"])
    out = ["run"]
    for name in _VALUED:
        value = getattr(args, name)
        if value != getattr(defaults, name):
            out += [f"--{name}", str(value)]
    out += [f"--{name}" for name in _FLAGS if getattr(args, name)]
    return [*out, args.user_script, *args.user_args]


def main(args: list[str] | None = None) -> int:
    """``deepspeed [launcher args] script [script args]`` -> ``ds run`` with the same arguments."""
    from ds.launcher.cli import main as ds_main

    argv = list(sys.argv[1:] if args is None else args)
    return int(ds_main(ds_run_argv(argv)) or 0)


__all__ = [
    "DEEPSPEED_ENVIRONMENT_NAME",
    "decode_world_info",
    "ds_run_argv",
    "encode_world_info",
    "fetch_hostfile",
    "main",
    "parse_args",
    "parse_inclusion_exclusion",
    "parse_resource_filter",
]
