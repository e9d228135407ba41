"""Defaults that change training numerically follow DeepSpeed 0.19.8, so a migrated config that
leaves a key out trains as it did there."""

from __future__ import annotations

from ds.zero.config import load_config, resolve


def test_absent_gradient_clipping_clips_at_1_as_deepspeed_does() -> None:
    # deepspeed/runtime/constants.py: GRADIENT_CLIPPING_DEFAULT = 1.0 (read by get_gradient_clipping)
    cfg = resolve(load_config({"train_batch_size": 8}), world_size=1)
    assert cfg.gradient_clipping == 1.0


def test_zero_gradient_clipping_still_disables_clipping() -> None:
    cfg = resolve(load_config({"train_batch_size": 8, "gradient_clipping": 0}), world_size=1)
    assert cfg.gradient_clipping == 0.0
