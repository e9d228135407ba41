"""Device visibility per accelerator, decided without importing torch.

The launcher parent must start fast, so it does not load an accelerator (which imports torch).
The variable names match what each device runtime reads.

Device placement (docs/launcher.md, "Devices"): every rank of a node gets the same visibility
list, the node's selected slots in local-rank order, and local rank ``r`` computes on index ``r``
of it (``ds.full`` calls ``set_device(LOCAL_RANK)``; so does a plain torch script written for
torchrun). A slot is an index into the devices this node can see: into the user's own
``CUDA_VISIBLE_DEVICES`` list when one is set (so ``CUDA_VISIBLE_DEVICES=4,5,6,7`` with
``--include localhost:1,3`` runs on physical devices 5 and 7), else into the devices the driver
reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

VISIBLE_DEVICES_ENV: dict[str, list[str]] = {
    "cuda": ["CUDA_VISIBLE_DEVICES"],
    "rocm": ["HIP_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"],
    "xpu": ["ZE_AFFINITY_MASK"],
    "hpu": ["HABANA_VISIBLE_MODULES"],
    "npu": ["ASCEND_RT_VISIBLE_DEVICES"],
    "cpu": [],
    "mps": [],
}

# Counts the devices the driver exposes for an accelerator kind, or None when it cannot tell.
DeviceProbe = Callable[[str], "int | None"]


class DeviceCountError(ValueError):
    """More device slots asked for than this node can see (reported as one line, exit 2)."""


def detect_accelerator() -> str:
    """``DS_ACCELERATOR`` when set, else cuda when an NVIDIA/AMD driver exposes devices, else cpu."""
    forced = os.environ.get("DS_ACCELERATOR")
    if forced:
        return forced.lower()
    if (gpu_count("cuda") or 0) > 0:
        return "cuda"
    if Path("/dev/kfd").exists():
        return "rocm"
    return "cpu"


def gpu_count(kind: str) -> int | None:
    """Devices the driver exposes (ignoring any visibility variable); None when unknown."""
    if kind == "cuda":
        drv = Path("/proc/driver/nvidia/gpus")
        if drv.is_dir():
            return sum(1 for _ in drv.iterdir())
        return sum(1 for p in Path("/dev").glob("nvidia[0-9]*"))
    return None


def visible_device_vars(kind: str) -> list[str]:
    return list(VISIBLE_DEVICES_ENV.get(kind, []))


def user_visible_list(variables: Sequence[str], environ: Mapping[str, str]) -> list[str] | None:
    """The device list the user already set in the first of ``variables`` present, else None.

    Entries are kept as written (indices, UUIDs or MIG ids); an empty value means no device.
    """
    for var in variables:
        value = environ.get(var)
        if value is not None:
            return [d.strip() for d in value.split(",") if d.strip()]
    return None


def visible_count(
    kind: str, environ: Mapping[str, str], probe: DeviceProbe | None = None
) -> int | None:
    """How many devices of ``kind`` this node's ranks can use; None when it cannot be told."""
    user = user_visible_list(visible_device_vars(kind), environ)
    if user is not None:
        return len(user)
    if not visible_device_vars(kind):
        return None  # cpu, mps: no device slots to count
    return (probe or gpu_count)(kind)


def devices_for_slots(
    slots: Sequence[int], variables: Sequence[str], environ: Mapping[str, str]
) -> str:
    """The visibility value for a node running ``slots``: each slot mapped through the user's list."""
    user = user_visible_list(variables, environ)
    if user is None:
        return ",".join(str(s) for s in slots)
    return ",".join(user[s] for s in slots)


def check_slots(
    kind: str,
    slots: Sequence[int],
    environ: Mapping[str, str],
    probe: DeviceProbe | None = None,
    asked: str = "",
) -> None:
    """Raise DeviceCountError when ``slots`` need more devices than this node can see."""
    count = visible_count(kind, environ, probe)
    if count is None or not slots:
        return
    need = max(len(slots), max(slots) + 1)
    if need <= count:
        return
    user_var = next((v for v in visible_device_vars(kind) if v in environ), None)
    seen = f"{user_var}={environ[user_var]!r}" if user_var else "reported by the driver"
    what = asked or f"{len(slots)} rank(s)"
    if need > len(slots):
        what += f" (device slot {max(slots)})"
    raise DeviceCountError(
        f"{what} needs {need} {kind} device(s) on this node but {count} are visible ({seen}); "
        f"start at most {count} rank(s) per node, or set DS_ACCELERATOR=cpu for CPU ranks"
    )
