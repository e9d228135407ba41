"""``estimate``: per-rank memory of each ZeRO stage and offload setting, from the simulation.

Each point runs ds's own engine, partitioner and optimizer (``ds.initialize`` and two training
steps) on chosen ranks of a simulated world (``ds.sim.estimate``: fake CUDA devices, or on gloo
CPU ranks whose device and host are one memory), so the bytes are what ds allocates, bucket and
staging buffers included, not a formula. Beside them: ds's closed-form model-state bytes and
DeepSpeed's estimator formulae.

The simulation is ds-sim's, a declared dependency found through the ``ds.simulations`` group it
advertises. The engine it measures is handed in (``initialize=``): the composition root passes
its own when it wires ``ds estimate`` (ds-autotune does not declare it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ds.autotune.formulas import deepspeed_estimate, model_state_bytes
from ds.autotune.model_spec import ModelSpec
from ds.interfaces import registry
from ds.interfaces.errors import ConfigError

# Where the optimizer state goes, and with "+param" the parameter shards too (stage 3 only).
OFFLOADS = ("none", "cpu", "cpu+param", "nvme", "nvme+param")


@dataclass(frozen=True)
class Estimate:
    stage: int
    offload: str
    world: int
    device_states: int  # device bytes held between steps (max over the simulated ranks)
    device_peak: int  # device peak within a step: states + activations + transient buffers
    device_init_peak: int  # device peak while the model and engine are built
    host_states: int
    host_peak: int
    formula_states: int  # ds's closed form, model states only
    deepspeed_device: int | None  # DeepSpeed's estimator, where it has one
    deepspeed_host: int | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def check_offload(offload: str) -> str:
    """``offload`` when it is one of :data:`OFFLOADS`, else a ConfigError naming them."""
    if offload not in OFFLOADS:
        raise ConfigError(f"offload {offload!r}: choose from {', '.join(OFFLOADS)}")
    return offload


def applies(stage: int, offload: str) -> bool:
    """Whether ZeRO ``stage`` can run with ``offload``: optimizer offload needs stage >= 1;
    parameter offload and NVMe are stage 3's."""
    if offload == "none":
        return True
    if offload == "cpu":
        return stage >= 1
    return stage == 3


def ds_config(
    stage: int,
    offload: str,
    micro_batch: int,
    dtype: str,
    extra: dict[str, Any] | None = None,
    *,
    nvme_path: str | None = None,
) -> dict[str, Any]:
    """The config of one point: ``extra`` (the job's own config) with this point's stage,
    offload, micro-batch and precision. ``nvme_path``: where NVMe offload puts its swap files."""
    device, _, param = check_offload(offload).partition("+")
    if not applies(stage, offload):
        what = "parameter offload" if param else f"optimizer offload to {device}"
        raise ConfigError(f"offload {offload!r} ({what}) does not run at ZeRO stage {stage}")
    if device == "nvme" and not nvme_path:
        raise ConfigError(f"offload {offload!r} needs an NVMe path for the swap files")
    cfg: dict[str, Any] = {
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "steps_per_print": 10**9,  # no step log lines from the simulated ranks
        **(extra or {}),
        "train_micro_batch_size_per_gpu": micro_batch,
    }
    # The job's global batch was for its own world; the point's follows from the micro-batch.
    cfg.pop("train_batch_size", None)
    for half in ("bf16", "fp16"):
        section = cfg.pop(half, None)
        if half == dtype:  # the job's section for this precision (loss scaling, ...) stays
            cfg[half] = {**(section or {}), "enabled": True}
    # The job's own zero settings (buffer counts, live-parameter limits, ...) stay.
    zero = dict(cfg.get("zero_optimization") or {})
    zero["stage"] = stage
    for key, on in (("offload_optimizer", device != "none"), ("offload_param", bool(param))):
        if not on:
            zero.pop(key, None)
            continue
        section = {**(zero.get(key) or {}), "device": device}
        if device == "nvme":
            section["nvme_path"] = nvme_path
        zero[key] = section
    cfg["zero_optimization"] = zero
    return cfg


def estimate(
    spec: ModelSpec,
    world: int,
    *,
    initialize: Callable[..., Any],
    stages: Sequence[int] = (0, 1, 2, 3),
    offloads: Sequence[str] = ("none", "cpu"),
    micro_batch: int = 1,
    seq_len: int = 16,
    dtype: str = "bf16",
    gpus_per_node: int = 8,
    ranks: Sequence[int] | None = None,
    backend: str = "nccl",
    nvme_path: str | None = None,
    config: dict[str, Any] | None = None,
) -> list[Estimate]:
    """``initialize``: the engine to measure (``ds.initialize``'s signature; ``ds.full`` hands in
    its own). ``backend``: the collectives' backend: nccl simulates GPU ranks; gloo simulates
    CPU ranks, whose device and host are one memory (the device figures hold all of it).
    ``nvme_path``: the directory NVMe offload's swap files go to (the engine checks its room
    first; the simulation writes no bytes to them). ``config``: the job's own DeepSpeed config,
    whose settings every point keeps except the stage, offload, micro-batch and precision."""
    if world < 1:
        raise ConfigError(f"--world {world}: must be >= 1")
    for offload in offloads:
        check_offload(offload)
    simulate = registry.get(registry.SIMULATIONS, "memory")
    out = []
    nodes = max(1, -(-world // gpus_per_node))
    per_node = min(world, gpus_per_node)
    for stage in stages:
        for offload in offloads:
            if not applies(stage, offload):
                continue
            cfg = ds_config(stage, offload, micro_batch, dtype, config, nvme_path=nvme_path)
            mems = simulate(
                spec.build,
                cfg,
                world,
                initialize=initialize,
                ranks=ranks,
                micro_batch=micro_batch,
                seq_len=seq_len,
                local_size=per_node,
                backend=backend,
            )
            # DeepSpeed's estimator has no NVMe case (it counts offloaded states in host RAM).
            ref = (
                None
                if offload.startswith("nvme")
                else deepspeed_estimate(
                    spec.params,
                    spec.largest_layer_params,
                    stage,
                    per_node,
                    nodes,
                    offload_optimizer=offload != "none",
                    offload_param=offload.endswith("+param"),
                )
            )
            out.append(
                Estimate(
                    stage=stage,
                    offload=offload,
                    world=world,
                    device_states=max(m.device_states for m in mems),
                    device_peak=max(m.device_peak for m in mems),
                    device_init_peak=max(m.device_init_peak for m in mems),
                    host_states=max(m.host_states for m in mems),
                    host_peak=max(m.host_peak for m in mems),
                    formula_states=model_state_bytes(spec.params, stage, world, offload != "none"),
                    deepspeed_device=ref[1] if ref else None,
                    deepspeed_host=ref[0] if ref else None,
                )
            )
    return out


def _unit(rows: Sequence[Estimate]) -> tuple[str, int]:
    biggest = max((r.device_init_peak for r in rows), default=0)
    return ("GiB", 2**30) if biggest >= 2**30 else ("MiB", 2**20)


def format_table(spec: ModelSpec, rows: Sequence[Estimate]) -> str:
    unit, scale = _unit(rows)

    def b(n: int | None) -> str:
        return "-" if n is None else f"{n / scale:.2f}"

    head = (
        f"{spec.name}: {spec.params / 1e6:.1f}M params, largest layer "
        f"{spec.largest_layer_params / 1e6:.2f}M; {unit} per rank (max over the simulated ranks)"
    )
    cols = (
        "world",
        "stage",
        "offload",
        "device states",
        "device step peak",
        "device build peak",
        "host peak",
        "model states (closed form)",
        "DeepSpeed device",
        "DeepSpeed host",
    )
    lines = [head, "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        cells = (
            str(r.world),
            str(r.stage),
            r.offload,
            b(r.device_states),
            b(r.device_peak),
            b(r.device_init_peak),
            b(r.host_peak),
            b(r.formula_states),
            b(r.deepspeed_device),
            b(r.deepspeed_host),
        )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
