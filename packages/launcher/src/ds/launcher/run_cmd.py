"""``ds run``: resolve the command line into a job and supervise it."""

from __future__ import annotations

import atexit
import importlib.util
import os
import shlex
import shutil
import socket
import sys
import tempfile
from argparse import Namespace
from dataclasses import replace
from pathlib import Path

from ds.interfaces.errors import ConfigError, DsError, LaunchError
from ds.interfaces.runner import LaunchSpec
from ds.launcher import accel_env, envfile, hostfile
from ds.launcher.agent import parse_core_list
from ds.launcher.hangwatch import ENV_VAR as HANG_ENV_VAR
from ds.launcher.hangwatch import parse_timeout
from ds.launcher.node import NodePlan, build_members
from ds.launcher.procgroup import Member
from ds.launcher.run_args import UsageError, parse
from ds.launcher.supervise import Supervisor

DEFAULT_HOSTFILE = "/job/hostfile"
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def user_command(args: Namespace) -> list[str]:
    if args.no_python:
        return [args.script, *args.script_args]
    if args.module:
        return [sys.executable, "-u", "-m", args.script, *args.script_args]
    return [sys.executable, "-u", args.script, *args.script_args]


def check_target(args: Namespace) -> None:
    if args.module:
        try:
            found = importlib.util.find_spec(args.script) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise UsageError(f"module {args.script!r} cannot be found by this python")
    elif args.no_python:
        if shutil.which(args.script) is None:
            raise UsageError(f"executable {args.script!r} not found (not a path nor on PATH)")
    elif not Path(args.script).is_file():
        raise UsageError(f"script {args.script!r} does not exist")


def slots_per_node(args: Namespace) -> int | None:
    if args.num_gpus is not None and args.nproc is not None and args.num_gpus != args.nproc:
        raise UsageError(
            f"--num_gpus {args.num_gpus} and --nproc {args.nproc} conflict; pass only one"
        )
    n: int | None = args.num_gpus if args.num_gpus is not None else args.nproc
    if n is not None and n < 1:
        raise UsageError(f"--num_gpus/--nproc {n}: must be >= 1")
    return n


def resolve_resources(
    args: Namespace, accel: str, probe: accel_env.DeviceProbe | None = None
) -> tuple[dict[str, list[int]], bool]:
    """Hosts and slots to run on, and whether they came from a hostfile."""
    per_node = slots_per_node(args)
    path = args.hostfile or os.environ.get("DS_HOSTFILE")
    if path is None and Path(DEFAULT_HOSTFILE).is_file():
        path = DEFAULT_HOSTFILE
    if path is not None:
        res = hostfile.read_hostfile(path)
        res = hostfile.apply_filters(res, args.include or None, args.exclude or None)
        return hostfile.limit(res, args.num_nodes, per_node), True
    if per_node is None:
        per_node = max(1, accel_env.visible_count(accel, os.environ, probe) or 0)
    res = {"localhost": list(range(per_node))}
    # Without a hostfile the only host is this machine ("localhost"); filters may pick slots.
    res = hostfile.apply_filters(res, args.include or None, args.exclude or None)
    if args.num_nodes not in (None, 1):
        raise ConfigError(f"--num_nodes {args.num_nodes}: without a hostfile there is one node")
    return res, False


def agent_args(
    args: Namespace, log_dir: Path | None, visible: list[str], accel: str = ""
) -> list[str]:
    out = [f"--terminate_timeout={args.terminate_timeout}"]
    hang_s = getattr(args, "hang_timeout_s", None)  # set by prepare()
    if hang_s:
        out.append(f"--collective_timeout={hang_s:g}")
    if accel:
        out.append(f"--accelerator={accel}")  # each node checks its own device count
    if args.bind_cores_to_rank:
        out.append("--bind_cores_to_rank")
    if args.bind_core_list:
        out.append(f"--bind_core_list={args.bind_core_list}")
    if log_dir is not None:
        out.append(f"--log_dir={log_dir.resolve()}")
    if visible:
        out.append(f"--visible_device_vars={','.join(visible)}")
    if args.local_rank_arg:
        out.append("--local_rank_arg")
    return out


def make_runner(name: str, args: Namespace, agent: list[str]) -> object:
    from ds.interfaces import registry

    known = registry.list_providers(registry.RUNNERS)
    if name not in known:
        raise UsageError(
            f"--launcher {name!r}: unknown runner (available: {', '.join(sorted(known))})"
        )
    cls = registry.get(registry.RUNNERS, name)
    if name in ("pdsh", "ssh"):
        return cls(agent_args=agent, ssh_port=args.ssh_port)
    return cls()


def log_dir_of(args: Namespace) -> Path | None:
    if args.enable_each_rank_log:
        return Path(args.enable_each_rank_log)
    if args.log_dir:
        return Path(args.log_dir)
    if args.enable_each_rank_log is not None:
        return Path("ds_logs")
    return None


def no_ssh_node_rank(args: Namespace, resources: dict[str, list[int]]) -> int:
    """``--no_ssh``: this command runs one node of the job; the user starts it on every node."""
    if args.node_rank is None:
        raise UsageError("--no_ssh needs --node_rank N (this host's index in the hostfile)")
    if not 0 <= args.node_rank < len(resources):
        raise UsageError(
            f"--node_rank {args.node_rank}: the job has {len(resources)} host(s) "
            f"({', '.join(resources)})"
        )
    if args.master_addr is None or args.master_port is None:
        raise UsageError(
            "--no_ssh needs --master_addr and --master_port: every node must use the same ones"
        )
    return int(args.node_rank)


def asked_for(args: Namespace) -> str:
    """How the user asked for this node's slots, for the device-count error."""
    if args.num_gpus is not None:
        return f"--num_gpus {args.num_gpus}"
    if args.nproc is not None:
        return f"--nproc {args.nproc}"
    if args.include:
        return f"--include {args.include}"
    return ""


def hang_timeout(args: Namespace) -> float | None:
    """``--collective_timeout``, else ``$DS_COLLECTIVE_TIMEOUT``, in seconds; None when off."""
    try:
        if args.collective_timeout is not None:
            return parse_timeout(args.collective_timeout, "--collective_timeout")
        return parse_timeout(os.environ.get(HANG_ENV_VAR), HANG_ENV_VAR)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def prepare(argv: list[str], device_probe: accel_env.DeviceProbe | None = None) -> Supervisor:
    """Validate everything and build the supervisor; nothing is started here.

    ``device_probe`` counts the devices the driver exposes (default: the driver's device files);
    it is consulted only when no visibility variable such as ``CUDA_VISIBLE_DEVICES`` is set.
    """
    args = parse(argv)
    check_target(args)
    args.hang_timeout_s = hang_timeout(args)
    if args.max_restarts < 0:
        raise UsageError(f"--max_restarts {args.max_restarts}: must be >= 0")
    core_list = parse_core_list(args.bind_core_list) if args.bind_core_list else None
    accel = accel_env.detect_accelerator()
    resources, _from_file = resolve_resources(args, accel, device_probe)
    extra_env = {**envfile.load_env_file(), **envfile.parse_env_flags(args.env)}
    visible = accel_env.visible_device_vars(accel)
    log_dir = log_dir_of(args)
    cmd = user_command(args)
    multi = args.force_multi or args.launcher is not None or len(resources) > 1
    multi = (multi or not set(resources) <= LOCAL_NAMES) and not args.no_ssh
    node_rank = 0
    if args.no_ssh:
        node_rank = no_ssh_node_rank(args, resources)
    if not multi:
        # This node's ranks start here: refuse more device slots than it can see, before any
        # process starts (remote nodes check their own in the agent).
        slots = list(resources.values())[node_rank]
        accel_env.check_slots(accel, slots, os.environ, device_probe, asked_for(args))
    if args.save_pid:
        pid_file = Path(tempfile.gettempdir()) / f"ds_run.{os.getpid()}.pid"
        pid_file.write_text(f"{os.getpid()}\n")
        atexit.register(pid_file.unlink, missing_ok=True)

    if not multi:
        fixed_port = args.master_port

        def local_members(restart: int) -> list[Member]:
            plan = NodePlan(
                hosts=resources,
                node_rank=node_rank,
                master_addr=args.master_addr or "127.0.0.1",
                master_port=fixed_port or free_port(),
                user_command=cmd,
                extra_env=extra_env,
                visible_device_vars=visible,
                bind_cores=args.bind_cores_to_rank,
                core_list=core_list,
                log_dir=log_dir,
                local_rank_arg=args.local_rank_arg,
            )
            return build_members(plan, restart, os.environ)

        return Supervisor(
            local_members,
            args.max_restarts,
            args.terminate_timeout,
            log_dir,
            hang_timeout_s=args.hang_timeout_s,
        )

    name = args.launcher or "pdsh"
    if args.hang_timeout_s and name not in ("pdsh", "ssh"):
        raise UsageError(
            f"--collective_timeout (or ${HANG_ENV_VAR}) needs ranks started by ds: the {name} "
            "runner starts them itself; use --launcher pdsh or ssh, or ds.comm's watchdog "
            "(--env DS_COMM_WATCHDOG=SECONDS)"
        )
    runner = make_runner(name, args, agent_args(args, log_dir, visible, accel))
    if not runner.backend_exists():  # type: ignore[attr-defined]
        raise LaunchError(
            f"the {name} runner needs its command on PATH and it is missing; install it "
            f"(see docs/launcher.md) or choose another --launcher"
        )
    spec = LaunchSpec(
        hosts=resources,
        master_addr=args.master_addr or next(iter(resources)),
        master_port=args.master_port or free_port(),
        user_command=cmd,
        env={**envfile.exported(os.environ), **extra_env},
        launcher_args=shlex.split(args.launcher_args),
    )
    runner.get_cmd(spec)  # type: ignore[attr-defined]  # surface runner errors before starting
    parent_env = dict(os.environ)
    if hasattr(runner, "env"):
        parent_env.update(runner.env())
    hosts = list(resources)

    def runner_members(restart: int) -> list[Member]:
        # The restart count travels in the exported env, so the command lines are rebuilt.
        attempt = replace(spec, env={**spec.env, "DS_RESTART_COUNT": str(restart)})
        argvs = runner.get_cmd(attempt)  # type: ignore[attr-defined]
        out = []
        for i, argv in enumerate(argvs):
            label = f"{name} (node {hosts[i]})" if len(argvs) > 1 else name
            log_path = None
            if log_dir is not None and name not in ("pdsh", "ssh"):
                # MPI/SLURM ranks print through the runner; agents keep per-rank logs themselves.
                suffix = f".restart{restart}" if restart else ""
                log_path = log_dir / f"{name}{suffix}.log"
            out.append(Member(label, argv, parent_env, log_path=log_path, stdin_pipe=name == "ssh"))
        return out

    return Supervisor(runner_members, args.max_restarts, args.terminate_timeout, log_dir)


def main(argv: list[str], device_probe: accel_env.DeviceProbe | None = None) -> int:
    try:
        sup = prepare(argv, device_probe)
    except (UsageError, ConfigError, LaunchError, ValueError) as exc:
        print(f"ds run: error: {exc}", file=sys.stderr)
        return 2
    except DsError as exc:
        print(f"ds run: error: {exc}", file=sys.stderr)
        return 2
    return sup.run()
