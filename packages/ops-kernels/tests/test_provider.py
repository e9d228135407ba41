"""The cpu kernel provider (and the torch one beside it): registry entry point, protocol
conformance, delegation to kernels."""

from __future__ import annotations

import inspect

import pytest
import torch

from ds.interfaces import registry
from ds.interfaces.errors import KernelError
from ds.interfaces.kernels import AdagradHyper, AdamHyper, KernelProvider, LionHyper
from ds.ops.cuda_provider import CudaKernelProvider
from ds.ops.provider import CpuKernelProvider
from ds.ops.torch_provider import TorchKernelProvider

PROVIDERS = [CpuKernelProvider, TorchKernelProvider]


def test_entry_point_resolves_to_provider_class() -> None:
    assert registry.get("ds.kernels", "cpu") is CpuKernelProvider
    provider = CpuKernelProvider()
    assert isinstance(provider, KernelProvider)
    assert provider.name() == "cpu"
    assert list(provider.devices()) == ["cpu"]


def test_torch_provider_is_declared_and_conforms() -> None:
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    declared = project["project"]["entry-points"]["ds.kernels"]
    assert declared["torch"] == "ds.ops.torch_provider:TorchKernelProvider"
    provider = TorchKernelProvider()
    assert isinstance(provider, KernelProvider)
    assert provider.name() == "torch" and provider.info()["optimizer_backend"] == "reference"


@pytest.mark.parametrize("cls", [*PROVIDERS, CudaKernelProvider])
def test_signatures_match_protocol(cls: type) -> None:
    # The contract and the implementation must not drift apart.
    for name, member in inspect.getmembers(KernelProvider, inspect.isfunction):
        if name.startswith("_"):
            continue
        impl = getattr(cls, name)
        want = list(inspect.signature(member).parameters)
        got = list(inspect.signature(impl).parameters)
        assert got == want, f"{name}: {got} != {want}"


def test_info_reports_simd_and_threads() -> None:
    info = CpuKernelProvider().info()
    assert info["simd_level"] in {"avx512_bf16", "avx512", "avx2", "neon", "scalar"}
    assert info["simd_level"] in info["simd_built"].split(",")
    assert int(info["threads"]) == torch.get_num_threads()
    assert "-O3" in info["build_flags"]
    assert all(isinstance(v, str) for v in info.values())


@pytest.mark.parametrize("cls", PROVIDERS)
def test_adam_step_matches_torch_adamw_with_low_precision_copy(cls: type) -> None:
    torch.manual_seed(0)
    n = 4099
    hyper = AdamHyper(lr=1e-2, weight_decay=0.1)
    p = torch.randn(n)
    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.AdamW([ref], lr=hyper.lr, weight_decay=hyper.weight_decay)
    m, v = torch.zeros(n), torch.zeros(n)
    low = torch.empty(n, dtype=torch.bfloat16)
    provider = cls()
    for step in range(1, 11):
        g = torch.randn(n)
        provider.adam_step(step, hyper, p, g, m, v, low)
        ref.grad = g
        opt.step()
    torch.testing.assert_close(p, ref.detach(), rtol=1e-6, atol=1e-6)
    assert torch.equal(low, p.to(torch.bfloat16))


@pytest.mark.parametrize("cls", PROVIDERS)
def test_adagrad_and_lion_steps_run_through_provider(cls: type) -> None:
    provider = cls()
    p, g, s = torch.ones(10), torch.full((10,), 2.0), torch.zeros(10)
    provider.adagrad_step(1, AdagradHyper(lr=0.5, eps=0.0), p, g, s)
    # state_sum = 4, update = 0.5 * 2 / 2
    torch.testing.assert_close(p, torch.full((10,), 0.5))
    torch.testing.assert_close(s, torch.full((10,), 4.0))
    p, m = torch.ones(10), torch.zeros(10)
    provider.lion_step(1, LionHyper(lr=0.1), p, -g, m)
    torch.testing.assert_close(p, torch.full((10,), 1.1))


def test_provider_rejects_grad_requiring_params() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    with pytest.raises(KernelError, match="requires grad"):
        CpuKernelProvider().adam_step(
            1, AdamHyper(lr=1e-3), p, torch.zeros(4), torch.zeros(4), torch.zeros(4)
        )
