"""``deepspeed.runtime.config``'s getters and DeepSpeedConfig's attributes, the HJSON config files
DeepSpeed reads, ``deepspeed.utils.logging`` and initialize()'s argument checks."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

import ds.full.compat.deepspeed as deepspeed
from ds.full.compat.deepspeed.runtime import config as C
from ds.full.compat.deepspeed.utils import logging as ds_logging


def test_getters_and_attributes() -> None:
    assert C.get_gradient_clipping({}) == 1.0
    assert C.get_gradient_clipping({"gradient_clipping": 0}) == 0
    assert C.get_log_level({}) is None and C.get_log_level({"log_level": "INFO"}) == "INFO"
    cfg = C.DeepSpeedConfig(
        {"train_batch_size": 1, "gradient_allreduce_op": "SUM", "log_level": "info",
         "data_types": {"buffer_dtype": "bf16"}}
    )  # fmt: skip
    assert (cfg.gradient_allreduce_op, cfg.log_level) == ("sum", "info")
    assert (cfg.param_dtype, cfg.buffer_dtype) == (None, "bf16")
    assert C.DeepSpeedConfig({"train_batch_size": 1}).gradient_allreduce_op == "mean"
    with pytest.raises(ValueError, match="Invalid gradient_allreduce_op"):
        C.DeepSpeedConfig({"train_batch_size": 1, "gradient_allreduce_op": "max"})


def test_optimizer_names() -> None:
    assert (C.ADAM_OPTIMIZER, C.ADAMW_OPTIMIZER, C.LAMB_OPTIMIZER) == ("adam", "adamw", "lamb")
    # the types ds builds from the section; a config naming another type is refused
    assert {"adam", "adamw", "adagrad", "lion"} <= set(C.DEEPSPEED_OPTIMIZERS)
    assert C.LAMB_OPTIMIZER not in C.DEEPSPEED_OPTIMIZERS
    with pytest.raises(ValueError, match="lamb"):
        C.DeepSpeedConfig({"train_batch_size": 1, "optimizer": {"type": C.LAMB_OPTIMIZER}})


def test_hjson_config_file(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text("{\n  # comments and unquoted keys\n  train_batch_size: 2\n}\n")
    try:
        import hjson  # noqa: F401
    except ImportError:
        with pytest.raises(ValueError, match="pip install hjson"):
            C.DeepSpeedConfig(str(path))
    else:
        assert C.DeepSpeedConfig(str(path)).train_batch_size == 2


def test_log_level_names() -> None:
    assert ds_logging.get_log_level_from_string("Error") == logging.ERROR
    with pytest.raises(ValueError, match="valid logging levels"):
        ds_logging.get_log_level_from_string("loud")
    saved = ds_logging.logger.level
    try:
        ds_logging.set_log_level_from_string("critical")
        assert ds_logging.get_current_level() == logging.CRITICAL
        assert not ds_logging.should_log_le("info") and ds_logging.should_log_le("critical")
    finally:
        ds_logging.logger.setLevel(saved)
    assert deepspeed.utils.logger is ds_logging.logger


def test_initialize_needs_a_model() -> None:
    # DeepSpeed asserts; a module passed positionally lands in args=.
    with pytest.raises(AssertionError, match="needs model="):
        deepspeed.initialize(model=None, config={"train_batch_size": 1})
    with pytest.raises(AssertionError, match="came as args="):
        deepspeed.initialize(torch.nn.Linear(2, 2), config={"train_batch_size": 1})


def test_fp16_wrappers_import_and_refuse() -> None:
    from ds.full.compat.deepspeed._missing import FeatureNotAvailableError
    from ds.full.compat.deepspeed.runtime.fp16.fused_optimizer import FP16_Optimizer
    from ds.full.compat.deepspeed.runtime.fp16.unfused_optimizer import FP16_UnfusedOptimizer

    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert not isinstance(opt, (FP16_Optimizer, FP16_UnfusedOptimizer))
    with pytest.raises(FeatureNotAvailableError, match=r"fp16\.enabled"):
        FP16_Optimizer(opt)
