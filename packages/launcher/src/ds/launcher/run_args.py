"""The ``ds run`` command line. DeepSpeed's and torchrun's spellings are accepted as aliases."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

RUNNERS = ("pdsh", "ssh", "openmpi", "mpich", "impi", "mvapich", "slurm")


class UsageError(Exception):
    """Bad command-line input: reported as one line on stderr with exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see 'ds run --help')")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="ds run",
        description="Start a training script on this machine or on every host of a hostfile.",
        allow_abbrev=False,
    )
    res = p.add_argument_group("resources")
    res.add_argument(
        "-H",
        "--hostfile",
        help="hostfile of 'HOST slots=N' lines (default: "
        "$DS_HOSTFILE, else /job/hostfile when it exists, else this machine)",
    )
    res.add_argument(
        "-i", "--include", default="", help="hosts/slots to use, e.g. 'host1:0,2@host2'"
    )
    res.add_argument(
        "-e", "--exclude", default="", help="hosts/slots to leave out, same syntax as --include"
    )
    res.add_argument(
        "--num_nodes",
        "--num-nodes",
        "--nnodes",
        type=int,
        default=None,
        help="use the first N hosts",
    )
    res.add_argument(
        "--num_gpus",
        "--num-gpus",
        "--num_accelerators",
        type=int,
        default=None,
        dest="num_gpus",
        help="accelerator slots per host (sets device visibility)",
    )
    res.add_argument(
        "--nproc",
        "--nproc_per_node",
        "--nproc-per-node",
        type=int,
        default=None,
        dest="nproc",
        help="processes per host (CPU ranks)",
    )
    net = p.add_argument_group("rendezvous")
    net.add_argument(
        "--master_addr",
        "--master-addr",
        default=None,
        help="address of rank 0 (default: 127.0.0.1 locally, first host otherwise)",
    )
    net.add_argument(
        "--master_port",
        "--master-port",
        type=int,
        default=None,
        help="port of rank 0 (default: a free port)",
    )
    multi = p.add_argument_group("multi-node")
    multi.add_argument(
        "--launcher",
        default=None,
        metavar="{" + ",".join(RUNNERS) + "}",
        help="multi-node runner, or any name registered in 'ds.runners' "
        "(default: pdsh when several hosts are used)",
    )
    multi.add_argument(
        "--launcher_args",
        "--launcher-args",
        default="",
        help="extra arguments for the runner, one quoted string",
    )
    multi.add_argument(
        "--force_multi",
        "--force-multi",
        action="store_true",
        help="use the multi-node runner even for one host",
    )
    multi.add_argument(
        "--ssh_port",
        "--ssh-port",
        type=int,
        default=None,
        help="ssh port for the pdsh and ssh runners",
    )
    multi.add_argument(
        "--no_ssh",
        "--no-ssh",
        action="store_true",
        help="run only this host's ranks (node --node_rank of the hostfile); start the same "
        "command on every host yourself",
    )
    multi.add_argument(
        "--node_rank",
        "--node-rank",
        type=int,
        default=None,
        help="this host's index in the hostfile, with --no_ssh",
    )
    multi.add_argument(
        "--no_ssh_check",
        "--no-ssh-check",
        action="store_true",
        help="accepted for compatibility; ds never probes hosts before launch",
    )
    proc = p.add_argument_group("processes")
    proc.add_argument(
        "--max_restarts",
        "--max-restarts",
        type=int,
        default=0,
        help="restart the whole group up to K times after a failure",
    )
    proc.add_argument(
        "--bind_cores_to_rank",
        "--bind-cores-to-rank",
        action="store_true",
        help="pin each rank to its own share of the cores",
    )
    proc.add_argument(
        "--bind_core_list",
        "--bind-core-list",
        default=None,
        help="cores to share out when binding, e.g. '0-7,16-23'",
    )
    proc.add_argument(
        "--terminate_timeout",
        "--terminate-timeout",
        type=float,
        default=3.0,
        help="seconds between SIGTERM and SIGKILL when stopping ranks",
    )
    proc.add_argument(
        "--collective_timeout",
        "--collective-timeout",
        default=None,
        metavar="S",
        help="stop the job (exit code 124) when a rank has been inside one torch.distributed "
        "collective for S seconds, naming the rank and the op (default: $DS_COLLECTIVE_TIMEOUT, "
        "else off; 0 switches it off)",
    )
    proc.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VAL",
        help="set an environment variable for every rank (repeatable)",
    )
    proc.add_argument(
        "--module", "-m", action="store_true", help="run the target as a module (python -m)"
    )
    proc.add_argument(
        "--no_python",
        "--no-python",
        action="store_true",
        help="run the target as an executable, not through python",
    )
    proc.add_argument(
        "--local_rank_arg",
        "--local-rank-arg",
        action="store_true",
        help="append --local_rank=N to the script's arguments",
    )
    proc.add_argument(
        "--no_local_rank",
        "--no-local-rank",
        action="store_true",
        help="accepted for compatibility (ds passes no --local_rank by default)",
    )
    logs = p.add_argument_group("logs")
    logs.add_argument(
        "--log_dir",
        "--log-dir",
        default=None,
        help="directory for per-rank logs and the failure report",
    )
    logs.add_argument(
        "--enable_each_rank_log",
        "--enable-each-rank-log",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="write one log file per rank (in DIR, --log_dir or ./ds_logs)",
    )
    logs.add_argument(
        "--save_pid",
        "--save-pid",
        action="store_true",
        help="write the launcher pid to /tmp/ds_run.<pid>.pid",
    )
    p.add_argument("script", help="training script (or module with --module)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    return p


_VALUE_MAY_START_WITH_DASH = ("--launcher_args", "--launcher-args")
_OPTIONAL_DIR = ("--enable_each_rank_log", "--enable-each-rank-log")


def _normalise(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """Fix two argparse ambiguities before the script name; the script's own args are untouched.

    ``--launcher_args "-i key"``: a value starting with "-" would be taken for an option, so it is
    glued on as ``--launcher_args=-i key``. ``--enable_each_rank_log train.py``: the optional
    directory would swallow the script, so an existing file there means "no directory given".
    """
    # Options that consume exactly one value (flags have nargs=0).
    takes_value = {
        opt for act in parser._actions if act.nargs is None for opt in act.option_strings
    }
    out: list[str] = []
    i = 0
    while i < len(argv):
        a = argv[i]
        nxt = argv[i + 1] if i + 1 < len(argv) else None
        if a in _VALUE_MAY_START_WITH_DASH and nxt is not None:
            out.append(f"{a}={nxt}")
            i += 2
        elif a in _OPTIONAL_DIR:
            if nxt is not None and not nxt.startswith("-") and not Path(nxt).is_file():
                out.append(f"{a}={nxt}")
                i += 2
            else:
                out.append(f"{a}=")
                i += 1
        elif a in takes_value and nxt is not None:
            out += [a, nxt]
            i += 2
        elif a.startswith("-") and a != "--":
            out.append(a)
            i += 1
        else:
            out.extend(argv[i:])  # the script and its own arguments
            break
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    return parser.parse_args(_normalise(parser, argv))


def print_help() -> None:
    build_parser().print_help(sys.stdout)
