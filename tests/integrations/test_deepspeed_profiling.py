"""``deepspeed.profiling.flops_profiler`` is ds's flops profiler (it used to raise "not
available"): DeepSpeed's calls count a model's MACs and parameters."""

from __future__ import annotations

import torch


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))


def test_get_model_profile_counts_a_forward_pass() -> None:
    from ds.full.compat.deepspeed.profiling.flops_profiler import get_model_profile

    flops, macs, params = get_model_profile(
        _model(), input_shape=(8, 16), print_profile=False, as_string=False
    )
    want_macs = 8 * (16 * 32 + 32 * 4)
    assert macs == want_macs and params == 16 * 32 + 32 + 32 * 4 + 4
    assert flops >= 2 * want_macs  # the matmuls, plus the bias adds and ReLU


def test_flops_profiler_takes_deepspeeds_constructor() -> None:
    from ds.full.compat.deepspeed.profiling.flops_profiler import FlopsProfiler

    model = _model()
    prof = FlopsProfiler(model, None)  # (model, ds_engine), DeepSpeed's positional order
    prof.start_profile()
    model(torch.ones(2, 16))
    prof.stop_profile()
    assert prof.get_total_macs() == 2 * (16 * 32 + 32 * 4)
    assert prof.get_total_params() == sum(p.numel() for p in model.parameters())
    assert prof.get_total_macs(as_string=True).endswith("MACs")
    prof.end_profile()
