"""``ds report``: what this machine and environment offer to ds, as text or JSON.

Every probe is independent: a missing or broken component becomes one clear line in the report,
never a crash of the whole command.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ds.interfaces import registry


def _safe(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:  # a probe must never take the whole report down
        return {"error": f"{type(exc).__name__}: {exc}"}


def python_info() -> dict[str, Any]:
    return {
        "version": platform.python_version(),
        "implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
    }


def torch_info() -> dict[str, Any]:
    try:
        import torch
    except ImportError:
        return {"error": "torch is not installed (pip install torch)"}
    return {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
        "threads": torch.get_num_threads(),
        "distributed": torch.distributed.is_available(),
        "path": str(Path(torch.__file__).parent),
    }


def accelerator_info() -> dict[str, Any]:
    providers = registry.list_providers(registry.ACCELERATORS)
    if not providers:
        return {
            "error": "no accelerator is registered in 'ds.accelerators' "
            "(pip install ds-accel-abstraction)"
        }
    out: dict[str, Any] = {"registered": sorted(providers)}
    details: dict[str, Any] = {}
    for name in sorted(providers):
        details[name] = _safe(functools.partial(_one_accelerator, name))
    out["devices"] = details
    return out


def _one_accelerator(name: str) -> dict[str, Any]:
    obj = registry.get(registry.ACCELERATORS, name)
    acc = obj() if isinstance(obj, type) else obj  # entry points name classes
    available = bool(acc.is_available())
    info: dict[str, Any] = {"available": available}
    if available:
        count = int(acc.device_count())
        info["device_count"] = count
        info["devices"] = [str(acc.device_name(i)) for i in range(count)]
        info["comm_backend"] = acc.communication_backend_name()
    return info


def distributions() -> dict[str, str]:
    from importlib.metadata import distributions as all_dists

    out = {}
    for d in all_dists():
        name = d.metadata["Name"] or ""
        if name.lower().startswith("ds-") or name.lower() == "ds":
            out[name] = d.version
    return dict(sorted(out.items()))


def kernels_info() -> dict[str, Any]:
    providers = registry.list_providers(registry.KERNELS)
    if not providers:
        return {"error": "no kernel provider in 'ds.kernels' (pip install ds-ops-kernels)"}
    out: dict[str, Any] = {}
    for name in sorted(providers):
        out[name] = _safe(functools.partial(_one_kernel, name))
    return out


def _one_kernel(name: str) -> dict[str, Any]:
    obj = registry.get(registry.KERNELS, name)
    prov = obj() if isinstance(obj, type) else obj
    return {str(k): str(v) for k, v in dict(prov.info()).items()}


def comm_info() -> dict[str, Any]:
    out: dict[str, Any] = {
        "ds.comm_backends": sorted(registry.list_providers(registry.COMM_BACKENDS))
    }
    try:
        import torch.distributed as dist
    except ImportError:
        return out
    if dist.is_available():
        out["torch"] = {
            b: bool(getattr(dist, f"is_{b}_available", lambda: False)())
            for b in ("gloo", "nccl", "mpi", "ucc")
        }
    out["runners"] = {
        name: _safe(functools.partial(_runner_installed, name))
        for name in sorted(registry.list_providers(registry.RUNNERS))
    }
    return out


def _runner_installed(name: str) -> bool:
    return bool(registry.get(registry.RUNNERS, name)().backend_exists())


def shm_info() -> dict[str, Any]:
    if not Path("/dev/shm").is_dir():
        return {"error": "/dev/shm does not exist"}
    usage = shutil.disk_usage("/dev/shm")
    return {
        "total_bytes": usage.total,
        "free_bytes": usage.free,
        "total_gib": round(usage.total / 2**30, 2),
    }


def cpu_info() -> dict[str, Any]:
    import psutil  # type: ignore[import-untyped]

    info: dict[str, Any] = {
        "logical_cores": psutil.cpu_count(logical=True),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cores": len(os.sched_getaffinity(0)),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 2),
    }
    nodes = sorted(Path("/sys/devices/system/node").glob("node[0-9]*"))
    info["numa_nodes"] = {
        p.name: (p / "cpulist").read_text().strip() for p in nodes if (p / "cpulist").exists()
    }
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line
                break
    except OSError:
        pass
    info["simd"] = [
        f for f in ("avx512f", "avx512_bf16", "avx2", "fma", "neon") if f" {f}" in flags
    ]
    info["model"] = platform.processor() or platform.machine()
    return info


def ds_command() -> dict[str, Any]:
    """Which package's ``ds`` is on PATH (DeepSpeed installs one too)."""
    from ds.launcher.owner import ds_command_owner

    return ds_command_owner()


SECTIONS: dict[str, Callable[[], Any]] = {
    "python": python_info,
    "torch": torch_info,
    "accelerator": accelerator_info,
    "ds distributions": distributions,
    "ds command": ds_command,
    "kernels": kernels_info,
    "comm": comm_info,
    "/dev/shm": shm_info,
    "cpu": cpu_info,
}


def collect() -> dict[str, Any]:
    return {name: _safe(fn) for name, fn in SECTIONS.items()}


def _render(value: Any, indent: int = 2) -> list[str]:
    pad = " " * indent
    lines = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, dict) and v:
                lines.append(f"{pad}{k}:")
                lines += _render(v, indent + 2)
            else:
                lines.append(f"{pad}{k}: {_scalar(v)}")
    else:
        lines.append(f"{pad}{_scalar(value)}")
    return lines


def _scalar(v: Any) -> str:
    if isinstance(v, list):
        return ", ".join(map(str, v)) if v else "(none)"
    if isinstance(v, dict):
        return "(none)"
    return str(v)


def render_text(data: dict[str, Any]) -> str:
    lines = []
    for section, value in data.items():
        lines.append(f"{section}")
        lines += _render(value)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="ds report", description="Print environment diagnostics.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--config",
        help="a ds/DeepSpeed JSON config: add the device mesh (tp x sp x dp groups) it gives",
    )
    p.add_argument(
        "--world-size",
        type=int,
        default=None,
        help="world size for --config (default: $WORLD_SIZE inside a job, else tp x sp)",
    )
    args = p.parse_args(argv)
    data = collect()
    if args.config:
        from ds.launcher.report_mesh import mesh_report

        data["parallel mesh"] = mesh_report(args.config, args.world_size)
    if args.json:
        print(json.dumps(data, indent=2, default=str))
    else:
        print(render_text(data))
    return 0
