"""``estimate``: per-rank memory of each ZeRO stage and offload setting, from the simulation.

Each point runs ds's own engine, partitioner and optimizer (``ds.initialize`` and one training
step) on chosen ranks of a simulated world (fake CUDA devices, ``ds.sim.estimate``), so the
bytes are what ds allocates, bucket and staging buffers included, not a formula. Beside them:
ds's closed-form model-state bytes and DeepSpeed's estimator formulae.

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

OFFLOADS = ("none", "cpu", "cpu+param")


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


def ds_config(
    stage: int, offload: str, micro_batch: int, dtype: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    if offload not in OFFLOADS:
        raise ConfigError(f"offload {offload!r}: choose from {', '.join(OFFLOADS)}")
    if offload == "cpu+param" and stage != 3:
        raise ConfigError("offload 'cpu+param' (parameter offload) exists at stage 3 only")
    zero: dict[str, Any] = {"stage": stage}
    if offload != "none":
        zero["offload_optimizer"] = {"device": "cpu"}
    if offload == "cpu+param":
        zero["offload_param"] = {"device": "cpu"}
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # no step log lines from the simulated ranks
    }
    if dtype in ("bf16", "fp16"):
        cfg[dtype] = {"enabled": True}
    cfg.update(extra or {})
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
) -> list[Estimate]:
    """``initialize``: the engine to measure (``ds.initialize``'s signature; ``ds.full`` hands in
    its own). ``backend``: the collectives' backend (nccl for GPUs, gloo for CPU runs), which
    decides the bucket and staging buffers ds allocates."""
    if world < 1:
        raise ConfigError(f"--world {world}: must be >= 1")
    simulate = registry.get(registry.SIMULATIONS, "memory")
    out = []
    nodes = max(1, -(-world // gpus_per_node))
    per_node = min(world, gpus_per_node)
    for stage in stages:
        for offload in offloads:
            if (offload == "cpu+param" and stage != 3) or (offload != "none" and stage == 0):
                continue  # parameter offload is stage 3's; optimizer offload needs stage >= 1
            cfg = ds_config(stage, offload, micro_batch, dtype)
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
            ref = deepspeed_estimate(
                spec.params,
                spec.largest_layer_params,
                stage,
                per_node,
                nodes,
                offload_optimizer=offload != "none",
                offload_param=offload == "cpu+param",
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
