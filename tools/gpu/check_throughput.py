"""Step time, tokens/s and MFU of a Llama-shaped model: ds ZeRO beside torch DDP and FSDP2, all
bf16 compute with fp32 master weights and AdamW, on the same batches in one process."""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import torch
from models import build_llama, flops_per_token, param_count

LR = 1e-4


def _batch(size: str, batch: int, seq: int, device: torch.device) -> torch.Tensor:
    from models import SIZES

    g = torch.Generator().manual_seed(0)
    return torch.randint(0, SIZES[size]["vocab_size"], (batch, seq), generator=g).to(device)


def _timer(device: torch.device) -> tuple[Callable[[], Any], Callable[[Any], float]]:
    if device.type == "cuda":

        def start() -> Any:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev

        def stop(ev: Any) -> float:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            end.synchronize()
            return float(ev.elapsed_time(end)) / 1e3

        return start, stop
    return time.perf_counter, lambda t0: time.perf_counter() - t0


def _ds(size: str, device: torch.device, stage: int, micro: int) -> Callable[[torch.Tensor], None]:
    import ds.full as ds

    cfg = {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "bf16": {"enabled": True},
        "optimizer": {"type": "AdamW", "params": {"lr": LR}},
        "zero_optimization": {"stage": stage},
    }
    engine, *_ = ds.initialize(model=build_llama(size), config=cfg)

    def step(ids: torch.Tensor) -> None:
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()

    return step


def _torch_step(model: torch.nn.Module, device: torch.device, autocast: bool) -> Any:
    opt = torch.optim.AdamW(model.parameters(), lr=LR, fused=device.type == "cuda")

    def step(ids: torch.Tensor) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _ddp(size: str, device: torch.device, stage: int, micro: int) -> Callable[[torch.Tensor], None]:
    from torch.nn.parallel import DistributedDataParallel

    model = build_llama(size).to(device)
    ids = [device.index] if device.type == "cuda" else None
    return _torch_step(DistributedDataParallel(model, device_ids=ids), device, autocast=True)


def _fsdp2(
    size: str, device: torch.device, stage: int, micro: int
) -> Callable[[torch.Tensor], None]:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = build_llama(size).to(device)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return _torch_step(model, device, autocast=False)


SYSTEMS: dict[str, Callable[..., Callable[[torch.Tensor], None]]] = {
    "torch FSDP2": _fsdp2,
    "ds ZeRO-2": lambda size, device, stage, micro: _ds(size, device, 2, micro),
    "ds ZeRO-3": lambda size, device, stage, micro: _ds(size, device, 3, micro),
    "torch DDP": _ddp,
    "ds": _ds,  # the ZeRO stage of --bench-stage
}
DEFAULT_SYSTEMS = ["torch FSDP2", "ds ZeRO-2", "ds ZeRO-3"]


def one(
    name: str,
    size: str,
    device: torch.device,
    batch: int,
    seq: int,
    steps: int,
    warmup: int,
    stage: int,
    peak: float | None,
    deadline: float,
) -> dict[str, Any]:
    """One system's row: median step time over up to ``steps`` timed steps, fewer when the
    row's ``deadline`` (time.monotonic) comes first (at least one)."""
    ids = _batch(size, batch, seq, device)
    tokens = batch * seq
    start, stop = _timer(device)
    row: dict[str, Any] = {}
    try:
        step = SYSTEMS[name](size, device, stage, batch)
        for _ in range(warmup):
            step(ids)
        times: list[float] = []
        while len(times) < steps and (not times or time.monotonic() < deadline):
            t0 = start()
            step(ids)
            times.append(stop(t0))
        times.sort()
        median = times[len(times) // 2]
        row["value"] = tokens / median
        row["unit"] = "tokens/s"
        row["step_s"] = median
        row["timed_steps"] = len(times)
        achieved = flops_per_token(size, seq) * tokens / median
        row["mfu"] = achieved / (peak * 1e12) if peak else None
        if device.type == "cuda":
            row["peak_mem_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
    finally:
        step = None  # type: ignore[assignment]
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats(device)
    row["params"] = param_count(size)
    row["tokens_per_step"] = tokens
    return row
