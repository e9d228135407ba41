"""``deepspeed.module_inject.autotp_config``: layer specs for AutoTP (:mod:`ds.parallel.tp.specs`)."""

from ds.parallel.tp.specs import (
    AutoTPConfig,
    PartitionType,
    TPLayerSpec,
    merge_autotp_configs,
    preset,
)


class AutoTPPresets:
    """Built-in specs by model type (``llama``, ``qwen2``, ``mixtral``, ``phi3``, ``bloom``,
    ``chatglm``, ``deepseek_v2``)."""

    get_preset = staticmethod(preset)


__all__ = ["AutoTPConfig", "AutoTPPresets", "PartitionType", "TPLayerSpec", "merge_autotp_configs"]
