"""``deepspeed.moe.ep_router``: the token-choice top-k router
(:mod:`ds.parallel.moe.token_choice`)."""

from __future__ import annotations

from ds.parallel.moe.token_choice import TokenChoiceTopKRouter

__all__ = ["TokenChoiceTopKRouter"]
