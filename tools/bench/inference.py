"""Inference engine benchmark on CPU: ds.inference continuous batching vs transformers generate.

Workloads (random-weight Llama built from a small config, no downloads):

* mixed: 64 requests, prompts 16-512 tokens, outputs 16-128 tokens. ds serves them with
  continuous batching (Dynamic SplitFuse); the peer runs `generate` on padded static batches
  (left padding, each batch decodes until its longest output). Reported: output tokens/s counting
  only the tokens each request asked for, and KV memory utilisation (cached tokens / allocated
  slots) of both.
* prefix: requests sharing a long system prompt, with prefix caching on vs off.

* http (``--http``): the mixed workload's first ``--http-requests`` requests through ``ds serve``
  (streaming completions over loopback) at 1, 8 and 32 concurrent clients: output tokens/s and
  p50/p99 of time to first token and of the time between tokens (tools/bench/inference_http.py).

The ``speedup`` column is the reference's median time over the row's (> 1: faster than the
reference: transformers generate for the mixed case, prefix caching off for the prefix case).
``cpu/wall`` and the context-switch counts (``vol_cs``: the process blocked, ``invol_cs``: it was
preempted) tell idle time apart from a busy machine.

* ceiling (``--ceiling``): decode on the real SmolLM2-135M at batch 1 and batched, against the
  machine's bandwidth and GEMM ceilings (``ds bench peak``; tools/bench/inference_ceiling.py).
* llama.cpp (``--llamacpp-python PY``): only SmolLM2-135M on ds and on llama.cpp side by side, the
  peer in its own venv, batch 1 and 16 at fp32/fp16/int8/int4 (tools/bench/inference_llamacpp.py).

Usage: .venv/bin/python tools/bench/inference.py [--requests 64] [--repeat 2] [--hf-batch 16]
       [--http] [--http-requests 32] [--ceiling [--ceiling-batch 1 64] [--ceiling-new 48]]
       [--llamacpp-python /tmp/llamavenv/bin/python]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
from harness import Bench
from models import llama_shape

from ds.inference import SamplingParams, build_engine, generate
from ds.inference.scheduler import ContinuousBatchScheduler

MODEL = llama_shape(256, 688, layers=4, heads=8, kv_heads=4, vocab=4096, positions=2048)


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


class Usage:
    """Wall and CPU seconds and context switches of the enclosed block."""

    def __enter__(self) -> Usage:
        self.t0, self.c0 = time.perf_counter(), time.process_time()
        self.r0 = resource.getrusage(resource.RUSAGE_SELF)
        return self

    def __exit__(self, *exc: object) -> None:
        r = resource.getrusage(resource.RUSAGE_SELF)
        self.wall = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.c0
        self.vol = r.ru_nvcsw - self.r0.ru_nvcsw
        self.invol = r.ru_nivcsw - self.r0.ru_nivcsw


def run_ds(engine: Any, prompts: list[list[int]], outs: list[int]) -> tuple[Usage, float]:
    """Usage of the run, and mean KV utilisation over the steps."""
    sched = ContinuousBatchScheduler(engine)
    for i, (p, m) in enumerate(zip(prompts, outs)):
        sched.add_request(i, p, SamplingParams(max_new_tokens=m))
    util: list[float] = []
    with Usage() as use:
        while sched.has_unfinished():
            sched.step()
            util.append(engine.kv_utilisation())
    produced = sum(len(r.generated) for r in sched.finished.values())
    assert produced == sum(outs), (produced, sum(outs))
    return use, statistics.mean(u for u in util if u > 0)


def run_hf(
    model: Any, prompts: list[list[int]], outs: list[int], batch: int
) -> tuple[Usage, float]:
    """Static batches in arrival order, left-padded; utilisation = real tokens / padded slots."""
    real = slots = 0
    with Usage() as use:
        _hf_batches(model, prompts, outs, batch)
    for a in range(0, len(prompts), batch):
        ps, ms = prompts[a : a + batch], outs[a : a + batch]
        width, new = max(len(p) for p in ps), max(ms)
        real += sum(len(p) + m for p, m in zip(ps, ms))
        slots += len(ps) * (width + new)
    return use, real / slots


def _hf_batches(model: Any, prompts: list[list[int]], outs: list[int], batch: int) -> None:
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


def _usage_extras(runs: list[Usage]) -> dict[str, float]:
    wall = statistics.median(u.wall for u in runs)
    cpu = statistics.median(u.cpu for u in runs)
    return {
        "cpu_s": cpu,
        "cpu/wall": cpu / wall,
        "vol_cs": statistics.median(u.vol for u in runs),
        "invol_cs": statistics.median(u.invol for u in runs),
    }


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
    ap.add_argument("--http", action="store_true", help="also run the load through ds serve")
    ap.add_argument("--http-requests", type=int, default=32)
    ap.add_argument("--http-clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--skip-offline", action="store_true", help="only the --http part")
    ap.add_argument(
        "--ceiling",
        action="store_true",
        help="only decode on SmolLM2-135M against the machine's ceilings (inference_ceiling.py)",
    )
    ap.add_argument("--ceiling-batch", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--ceiling-new", type=int, default=48, help="tokens decoded per sequence")
    ap.add_argument(
        "--llamacpp-python",
        help="only ds vs llama.cpp on SmolLM2-135M, the peer run by this python (its own venv)",
    )
    args = ap.parse_args()
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    if args.ceiling:
        from inference_ceiling import run

        run(args.ceiling_batch, args.ceiling_new, args.threads, args.repeat).report()
        return
    if args.llamacpp_python:
        import inference_llamacpp

        inference_llamacpp.main(["--llamacpp-python", args.llamacpp_python,
                                 "--repeat", str(args.repeat), "--threads", str(args.threads)])  # fmt: skip
        return
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
    if not args.skip_offline:
        offline(args, model, prompts, outs, out_tokens, config)
    if args.http:
        http(args, model, prompts, outs)


def offline(
    args: argparse.Namespace,
    model: Any,
    prompts: list[list[int]],
    outs: list[int],
    out_tokens: int,
    config: dict[str, Any],
) -> None:
    # Prefix caching off for the comparison with generate: the workload repeats, and from the
    # second run on every prompt would hit the blocks the first one cached.
    engine = build_engine(model, {**config, "prefix_caching": False})
    # Prefix caching on against off where nothing can hit (fresh prompts every run): what
    # publishing and looking up blocks costs, the price of having it on by default.
    cached = build_engine(model, {**config, "prefix_caching": True})
    # Warm-up both sides on a couple of requests.
    run_ds(engine, prompts[:2], [4, 4])
    run_ds(cached, prompts[:2], [4, 4])
    run_hf(model, prompts[:2], [4, 4], 2)

    # No harness "ratio" column: it is a time ratio (below 1 = faster), which read as a speedup
    # beside the summary line's throughput ratio. "speedup" below is reference time / own time.
    bench = Bench("inference", unit="s")
    case = f"{args.requests} req, prompts 16-512, outputs 16-128 ({out_tokens} out tok)"
    ds_runs: list[Usage] = []
    hf_runs: list[Usage] = []
    fresh: dict[bool, list[Usage]] = {False: [], True: []}
    ds_u, hf_u = [], []
    for i in range(args.repeat):  # interleaved so machine noise hits both alike
        use, u = run_ds(engine, prompts, outs)
        ds_runs.append(use)
        ds_u.append(u)
        new_prompts, new_outs = workload(args.requests, seed=100 + i)
        for on in (False, True) if i % 2 == 0 else (True, False):  # alternating which goes first
            fresh[on].append(run_ds(cached if on else engine, new_prompts, new_outs)[0])
        use, u = run_hf(model, prompts, outs, args.hf_batch)
        hf_runs.append(use)
        hf_u.append(u)
    ds_t = [u.wall for u in ds_runs]
    hf_t = [u.wall for u in hf_runs]
    hf_med = statistics.median(hf_t)
    bench.add(
        "ds-continuous",
        case,
        ds_t,
        tokens_per_s=out_tokens / statistics.median(ds_t),
        speedup=hf_med / statistics.median(ds_t),
        kv_util=statistics.mean(ds_u),
        **_usage_extras(ds_runs),
    )
    fcase = f"{args.requests} req mixed, fresh prompts every run (no prefix hits)"
    fresh_off = statistics.median(u.wall for u in fresh[False])
    for on, us in fresh.items():
        med = statistics.median(u.wall for u in us)
        bench.add(
            f"ds-prefix-cache-{'on' if on else 'off'}",
            fcase,
            [u.wall for u in us],
            speedup=fresh_off / med,
            **_usage_extras(us),
        )
    bench.add(
        f"hf-generate-b{args.hf_batch}",
        case,
        hf_t,
        tokens_per_s=out_tokens / hf_med,
        speedup=1.0,
        kv_util=statistics.mean(hf_u),
        **_usage_extras(hf_runs),
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
    runs: dict[str, list[Usage]] = {"prefix-cache-off": [], "prefix-cache-on": []}
    for _ in range(args.repeat):
        for name, on in (("prefix-cache-off", False), ("prefix-cache-on", True)):
            eng = build_engine(model, {**config, "prefix_caching": on})
            generate(eng, [system + [1]], SamplingParams(max_new_tokens=1))  # publish the prefix
            with Usage() as use:
                res = generate(eng, sp, params)
            runs[name].append(use)
            if on:
                assert all(r.cached_prefix_tokens == 384 for r in res)
    off = statistics.median(u.wall for u in runs["prefix-cache-off"])
    for name, us in runs.items():
        med = statistics.median(u.wall for u in us)
        bench.add(
            name,
            pcase,
            [u.wall for u in us],
            tokens_per_s=32 * 16 / med,
            speedup=off / med,
            **_usage_extras(us),
        )
    bench.report()
    ds_med = statistics.median(ds_t)
    cspeed = statistics.median(u.cpu for u in hf_runs) / statistics.median(u.cpu for u in ds_runs)
    pspeed = off / statistics.median(u.wall for u in runs["prefix-cache-on"])
    print(
        f"\nthroughput ds / hf-generate: {hf_med / ds_med:.2f}x wall, {cspeed:.2f}x CPU time; "
        f"prefix-cache hit speedup: {pspeed:.2f}x"
    )
    print(f"KV utilisation: ds {statistics.mean(ds_u):.3f}, hf padded {statistics.mean(hf_u):.3f}")
    on_off = [statistics.median(getattr(u, k) for u in fresh[True]) /
              statistics.median(getattr(u, k) for u in fresh[False]) for k in ("wall", "cpu")]  # fmt: skip
    print(
        f"prefix caching on / off with no hits (fresh mixed prompts): {on_off[0]:.3f}x wall, "
        f"{on_off[1]:.3f}x CPU time"
    )


def http(args: argparse.Namespace, model: Any, prompts: list[list[int]], outs: list[int]) -> None:
    from inference_http import run, table

    n = args.http_requests
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        # Every client count replays the same prompts: with the prefix cache on, all but the
        # first would be served from the blocks the first cached.
        server_args = [
            "--no-enable-prefix-caching",
            "--block-size",
            "32",
            "--num-blocks",
            "1536",
            "--max-num-seqs",
            str(max(args.http_clients)),
            "--max-num-batched-tokens",
            str(args.token_budget),
        ]
        rows = run(Path(tmp), prompts[:n], outs[:n], args.http_clients, server_args)
    print(f"\n## inference over HTTP (ds serve, {n} requests of the mixed workload)\n")
    print(table(rows, f"{n} req mixed"))


if __name__ == "__main__":
    main()
