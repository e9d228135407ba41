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


def test_fp16_steps_assigned_grads_and_the_optimizer_carries_the_scaler() -> None:
    engine = _engine(
        optimizer={"type": "SGD", "params": {"lr": 1.0}},
        fp16={"enabled": True, "initial_scale_power": 4, "loss_scale_window": 2},
        gradient_clipping=0.0,
    )
    scaler = engine.optimizer.loss_scale_config  # DeepSpeed's name for the scaling state
    assert scaler is engine.loss_scaler and scaler.dynamic_loss_scale and scaler.cur_scale == 16
    assert engine.optimizer.loss_scaler is scaler and engine.optimizer.dynamic_loss_scale
    for p in engine.module.parameters():
        p.grad = torch.full_like(p, float("inf"))  # set by hand, no backward
    engine.step()
    assert (scaler.cur_scale, scaler.cur_iter, engine.skipped_steps) == (8, 1, 1)
    before = engine.module[0].weight.detach().clone()
    for p in engine.module.parameters():
        p.grad = torch.full_like(p, 4.0)
    engine.step()
    after = engine.module[0].weight.detach()
    # unscaled, then SGD (fp16 weights: within their rounding)
    torch.testing.assert_close(after.float(), before.float() - 4.0 / 8, atol=1e-3, rtol=0)


def test_static_fp16_scale_on_the_optimizer() -> None:
    engine = _engine(fp16={"enabled": True, "loss_scale": 138.0})
    assert engine.optimizer.dynamic_loss_scale is False
    assert engine.optimizer.loss_scaler.loss_scale == 138.0
