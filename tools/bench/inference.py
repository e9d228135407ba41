"""Inference engine benchmark on CPU: ds.inference continuous batching vs transformers generate.

Workloads (random-weight Llama built from a small config, no downloads):

* mixed: 64 requests, prompts 16-512 tokens, outputs 16-128 tokens. ds serves them with
  continuous batching (Dynamic SplitFuse); the peer runs `generate` on padded static batches
  (left padding, each batch decodes until its longest output). Reported: output tokens/s counting
  only the tokens each request asked for, and KV memory utilisation (cached tokens / allocated
  slots) of both.
* prefix: requests sharing a long system prompt, with prefix caching on vs off.

Usage: .venv/bin/python tools/bench/inference.py [--requests 64] [--repeat 2] [--hf-batch 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import Bench

from ds.inference import SamplingParams, build_engine, generate
from ds.inference.scheduler import ContinuousBatchScheduler

MODEL = dict(
    vocab_size=4096,
    hidden_size=256,
    intermediate_size=688,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=2048,
)


def make_model() -> Any:
    import transformers

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**MODEL)).eval()
    return model


def workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(16, 513, (n,), generator=g).tolist()
    outs = torch.randint(16, 129, (n,), generator=g).tolist()
    prompts = [torch.randint(1, MODEL["vocab_size"], (k,), generator=g).tolist() for k in lens]
    return prompts, outs


def run_ds(engine: Any, prompts: list[list[int]], outs: list[int]) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds, and mean KV utilisation over the steps."""
    sched = ContinuousBatchScheduler(engine)
    for i, (p, m) in enumerate(zip(prompts, outs)):
        sched.add_request(i, p, SamplingParams(max_new_tokens=m))
    util: list[float] = []
    t0, c0 = time.perf_counter(), time.process_time()
    while sched.has_unfinished():
        sched.step()
        util.append(engine.kv_utilisation())
    dt, dc = time.perf_counter() - t0, time.process_time() - c0
    produced = sum(len(r.generated) for r in sched.finished.values())
    assert produced == sum(outs), (produced, sum(outs))
    return dt, dc, statistics.mean(u for u in util if u > 0)


def run_hf(
    model: Any, prompts: list[list[int]], outs: list[int], batch: int
) -> tuple[float, float, float]:
    """Static batches in arrival order, left-padded; utilisation = real tokens / padded slots."""
    t0, c0 = time.perf_counter(), time.process_time()
    real = slots = 0
    for a in range(0, len(prompts), batch):
        ps, ms = prompts[a : a + batch], outs[a : a + batch]
        width = max(len(p) for p in ps)
        ids = torch.zeros(len(ps), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(ps):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        new = max(ms)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        real += sum(len(p) + m for p, m in zip(ps, ms))
        slots += len(ps) * (width + new)
    return time.perf_counter() - t0, time.process_time() - c0, real / slots


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hf-batch", type=int, default=16)
    ap.add_argument("--token-budget", type=int, default=512)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads for both sides (1 keeps a shared machine fair)",
    )
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    model = make_model()
    prompts, outs = workload(args.requests)
    out_tokens = sum(outs)
    config = {
        "kv_cache": {"block_size": 32, "num_blocks": 1536},
        "scheduler": {"token_budget": args.token_budget, "max_running": args.requests},
        "state_manager": {
            "max_ragged_sequence_count": 256,
            "max_tracked_sequences": 256,
            "max_context": 1024,
        },
    }
    engine = build_engine(model, config)
    # Warm-up both sides on a couple of requests.
    run_ds(engine, prompts[:2], [4, 4])
    run_hf(model, prompts[:2], [4, 4], 2)

    bench = Bench("inference", peer=f"hf-generate-b{args.hf_batch}", unit="s")
    case = f"{args.requests} req, prompts 16-512, outputs 16-128 ({out_tokens} out tok)"
    ds_t, hf_t, ds_c, hf_c, ds_u, hf_u = [], [], [], [], [], []
    for _ in range(args.repeat):  # interleaved so machine noise hits both alike
        t, c, u = run_ds(engine, prompts, outs)
        ds_t.append(t)
        ds_c.append(c)
        ds_u.append(u)
        t, c, u = run_hf(model, prompts, outs, args.hf_batch)
        hf_t.append(t)
        hf_c.append(c)
        hf_u.append(u)
    # CPU seconds beside wall time: on a shared machine they track the work each side did.
    bench.add(
        "ds-continuous",
        case,
        ds_t,
        tokens_per_s=out_tokens / statistics.median(ds_t),
        cpu_s=statistics.median(ds_c),
        kv_util=statistics.mean(ds_u),
    )
    bench.add(
        f"hf-generate-b{args.hf_batch}",
        case,
        hf_t,
        tokens_per_s=out_tokens / statistics.median(hf_t),
        cpu_s=statistics.median(hf_c),
        kv_util=statistics.mean(hf_u),
    )

    # Prefix caching: 32 requests share a 384-token system prompt, each with its own 32 tokens.
    g = torch.Generator().manual_seed(1)
    system = torch.randint(1, MODEL["vocab_size"], (384,), generator=g).tolist()
    sp = [
        system + torch.randint(1, MODEL["vocab_size"], (32,), generator=g).tolist()
        for _ in range(32)
    ]
    params = SamplingParams(max_new_tokens=16)
    pcase = "32 req, shared 384-token prefix + 32 own, 16 out"
    times: dict[str, list[float]] = {"prefix-cache-off": [], "prefix-cache-on": []}
    cpu: dict[str, list[float]] = {"prefix-cache-off": [], "prefix-cache-on": []}
    for _ in range(args.repeat):
        for name, on in (("prefix-cache-off", False), ("prefix-cache-on", True)):
            eng = build_engine(model, {**config, "prefix_caching": on})
            generate(eng, [system + [1]], SamplingParams(max_new_tokens=1))  # publish the prefix
            t0, c0 = time.perf_counter(), time.process_time()
            res = generate(eng, sp, params)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            if on:
                assert all(r.cached_prefix_tokens == 384 for r in res)
    for name, ts in times.items():
        bench.add(
            name,
            pcase,
            ts,
            tokens_per_s=32 * 16 / statistics.median(ts),
            cpu_s=statistics.median(cpu[name]),
        )
    bench.report()
    speed = statistics.median(hf_t) / statistics.median(ds_t)
    pspeed = statistics.median(times["prefix-cache-off"]) / statistics.median(
        times["prefix-cache-on"]
    )
    cspeed = statistics.median(hf_c) / statistics.median(ds_c)
    print(
        f"\nthroughput ds / hf-generate: {speed:.2f}x wall, {cspeed:.2f}x CPU time; "
        f"prefix-cache hit speedup: {pspeed:.2f}x"
    )
    print(f"KV utilisation: ds {statistics.mean(ds_u):.3f}, hf padded {statistics.mean(hf_u):.3f}")


if __name__ == "__main__":
    main()
