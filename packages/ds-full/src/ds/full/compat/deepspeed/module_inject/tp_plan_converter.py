"""``deepspeed.module_inject.tp_plan_converter``: a transformers ``tp_plan`` as AutoTP layer
specs (:mod:`ds.parallel.tp.hf_plan`)."""

from ds.parallel.tp.hf_plan import HF_STYLES, specs_from_hf_plan, wildcard_to_regex

SUPPORTED_STYLES = set(HF_STYLES)


class TPPlanConverter:
    convert = staticmethod(specs_from_hf_plan)
    _wildcard_to_regex = staticmethod(wildcard_to_regex)


__all__ = ["SUPPORTED_STYLES", "TPPlanConverter"]
