"""The engine thread's request metrics on a real engine whose KV cache is too small for all its
requests at once: preemptions are counted, every request's queue, prefill and decode time add
up to its end-to-end latency, and preempted requests still produce what they produce alone."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from inference_models import prompts

from ds.inference import build_engine, generate
from ds.inference.engine_loop import EngineLoop, Event, TokenEvent
from ds.inference.sampling import SamplingOptions
from ds.inference.tokenizer import TextCodec

pytest.importorskip("prometheus_client")

pytestmark = pytest.mark.timeout(300)


def _value(metrics: Any, name: str) -> float:
    """A sample of the app's own registry."""
    return float(metrics.registry.get_sample_value(name, {"model_name": "m"}) or 0.0)


def test_preemptions_and_request_times(tiny_dirs: dict[str, Path]) -> None:
    from ds.inference.metrics import ServerMetrics

    # 4 requests of 20 + 40 tokens need 16 blocks of 16; the cache holds 8.
    engine = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 8}})
    asks = prompts(4, 20, 20, seed=3)
    params = SamplingOptions(max_new_tokens=40, ignore_eos=True)
    metrics = ServerMetrics("m")
    loop = EngineLoop(engine, TextCodec(None), metrics)
    tokens: dict[int, list[int]] = {i: [] for i in range(4)}
    done = threading.Semaphore(0)

    def deliver(i: int) -> object:
        def on(ev: Event) -> None:
            assert isinstance(ev, TokenEvent), ev
            if ev.token is not None:
                tokens[i].append(ev.token)
            if ev.finish_reason is not None:
                done.release()

        return on

    try:
        for i, p in enumerate(asks):
            loop.submit(p, [params], [deliver(i)])  # type: ignore[list-item]
        for _ in asks:
            assert done.acquire(timeout=240)
    finally:
        loop.close()
    assert _value(metrics, "ds_num_preemptions_total") > 0
    assert _value(metrics, "ds_e2e_request_latency_seconds_count") == 4
    parts = 0.0
    for name in ("queue", "prefill", "decode"):
        assert _value(metrics, f"ds_request_{name}_time_seconds_count") == 4
        parts += _value(metrics, f"ds_request_{name}_time_seconds_sum")
    assert parts == pytest.approx(_value(metrics, "ds_e2e_request_latency_seconds_sum"))
    roomy = build_engine(tiny_dirs["llama"], {"kv_cache": {"block_size": 16, "num_blocks": 64}})
    alone = generate(roomy, asks, params)
    assert [tokens[i] for i in range(4)] == [r.tokens for r in alone]
