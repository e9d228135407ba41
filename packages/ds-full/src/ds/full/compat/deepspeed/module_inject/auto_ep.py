"""``deepspeed.module_inject.auto_ep``: the router scale AutoEP resolves
(:func:`ds.parallel.moe.token_choice.resolve_route_scale`). DeepSpeed's ``AutoEP`` model walker is
not provided: ds's AutoEP (``expert_parallel.autoep_size``) finds transformers' sparse MoE blocks
itself (:func:`ds.parallel.moe.autoep.autoep`)."""

from __future__ import annotations

from ds.full.compat.deepspeed._missing import missing_class
from ds.parallel.moe.token_choice import resolve_route_scale as _resolve_route_scale

AutoEP = missing_class(
    "deepspeed.module_inject.auto_ep.AutoEP",
    "DeepSpeed's AutoEP model walker",
    "enable expert_parallel.autoep_size: ds.parallel.moe.autoep replaces the model's experts",
)

__all__ = ["AutoEP", "_resolve_route_scale"]
