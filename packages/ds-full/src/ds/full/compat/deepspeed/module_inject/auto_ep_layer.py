"""``deepspeed.module_inject.auto_ep_layer``: combining routed expert outputs back into tokens
(:mod:`ds.parallel.moe.routes`). ds's AutoEP replacement layer is
``ds.parallel.moe.autoep.ExpertParallelExperts`` (``expert_parallel.autoep_size``)."""

from ds.parallel.moe.routes import combine_from_routed

__all__ = ["combine_from_routed"]
