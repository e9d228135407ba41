"""One rank of tools/bench/train_stage3.py.

    train_stage3_worker.py IMPL STEPS OUT_JSON NVME_DIR    (RANK/WORLD_SIZE/MASTER_* in the env)

IMPL: ``ddp``, ``ds0`` (ds ZeRO-0), ``ds3``, ``ds3-cpu`` (param + optimizer offload to cpu),
``ds3-nvme`` (param + optimizer offload to NVMe), ``fsdp2`` (torch fully_shard on gloo),
``deepspeed3`` (deepspeed.initialize, same ZeRO-3 config).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_gpt import GPT

VOCAB, D, LAYERS, HEADS, SEQ, MICRO = 8192, 512, 6, 8, 128, 4
WARMUP = 2


def config(impl: str, nvme: str) -> dict[str, Any]:
    zero: dict[str, Any] = {"stage": 0 if impl == "ds0" else 3}
    if zero["stage"] == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": 5e6,
                "stage3_max_live_parameters": 1e7,
                "stage3_max_reuse_distance": 0,
                "stage3_param_persistence_threshold": 1e4,
                "reduce_bucket_size": 5e6,
            }
        )
    if impl == "ds3-cpu":
        zero["offload_param"] = {"device": "cpu"}
        zero["offload_optimizer"] = {"device": "cpu"}
    if impl == "ds3-nvme":
        zero["offload_param"] = {"device": "nvme", "nvme_path": nvme}
        zero["offload_optimizer"] = {"device": "nvme", "nvme_path": nvme}
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 10**6,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01}},
        "zero_optimization": zero,
    }


def main() -> None:
    impl, steps, out, nvme = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (MICRO, SEQ), generator=g)
    if impl == "ddp":
        dist.init_process_group("gloo")
        model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4, weight_decay=0.01)

        def step() -> None:
            opt.zero_grad()
            net(x, y).backward()
            opt.step()
    elif impl == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for block in model.blocks:  # type: ignore[attr-defined]
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

        def step() -> None:
            opt.zero_grad()
            model(x, y).backward()
            opt.step()
    elif impl.startswith("ds"):
        import ds.full as ds
        from ds.zero import Init

        ds.init_distributed()
        with Init(enabled=impl != "ds0"):
            model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
        engine, *_ = ds.initialize(model=model, config=config(impl, nvme))

        def step() -> None:
            engine.backward(engine(x, y))
            engine.step()
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        cfg = config("ds3" if impl == "deepspeed3" else impl, nvme)
        with deepspeed.zero.Init(config_dict_or_path=cfg):
            model = GPT(VOCAB, D, LAYERS, HEADS, SEQ)
        engine, *_ = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=cfg
        )

        def step() -> None:
            engine.backward(engine(x, y))
            engine.step()

    params = sum(
        p.ds_shard.numel if hasattr(p, "ds_shard") else p.numel() for p in model.parameters()
    )
    for _ in range(WARMUP):
        step()
    times = []
    for _ in range(steps):
        dist.barrier()
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    rss_all: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rss_all, rss)
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps({"times_s": times, "rss": rss_all, "params": params}))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    main()
