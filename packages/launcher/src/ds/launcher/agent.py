"""Per-node launcher started on every host by the pdsh and ssh runners.

``python -m ds.launcher.agent --world_info=B64 --node_rank=N ... -- python -u train.py ...``
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from ds.launcher.accel_env import DeviceCountError, check_slots
from ds.launcher.node import NodePlan, build_members
from ds.launcher.runners.base import decode_hosts
from ds.launcher.supervise import Supervisor


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ds.launcher.agent", allow_abbrev=False)
    p.add_argument("--world_info", required=True)
    p.add_argument("--node_rank", type=int, default=None)
    p.add_argument("--node_host", default=None)
    p.add_argument("--master_addr", required=True)
    p.add_argument("--master_port", type=int, required=True)
    p.add_argument("--bind_cores_to_rank", action="store_true")
    p.add_argument("--bind_core_list", default=None)
    p.add_argument("--log_dir", default=None)
    p.add_argument("--visible_device_vars", default="")
    p.add_argument("--accelerator", default="")
    p.add_argument("--local_rank_arg", action="store_true")
    p.add_argument("--terminate_timeout", type=float, default=3.0)
    p.add_argument("--collective_timeout", type=float, default=None)
    p.add_argument("--watch_stdin", action="store_true")
    p.add_argument("--watch_output", action="store_true")
    p.add_argument("command", nargs=argparse.REMAINDER)
    return p


def _node_rank(hosts: dict[str, list[int]], node_rank: int | None, node_host: str | None) -> int:
    names = list(hosts)
    if node_rank is not None:
        return node_rank
    candidates = [node_host] if node_host else []
    candidates += [socket.gethostname(), socket.getfqdn()]
    for c in candidates:
        if c in names:
            return names.index(c)
    raise SystemExit(
        f"ds.launcher.agent: this host ({', '.join(filter(None, candidates))}) is not in the "
        f"job's hosts ({', '.join(names)})"
    )


def parse_core_list(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"core list {text!r}: {part!r} is not N or N-M")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    return out


def _watch_stdin(stop: Callable[[], None]) -> None:
    """ssh forwards the launcher's stdin pipe: EOF means the launcher is gone."""
    # Raw reads: a daemon thread blocked inside sys.stdin's buffered reader aborts the
    # interpreter at shutdown.
    try:
        while os.read(0, 4096):
            pass
    except OSError:
        pass
    stop()


def _watch_output(stop: Callable[[], None]) -> None:
    """When the connection to the launching node drops (pdsh or ssh killed), sshd closes our
    stdout; poll reports that as POLLHUP/POLLERR without anything being written."""
    poller = select.poll()
    poller.register(1, 0)  # no events requested: only error/hang-up conditions are reported
    while True:
        events = poller.poll()
        if any(ev & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _fd, ev in events):
            stop()
            return


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    hosts = decode_hosts(args.world_info)
    plan = NodePlan(
        hosts=hosts,
        node_rank=_node_rank(hosts, args.node_rank, args.node_host),
        master_addr=args.master_addr,
        master_port=args.master_port,
        user_command=command,
        visible_device_vars=[v for v in args.visible_device_vars.split(",") if v],
        bind_cores=args.bind_cores_to_rank,
        core_list=parse_core_list(args.bind_core_list) if args.bind_core_list else None,
        log_dir=Path(args.log_dir) if args.log_dir else None,
        local_rank_arg=args.local_rank_arg,
    )
    if args.accelerator:
        try:
            check_slots(args.accelerator, plan.local_slots, os.environ)
        except DeviceCountError as exc:
            print(f"ds.launcher.agent ({plan.host}): error: {exc}", file=sys.stderr)
            return 2
    attempt = int(os.environ.get("DS_RESTART_COUNT", "0") or 0)
    sup = Supervisor(
        # The launching node restarts the whole job and says which attempt this is.
        lambda _restart: build_members(plan, attempt, os.environ),
        max_restarts=0,  # the launching node restarts the whole job across nodes
        grace_s=args.terminate_timeout,
        report_dir=plan.log_dir,
        name=f"ds agent {plan.host}",
        hang_timeout_s=args.collective_timeout,
    )

    def stop() -> None:
        group = sup.group
        if group is not None:
            group.request_stop(signal.SIGTERM)

    if args.watch_stdin:
        threading.Thread(target=_watch_stdin, args=(stop,), daemon=True).start()
    if args.watch_output:
        threading.Thread(target=_watch_output, args=(stop,), daemon=True).start()
    return sup.run()


if __name__ == "__main__":
    sys.exit(main())
