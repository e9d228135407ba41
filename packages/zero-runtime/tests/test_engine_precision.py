"""The engine's mixed-precision cast (parameters to the mode's dtype, buffers kept unless
``data_types.buffer_dtype`` says otherwise), the ``param_dtype`` check and ``log_level``."""

from __future__ import annotations

import logging

import pytest
import torch

from ds.zero.engine import ZeroEngine
from ds.zero.engine_precision import PrecisionConfigError


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    model.register_buffer("inv_freq", torch.ones(4))  # an fp32 buffer, as a rotary embedding's
    return model


def _engine(**cfg: object) -> ZeroEngine:
    base = {"train_micro_batch_size_per_gpu": 1, "optimizer": {"type": "SGD", "params": {}}}
    return ZeroEngine(_model(), {**base, **cfg})


def test_bf16_casts_parameters_and_keeps_buffers() -> None:
    engine = _engine(bf16={"enabled": True})
    assert {p.dtype for p in engine.module.parameters()} == {torch.bfloat16}
    assert engine.module.inv_freq.dtype == torch.float32
    assert engine._config.buffer_dtype is None and engine._config.param_dtype is None
    engine = _engine(bf16={"enabled": True}, data_types={"buffer_dtype": "bf16"})
    assert engine.module.inv_freq.dtype == torch.bfloat16


def test_param_dtype_must_match_the_precision_mode() -> None:
    assert _engine(fp16={"enabled": True}, data_types={"param_dtype": "fp16"}).fp16_enabled()
    with pytest.raises(PrecisionConfigError, match="conflicts with the precision mode"):
        _engine(bf16={"enabled": True}, data_types={"param_dtype": "fp32"})
    assert issubclass(PrecisionConfigError, AssertionError)  # DeepSpeed asserts here


def test_log_level_sets_the_library_loggers() -> None:
    root = logging.getLogger("ds")
    saved = root.level
    try:
        engine = _engine(log_level="ERROR", gradient_clipping=0.0)
        assert engine.log_level() == "ERROR" and root.level == logging.ERROR
        assert engine.gradient_clipping() == 0.0
    finally:
        root.setLevel(saved)
    assert _engine().log_level() is None and _engine().gradient_clipping() == 1.0
