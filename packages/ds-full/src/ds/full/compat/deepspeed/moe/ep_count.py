"""``deepspeed.moe.ep_count``: tokens routed to each expert (:mod:`ds.parallel.moe.token_choice`)."""

from __future__ import annotations

from ds.parallel.moe.token_choice import count_tokens_per_expert

__all__ = ["count_tokens_per_expert"]
