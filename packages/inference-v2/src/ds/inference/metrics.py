"""Prometheus metrics of ``ds serve`` (prometheus_client, one registry per app).

Names follow vLLM's where one exists, under the ``ds_`` prefix: running / waiting requests, KV
blocks used and free, prefix-cache hits, time to first token, time per output token, end-to-end
request latency, the time each request spent queued, in prefill and in decode, and preemptions.
Counters carry prometheus' ``_total`` suffix; the ``_created`` timestamp series are not exported.
"""

from __future__ import annotations

from typing import Any

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_REQUEST_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        from prometheus_client import (
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            disable_created_metrics,
        )

        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        r = self.registry

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(model_name)

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Any:
            c = Counter(name, doc, [*labels, *extra], registry=r)
            return c.labels(model_name) if not extra else c

        self.model_name = model_name
        self.running = gauge("ds_num_requests_running", "Requests in the running batch")
        self.waiting = gauge("ds_num_requests_waiting", "Requests queued for admission")
        self.kv_used = gauge("ds_kv_cache_used_blocks", "KV cache blocks in use")
        self.kv_free = gauge("ds_kv_cache_free_blocks", "KV cache blocks free or evictable")
        self.kv_usage = gauge("ds_kv_cache_usage_ratio", "Fraction of KV cache blocks in use")
        self.prefix_hit_rate = gauge(
            "ds_prefix_cache_hit_rate", "Prompt tokens served from cached blocks / prompt tokens"
        )
        self.prompt_tokens = counter("ds_prompt_tokens", "Prompt tokens admitted")
        self.prefix_hit_tokens = counter(
            "ds_prefix_cache_hit_tokens", "Prompt tokens served from cached or shared blocks"
        )
        self.generation_tokens = counter("ds_generation_tokens", "Tokens generated")
        self._finished = counter(
            "ds_request_finished", "Requests finished, by finish reason", ("finished_reason",)
        )

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(model_name)

        self.ttft = histogram(
            "ds_time_to_first_token_seconds",
            "Time from request arrival to its first token",
            _TTFT_BUCKETS,
        )
        self.tpot = histogram(
            "ds_time_per_output_token_seconds",
            "Time between consecutive output tokens of a request",
            _TPOT_BUCKETS,
        )
        self.e2e = histogram(
            "ds_e2e_request_latency_seconds",
            "Time from request arrival to its last token",
            _REQUEST_BUCKETS,
        )
        self.queue_time = histogram(
            "ds_request_queue_time_seconds",
            "Time from request arrival to its first scheduling",
            _REQUEST_BUCKETS,
        )
        self.prefill_time = histogram(
            "ds_request_prefill_time_seconds",
            "Time from a request's first scheduling to its first token",
            _REQUEST_BUCKETS,
        )
        self.decode_time = histogram(
            "ds_request_decode_time_seconds",
            "Time from a request's first token to its last",
            _REQUEST_BUCKETS,
        )
        self.preemptions = counter(
            "ds_num_preemptions", "Requests preempted (KV blocks freed, recomputed later)"
        )
        self.forwards = counter("ds_engine_forwards", "Engine forward passes")

    def finished(self, reason: str) -> None:
        self._finished.labels(self.model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
