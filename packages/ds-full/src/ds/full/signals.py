"""The gate's signal bus wired into a run: the measurement itself (exposed waits, the memory
limit, offload time) is :mod:`ds.monitor.gate_signals`; this reads the run's config for what to
measure and switches the comm layer's timings on, which only the composition root can do."""

from __future__ import annotations

from typing import Any

from ds.monitor.gate_signals import SignalBus, store_peer_waits


def signal_bus_for(cfg: Any, accelerator: Any, device: Any) -> SignalBus:
    """The bus for a run of ``cfg`` on ``device``, its comm timings switched on in ds.comm."""
    zero = cfg.zero_optimization
    offload = zero.offload_optimizer_device in ("cpu", "nvme") or zero.offload_param_device in (
        "cpu",
        "nvme",
    )
    nvme = []
    for section in (getattr(zero, "offload_optimizer", None), getattr(zero, "offload_param", None)):
        path = getattr(section, "nvme_path", None) if section is not None else None
        if path and getattr(section, "device", None) == "nvme":
            nvme.append(str(path))
    index = getattr(device, "index", None)
    bus = SignalBus(
        accelerator=accelerator,
        device_index=index,
        offload=offload,
        nvme_paths=nvme,
        peers=store_peer_waits(),
    )
    from ds import comm

    comm.configure(event_bus=bus.comm_bus)
    return bus
