"""Larger than memory: a Llama whose model states exceed the machine's RAM, trained with ZeRO-3 and
parameters plus optimizer states offloaded to NVMe, beside ``ds estimate``'s predicted RSS.

    .venv/bin/python tools/bench/infinity.py [--size 2.5b] [--steps 3] [--seq-len 32] \
        [--nvme-path /work/ds-infinity-swap] [--json out.json]

The model is built under ``ds.zero.Init`` (each module whole for a moment, then partitioned), so
it is never whole in memory at once; ``ds.initialize`` moves the shards to the swap file, then
masters and Adam moments to theirs (room for both is checked first). One rank, fp32, AdamW, the
same batch each step (the loss must fall). The run is a fresh process (``--worker``) so its peak
RSS (VmHWM) is its own: the build's peak (model, engine, swap files written) and the steps' peak
are read separately. The estimate is ``ds estimate``'s (``ds.autotune.estimate``, offload
``nvme+param``, gloo backend: a simulated CPU rank, whose device and host are one memory) with
the benchmark's config as the job's, plus the runtime's own RSS, measured by the worker before
the model is built: estimate = runtime + the larger of the build and step peaks. The swap
directory is removed afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from harness import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
from models import llama_shape

HERE = Path(__file__).resolve().parent

SIZES: dict[str, dict[str, int]] = {
    # ~0.32B: 65.5M in the two embeddings, 12.8M in each of 20 layers.
    "300m": llama_shape(1024, 2816, layers=20, heads=16, kv_heads=16, vocab=32000, positions=256),
    # ~0.61B: 98.3M in the two embeddings, 28.3M in each of 18 layers.
    "0.6b": llama_shape(1536, 4096, layers=18, heads=12, kv_heads=12, vocab=32000, positions=256),
    # ~0.80B, ~1.06B, ~1.11B, ~1.16B, ~1.21B, ~1.52B: 131M in the two embeddings, 51.4M in each
    # of 13, 18, 19, 20, 21, 27 layers (the steps between a 16 B/parameter run that fits this
    # machine's RAM and one that does not).
    "0.8b": llama_shape(2048, 5632, layers=13, heads=16, kv_heads=16, vocab=32000, positions=256),
    "1b": llama_shape(2048, 5632, layers=18, heads=16, kv_heads=16, vocab=32000, positions=256),
    "1.1b": llama_shape(2048, 5632, layers=19, heads=16, kv_heads=16, vocab=32000, positions=256),
    "1.15b": llama_shape(2048, 5632, layers=20, heads=16, kv_heads=16, vocab=32000, positions=256),
    "1.2b": llama_shape(2048, 5632, layers=21, heads=16, kv_heads=16, vocab=32000, positions=256),
    "1.5b": llama_shape(2048, 5632, layers=27, heads=16, kv_heads=16, vocab=32000, positions=256),
    # ~2.54B: 164M in the two embeddings, 79.3M in each of 30 layers; 40.6 GB of model states.
    "2.5b": llama_shape(2560, 6912, layers=30, heads=20, kv_heads=20, vocab=32000, positions=256),
    # CI-sized: the same route in seconds.
    "tiny": llama_shape(64, 128, layers=2, heads=4, kv_heads=4, vocab=256, positions=256),
}


# Allocations of 1 MiB and more are mappings of their own, returned to the system when freed (the
# build frees one module's whole parameters at a time; glibc's heap would keep them).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}
# Gathered parameters kept live between uses (DeepSpeed's default is 1e9 elements: 4 GB of fp32,
# more than the rest of the run's memory together).
MAX_LIVE = 100_000_000


def hf_config(size: str) -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(**SIZES[size])


def ds_config(nvme_path: str, lr: float, max_live: int = MAX_LIVE) -> dict[str, Any]:
    # Two swap buffers (sets) each: a set is sized by the largest partition, the embedding's.
    where = {"device": "nvme", "nvme_path": nvme_path, "buffer_count": 2}
    return {
        "train_micro_batch_size_per_gpu": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": lr, "weight_decay": 0.0}},
        "zero_optimization": {
            "stage": 3,
            "stage3_max_live_parameters": max_live,
            "offload_param": dict(where),
            "offload_optimizer": dict(where),
        },
        "steps_per_print": 10**9,
    }


def vm(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS


def worker(args: argparse.Namespace) -> None:
    """The real run: build, ``--steps`` steps, JSON of the losses, times and peaks."""
    import torch
    from transformers import LlamaForCausalLM

    import ds.full as ds
    from ds.zero import Init

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    ds.init_distributed()
    torch.manual_seed(0)
    runtime = vm("VmRSS")
    config = ds_config(args.nvme_path, args.lr)
    t0 = time.perf_counter()
    with Init(config_dict_or_path=config):
        model = LlamaForCausalLM(hf_config(args.size))
    params = sum(p.ds_shard.numel for p in model.parameters())
    engine, *_ = ds.initialize(model=model, config=config)
    build_s = time.perf_counter() - t0
    build_peak = vm("VmHWM")
    reset_peak()
    ids = torch.randint(0, SIZES[args.size]["vocab_size"], (1, args.seq_len))
    losses, times = [], []
    for _ in range(args.steps):
        t = time.perf_counter()
        loss = engine(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        engine.step()
        times.append(time.perf_counter() - t)
        losses.append(loss.item())
        print(f"step {len(times)}: loss {losses[-1]:.4f} in {times[-1]:.1f} s", flush=True)
    step_peak = vm("VmHWM")
    swap = sum(f.stat().st_size for f in Path(args.nvme_path).glob("*.swp"))
    out = {
        "size": args.size,
        "params": params,
        "seq_len": args.seq_len,
        "losses": losses,
        "step_s": times,
        "build_s": build_s,
        "runtime_rss": runtime,
        "build_peak_rss": build_peak,
        "step_peak_rss": step_peak,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "swap_bytes": swap,
    }
    engine.destroy()
    Path(args.out).write_text(json.dumps(out))


def estimated(size: str, nvme_path: str, lr: float, seq_len: int) -> tuple[int, int, int]:
    """(build peak, step peak, host peak) from ``ds estimate --backend gloo --offload nvme+param
    --dtype fp32 --stages 3 --world 1`` with the benchmark's config as the job's (``--config``):
    one CPU rank, so the host peak is 0 and the device peaks are its whole memory."""
    import torch
    from transformers import AutoModelForCausalLM

    from ds.autotune import estimate
    from ds.autotune.model_spec import from_module_builder
    from ds.full.training import initialize  # the engine `ds estimate` measures

    cfg = hf_config(size)

    def build(device: torch.device) -> torch.nn.Module:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)

    (row,) = estimate(from_module_builder(f"Llama {size}", build), 1, initialize=initialize,
                      stages=(3,), offloads=("nvme+param",), seq_len=seq_len, dtype="fp32",
                      backend="gloo", nvme_path=nvme_path, config=ds_config(nvme_path, lr))  # fmt: skip
    return row.device_init_peak, row.device_peak, row.host_peak


def available() -> int:
    with open("/proc/meminfo") as f:
        info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f}
    return info["MemAvailable"]


def worker_env() -> dict[str, str]:
    """The environment of a one-rank worker (world 1 on gloo, 2 threads, MALLOC_ENV)."""
    return dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
                DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1",
                LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                **MALLOC_ENV)  # fmt: skip


def run_args(doc: str, size: str) -> argparse.ArgumentParser:
    """The options of this run that the peer's (infinity_fsdp2.py) shares."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--size", choices=sorted(SIZES), default=size)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", help="write the result here too")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    return ap


def worker_cmd(script: str, args: argparse.Namespace, out: Path, *extra: str) -> list[str]:
    """The command line of ``script``'s worker process for the run ``args`` asks for."""
    return [sys.executable, script, "--worker", "--size", args.size, "--steps", str(args.steps),
            "--seq-len", str(args.seq_len), "--lr", str(args.lr), "--out", str(out),
            *extra]  # fmt: skip


def main() -> None:
    ap = run_args(__doc__, "2.5b")
    ap.add_argument("--nvme-path", default="/work/ds-infinity-swap")
    ap.add_argument("--no-estimate", action="store_true", help="skip the simulated estimate")
    ap.add_argument("--estimate-only", action="store_true", help="print the simulated parts only")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    if args.estimate_only:
        parts = estimated(args.size, args.nvme_path, args.lr, args.seq_len)
        print(json.dumps(dict(zip(("device_build_peak", "device_step_peak", "host_peak"), parts))))
        return
    gib = 2**30
    print(f"memory available: {available() / gib:.1f} GiB", flush=True)
    work = Path(args.nvme_path)
    out = work.with_name(work.name + "-result.json")
    env = worker_env()
    cmd = worker_cmd(__file__, args, out, "--nvme-path", str(work))
    try:
        subprocess.run(cmd, check=True, env=env, timeout=3 * 3600)
        res = json.loads(out.read_text())
    finally:
        shutil.rmtree(work, ignore_errors=True)
        out.unlink(missing_ok=True)
    if not args.no_estimate:
        work.mkdir(parents=True, exist_ok=True)
        try:
            init_peak, step_peak, host = estimated(args.size, str(work), args.lr, args.seq_len)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        res["estimate_rss"] = res["runtime_rss"] + max(init_peak, step_peak) + host
        res["estimate_parts"] = {"device_build_peak": init_peak, "device_step_peak": step_peak,
                                 "host_peak": host}  # fmt: skip
    states = 16 * res["params"]
    print(f"{res['params'] / 1e9:.2f}B params, model states {states / 1e9:.1f} GB "
          f"(fp32 params, grads, AdamW), swap files {res['swap_bytes'] / 1e9:.1f} GB")  # fmt: skip
    print("| model | params | seq | step (s, each) | loss (first -> last) | peak RSS (GiB) "
          "| build / step peak (GiB) | ds estimate (GiB) | error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    est = res.get("estimate_rss")
    err = f"{100 * (est - res['peak_rss']) / res['peak_rss']:+.1f}%" if est else "-"
    print(f"| Llama {args.size} | {res['params'] / 1e9:.2f}B | {args.seq_len} | "
          f"{', '.join(f'{t:.1f}' for t in res['step_s'])} | "
          f"{res['losses'][0]:.3f} -> {res['losses'][-1]:.3f} | {res['peak_rss'] / gib:.2f} | "
          f"{res['build_peak_rss'] / gib:.2f} / {res['step_peak_rss'] / gib:.2f} | "
          f"{est / gib if est else float('nan'):.2f} | {err} |")  # fmt: skip
    if est:
        parts = res["estimate_parts"]
        print(f"estimate: runtime {res['runtime_rss'] / gib:.2f} + build peak "
              f"{parts['device_build_peak'] / gib:.2f} / step peak "
              f"{parts['device_step_peak'] / gib:.2f} GiB")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
