"""Pipeline parallelism: 1F1B vs GPipe (and interleaved 1F1B) step time and peak memory per stage.

Each (schedule, stages) pair runs in its own gloo world (so a process's peak RSS is that
schedule's), training a GPT-shaped PipelineModule through ``ds.initialize`` with ZeRO-1. Per run:
the median step time (the slowest stage's ``train_batch``), each stage's peak RSS growth over
its state right after ``ds.initialize`` (activations held by the schedule dominate it), and the
measured bubble fraction from the step metrics beside the formula (p - 1) / (v * m + p - 1).
Load average at start and end.

    python tools/bench/pipeline.py [--stages 2 4] [--steps 4] [--tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import free_port

SIZES = {
    "default": dict(dim=256, blocks=8, seq=256, micro=8, gas=8, vocab=512),
    "tiny": dict(dim=32, blocks=4, seq=16, micro=2, gas=4, vocab=64),
}
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


def _layers(size: dict[str, int]) -> list[Any]:
    import torch
    import torch.nn.functional as F

    from ds.parallel.pipeline import LayerSpec, TiedLayerSpec

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(size["vocab"], size["dim"]) * 0.02)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.weight[ids]

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            d = size["dim"]
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.up, self.down = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, 4, d // 4).unbind(2)
            a = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            )
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    def head(embed: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        return x @ embed.weight.T

    return (
        [TiedLayerSpec("embed", Embed)]
        + [LayerSpec(Block) for _ in range(size["blocks"])]
        + [
            LayerSpec(torch.nn.LayerNorm, size["dim"]),
            TiedLayerSpec("embed", Embed, forward_fn=head),
        ]
    )


def _rss_peak_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak() -> None:
    # Linux: writing 5 to clear_refs resets VmHWM to the current RSS.
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.nn.functional as F

    import ds.full as ds
    from ds import comm as dist
    from ds.parallel.pipeline import PipelineModule

    size = SIZES["tiny" if args.tiny else "default"]
    stages = args.stages[0]
    chunks = 2 if args.schedule == "interleaved_1f1b" else 1

    def loss_fn(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits[:, :-1].reshape(-1, size["vocab"]), ids[:, 1:].reshape(-1))

    net = PipelineModule(
        _layers(size), num_stages=stages, loss_fn=loss_fn, seed_layers=True,
        partition_method="type:Block", num_virtual_stages=chunks,
    )  # fmt: skip
    cfg = {
        "train_micro_batch_size_per_gpu": size["micro"],
        "gradient_accumulation_steps": size["gas"],
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
        "zero_optimization": {"stage": 1},
        "pipeline": {"stages": stages, "schedule": args.schedule},
        "steps_per_print": 10**6,
    }
    engine, _, _, _ = ds.initialize(model=net, config=cfg)
    g = torch.Generator().manual_seed(0)
    data = [
        (ids, ids)
        for ids in (
            torch.randint(0, size["vocab"], (size["micro"], size["seq"]), generator=g)
            for _ in range(size["gas"])
        )
    ]
    engine.train_batch(iter(data))  # warm-up: allocator, optimizer state
    dist.barrier()
    base = _rss_peak_bytes()
    _reset_peak()
    base = min(base, _rss_peak_bytes())
    times, bubbles = [], []
    for _ in range(args.steps):
        dist.barrier()
        t0 = time.perf_counter()
        engine.train_batch(iter(data))
        span = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(span, op=dist.ReduceOp.MAX)
        times.append(float(span))
        m = engine.last_metrics
        bubbles.append(m.pipeline_bubble_fraction)
        formula = m.pipeline_bubble_formula
    row = {
        "stage": engine.stage_id,
        "peak_growth_bytes": _rss_peak_bytes() - base,
        "compute_s": list(engine.last_metrics.stage_compute_s),
    }
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, row)
    if dist.get_rank() == 0:
        Path(args.out).write_text(
            json.dumps(
                {
                    "schedule": args.schedule,
                    "stages": stages,
                    "microbatches": size["gas"],
                    "chunks": chunks,
                    "times_s": times,
                    "median_s": statistics.median(times),
                    "bubble_measured": statistics.median(bubbles),
                    "bubble_formula": formula,
                    "per_stage": sorted(rows, key=lambda r: r["stage"]),
                }
            )
        )
    dist.barrier()
    dist.destroy_process_group()


def _launch(schedule: str, stages: int, args: argparse.Namespace, out: str) -> dict[str, Any]:
    port = str(free_port())
    procs = []
    for r in range(stages):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(stages),
                   LOCAL_WORLD_SIZE=str(stages), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   OMP_NUM_THREADS="1")  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", "--schedule", schedule, "--stages",
               str(stages), "--steps", str(args.steps), "--out", out]  # fmt: skip
        if args.tiny:
            cmd.append("--tiny")
        procs.append(
            subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    texts = []
    try:
        for p in procs:
            texts.append(p.communicate(timeout=args.timeout)[0].decode(errors="replace"))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, text in zip(procs, texts):
        if p.returncode != 0:
            raise SystemExit(f"{schedule} at {stages} stages failed:\n{text[-4000:]}")
    return dict(json.loads(Path(out).read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--schedule", default="1f1b")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    load0 = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for stages in args.stages:
            for schedule in SCHEDULES:
                out = os.path.join(tmp, f"{schedule}-{stages}.json")
                results.append(_launch(schedule, stages, args, out))
    load1 = os.getloadavg()
    print(f"{'schedule':<18}{'p':>3}{'m':>4}{'v':>3}{'step ms':>10}{'bubble':>9}{'formula':>9}"
          "  peak RSS growth per stage (MiB)")  # fmt: skip
    for r in results:
        peaks = " ".join(f"{s['peak_growth_bytes'] / 2**20:7.1f}" for s in r["per_stage"])
        print(f"{r['schedule']:<18}{r['stages']:>3}{r['microbatches']:>4}{r['chunks']:>3}"
              f"{r['median_s'] * 1e3:>10.1f}{r['bubble_measured']:>9.3f}{r['bubble_formula']:>9.3f}"
              f"  {peaks}")  # fmt: skip
    print(f"load average: start {load0[0]:.2f}, end {load1[0]:.2f} ({os.cpu_count()} cores)")
    where = Path(
        os.environ.get("DS_BENCH_DIR", Path(__file__).resolve().parents[2] / "bench-results")
    )
    where.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "pipeline", "size": "tiny" if args.tiny else "default", "results": results,
           "loadavg_start": load0, "loadavg_end": load1, "cpu_count": os.cpu_count(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    (where / "pipeline.json").write_text(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
