"""fp16 and fp32 models on the CPU: decode-sized inputs through the cpu provider's few-rows
linear kernel (ds.inference.half_linear) give the greedy outputs of the torch path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from inference_models import prompts

from ds.inference import SamplingParams, build_engine, generate
from ds.inference.half_linear import HalfLinear, half_linear_factory
from ds.interfaces import registry

pytestmark = pytest.mark.skipif(
    not registry.has_provider(registry.KERNELS, "cpu"),
    reason="needs ds-ops-kernels (ds.kernels cpu)",
)


def _config(dtype: str) -> dict[str, object]:
    return {"dtype": dtype, "kv_cache": {"num_blocks": 128}}


def _torch_path(monkeypatch: pytest.MonkeyPatch) -> None:
    import ds.inference.half_linear as hl

    monkeypatch.setattr(hl, "half_linear_factory", lambda dtype, device: None)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2's q/k/v have biases
def test_greedy_equals_torch_path(
    family: str, dtype: str, tiny_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ds.ops.half_linear as kernel

    rows: list[int] = []
    real = kernel.linear

    def counted(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        rows.append(x.shape[0])
        return real(x, w, b)

    monkeypatch.setattr(kernel, "linear", counted)
    ps = prompts()[:5]
    params = SamplingParams(max_new_tokens=8)
    fast = build_engine(tiny_dirs[family], _config(dtype))
    layer = fast.model.layers[0]
    assert all(isinstance(f, HalfLinear) for f in (layer.q, layer.k, layer.v, layer.o))
    assert isinstance(fast.model.lm_head, HalfLinear)
    # All prompts together (decode steps of 5 rows) and one alone (1 row); a prefill of more
    # rows than the kernel's bound takes the dense path.
    got = [r.tokens for r in generate(fast, ps, params)]
    got_one = generate(fast, ps[:1], params)[0].tokens
    assert {1, 5} <= set(rows)  # the kernel ran the decode steps
    _torch_path(monkeypatch)
    slow = build_engine(tiny_dirs[family], _config(dtype))
    assert not isinstance(slow.model.lm_head, HalfLinear)
    want = [r.tokens for r in generate(slow, ps, params)]
    assert got == want
    assert got_one == want[0]


def test_factory_only_for_fp16_and_fp32_on_cpu() -> None:
    assert half_linear_factory(torch.bfloat16, "cpu") is None
    assert half_linear_factory(torch.float16, "meta") is None
    assert half_linear_factory(torch.float32, "meta") is None
    for dtype, tol in ((torch.float16, 2e-3), (torch.float32, 1e-5)):
        make = half_linear_factory(dtype, "cpu")
        w = torch.randn(7, 5).to(dtype)
        lin = make(w, None)
        x = torch.randn(3, 5).to(dtype)
        torch.testing.assert_close(lin(x), torch.nn.functional.linear(x, w), atol=tol, rtol=tol)
        # A replaced weight reaches both paths: the kernel's (3 rows) and torch's (64 rows).
        lin.weight = w2 = torch.randn(7, 5).to(dtype)
        for rows in (3, 64):
            x = torch.randn(rows, 5).to(dtype)
            want = torch.nn.functional.linear(x, w2)
            torch.testing.assert_close(lin(x), want, atol=tol, rtol=tol)


def test_torch_path_without_the_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    import ds.inference.half_linear as hl
    from ds.interfaces.errors import ProviderNotFoundError

    def missing(group: str, name: str) -> None:
        raise ProviderNotFoundError(f"no {name} in {group}")

    for dtype in (torch.float16, torch.float32):
        monkeypatch.setattr(hl.registry, "get", missing)  # ds-ops-kernels not installed
        assert half_linear_factory(dtype, "cpu") is None
        monkeypatch.setattr(hl.registry, "get", lambda group, name: object)  # no such kernel
        assert half_linear_factory(dtype, "cpu") is None
