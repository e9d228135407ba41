"""Accumulation windows in one process: unmanaged accumulation (the caller's step() ends each
window), coalesced reduction and no_sync, and what each refuses. The multi-rank parity of both
features is in tests/zero/test_accumulation_parity.py."""

from __future__ import annotations

import warnings

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.zero.engine import ZeroEngine
from ds.zero.engine_accumulation import (
    AccumulationCallError,
    AccumulationConfigError,
    AccumulationUnsupportedError,
)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.Tanh(), torch.nn.Linear(12, 3))


def _cfg(stage: int, managed: bool = True, gas: int = 4, **zero: object) -> dict[str, object]:
    return {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": 0.0,
        "managed_gradient_accumulation": managed,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-2}},
        "zero_optimization": {"stage": stage, "reduce_bucket_size": 50, **zero},
    }


def _data(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(2, 6, generator=g), torch.randn(2, 3, generator=g)) for _ in range(n)]


def _loss(engine: ZeroEngine, xy: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.nn.functional.mse_loss(engine(xy[0]), xy[1])


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_unmanaged_step_ends_every_window_and_matches_pytorch(stage: int) -> None:
    """Windows of 2, 3 and 1 backward passes (losses divided by the count, scale_wrt_gas=False)
    give plain PyTorch's Adam steps on the windows' mean loss (rtol 1e-5, atol 1e-6)."""
    engine = ZeroEngine(_model(), _cfg(stage, managed=False))
    assert not engine.managed_gradient_accumulation()
    ref = _model()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    data, i = _data(6), 0
    for n in (2, 3, 1):
        window = data[i : i + n]
        i += n
        for xy in window:
            assert not engine.is_gradient_accumulation_boundary()  # only step() ends it
            engine.backward(_loss(engine, xy) / n, scale_wrt_gas=False)
        engine.step()
        assert engine.was_step_applied()
        opt.zero_grad()
        sum(torch.nn.functional.mse_loss(ref(x), y) for x, y in window).div(n).backward()
        opt.step()
    assert engine.global_steps == 3 and engine.global_samples == 2 * 6
    assert engine.last_metrics is not None and engine.last_metrics.samples == 2
    for a, b in zip(engine.module.state_dict().values(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_unmanaged_backward_still_divides_by_the_configured_accumulation_steps() -> None:
    """As in DeepSpeed: N backward passes then step() equal the managed engine with GAS=N."""
    managed, unmanaged = ZeroEngine(_model(), _cfg(1)), ZeroEngine(_model(), _cfg(1, False))
    for xy in _data(4):
        managed.backward(_loss(managed, xy))
        managed.step()
        unmanaged.backward(_loss(unmanaged, xy))
    unmanaged.step()
    assert managed.global_samples == unmanaged.global_samples == 8
    for a, b in zip(managed.module.parameters(), unmanaged.module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_unmanaged_refusals() -> None:
    engine = ZeroEngine(_model(), _cfg(2, managed=False))
    with pytest.raises(AssertionError, match="set_gradient_accumulation_boundary"):
        engine.set_gradient_accumulation_boundary(True)
    with (
        pytest.raises(AccumulationCallError, match="coalesce_grad_reduction"),
        engine.coalesce_grad_reduction(),
    ):
        pass
    for stage in (0, 1):
        with pytest.raises(AccumulationConfigError, match="overlap_comm only with ZeRO stage 2"):
            ZeroEngine(_model(), _cfg(stage, managed=False, overlap_comm=True))
    # An error naming the key, of both kinds user code catches.
    assert issubclass(AccumulationConfigError, ConfigError)
    ZeroEngine(_model(), _cfg(2, managed=False, overlap_comm=True))  # stage 2 overlaps backward

    class Piped(ZeroEngine):
        pipeline_parallelism = True

    with pytest.raises(AccumulationConfigError, match="not supported with pipeline parallelism"):
        Piped(_model(), _cfg(0, managed=False))


def test_unmanaged_key_is_acted_on_and_disabled_offload_blocks_load() -> None:
    cfg = _cfg(3, managed=False, gas=1)
    cfg["zero_optimization"] = {  # type: ignore[index]
        "stage": 3,
        "offload_param": {"device": "none"},
        "offload_optimizer": {"device": "none"},
    }
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "accepted but not acted on" warning for the key
        engine = ZeroEngine(_model(), cfg)
    assert not engine.managed_gradient_accumulation()
    assert ZeroEngine(_model(), _cfg(0)).managed_gradient_accumulation()


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_coalesced_backward_passes_equal_separate_ones(stage: int) -> None:
    """Four backward passes inside coalesce_grad_reduction() then step() give what the same
    passes give reduced one by one (one process: the reduction is the identity, so the
    accumulation and the step must agree exactly up to summation order)."""
    engines = [ZeroEngine(_model(), _cfg(stage, gas=1)) for _ in range(2)]
    data = _data(8)
    for step in range(2):
        window = data[4 * step : 4 * step + 4]
        with engines[0].coalesce_grad_reduction():
            for k, xy in enumerate(window):
                engines[0].set_gradient_accumulation_boundary(k == 3)
                engines[0].backward(_loss(engines[0], xy))
        engines[0].step()
        for k, xy in enumerate(window):
            engines[1].set_gradient_accumulation_boundary(k == 3)
            engines[1].backward(_loss(engines[1], xy))
        engines[1].step()
    assert engines[0].global_steps == engines[1].global_steps
    for a, b in zip(engines[0].module.parameters(), engines[1].module.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_coalesce_and_no_sync_refusals() -> None:
    engine = ZeroEngine(_model(), _cfg(1, gas=1))
    with engine.coalesce_grad_reduction():
        with pytest.raises(AssertionError, match="no_sync"):
            engine.step()
        with pytest.raises(AssertionError, match="no_sync"), engine.no_sync():
            pass
        with pytest.raises(AssertionError, match="nested"), engine.coalesce_grad_reduction():
            pass
    with engine.no_sync():
        with pytest.raises(AssertionError, match="nested"), engine.coalesce_grad_reduction():
            pass
        with pytest.raises(AssertionError, match="no_sync"):
            engine.step()
    engine.pipeline_parallelism = True
    with (
        pytest.raises(AccumulationUnsupportedError, match="pipeline parallelism"),
        engine.coalesce_grad_reduction(),
    ):
        pass
    for stage in (2, 3):
        with (
            pytest.raises(AccumulationCallError, match="ZeRO stage"),
            ZeroEngine(_model(), _cfg(stage)).no_sync(),
        ):
            pass


def test_an_exception_inside_the_block_leaves_the_engine_usable() -> None:
    engine = ZeroEngine(_model(), _cfg(2, gas=1))
    with pytest.raises(RuntimeError, match="boom"), engine.coalesce_grad_reduction():
        engine.backward(_loss(engine, _data(1)[0]))
        raise RuntimeError("boom")
    engine.zero_grad()
    with engine.coalesce_grad_reduction():
        engine.backward(_loss(engine, _data(1)[0]))
    engine.step()
    assert engine.was_step_applied()
