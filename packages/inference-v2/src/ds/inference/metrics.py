"""Prometheus metrics of ``ds serve`` (prometheus_client, one registry per app).

Names follow vLLM's where one exists, under the ``ds_`` prefix: running / waiting requests, KV
blocks used and free, prefix-cache hits, time to first token and time per output token.
"""

from __future__ import annotations

from typing import Any

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)


class ServerMetrics:
    def __init__(self, model_name: str) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

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
        self.ttft = Histogram(
            "ds_time_to_first_token_seconds",
            "Time from request arrival to its first token",
            labels,
            buckets=_TTFT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.tpot = Histogram(
            "ds_time_per_output_token_seconds",
            "Time between consecutive output tokens of a request",
            labels,
            buckets=_TPOT_BUCKETS,
            registry=r,
        ).labels(model_name)
        self.forwards = counter("ds_engine_forwards", "Engine forward passes")

    def finished(self, reason: str) -> None:
        self._finished.labels(self.model_name, reason).inc()

    def render(self) -> tuple[bytes, str]:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return generate_latest(self.registry), CONTENT_TYPE_LATEST
