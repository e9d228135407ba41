"""Weight-only int8/int4 quantization through the ds.kernels provider."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from inference_models import prompts

from ds.inference import build_engine
from ds.interfaces import registry
from ds.interfaces.errors import ConfigError

pytestmark = pytest.mark.skipif(
    not registry.has_provider(registry.KERNELS, "cpu"),
    reason="needs ds-ops-kernels (ds.kernels cpu)",
)


@pytest.mark.parametrize("scheme", ["int8_sym", "int4_sym"])
def test_quantized_engine_equals_dequantized_weights(
    scheme: str, tiny_dirs: dict[str, Path], hf_models: dict[str, Any]
) -> None:
    provider = registry.get(registry.KERNELS, "cpu")()
    qcfg = {"scheme": scheme, "group_size": 32}
    engine = build_engine(
        tiny_dirs["llama"], {"quantization": qcfg, "kv_cache": {"num_blocks": 64}}
    )
    # Reference: the same model with every layer linear replaced by its quantize->dequantize.
    ref = hf_models["llama"]
    state = {}
    for name, w in ref.state_dict().items():
        if name.startswith("model.layers.") and name.endswith("proj.weight"):
            w = provider.dequantize(provider.quantize(w.contiguous(), scheme, 32), torch.float32)
        state[name] = w
    plain = build_engine(tiny_dirs["llama"], {"kv_cache": {"num_blocks": 64}})
    for layer, src in zip(plain.model.layers, range(len(plain.model.layers))):
        for attr, hf in (
            ("q", "self_attn.q_proj"),
            ("k", "self_attn.k_proj"),
            ("v", "self_attn.v_proj"),
            ("o", "self_attn.o_proj"),
            ("gate", "mlp.gate_proj"),
            ("up", "mlp.up_proj"),
            ("down", "mlp.down_proj"),
        ):
            getattr(layer, attr).weight = state[f"model.layers.{src}.{hf}.weight"]
    p = prompts()[3]
    got = engine.put([0], [p])
    want = plain.put([0], [p])
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    # Quantized layers really hold fewer bytes than fp32 weights.
    lin = engine.model.layers[0].gate
    assert lin.nbytes < lin.weight.shape[0] * lin.weight.shape[1] * 4 / (
        3 if scheme == "int8_sym" else 6
    )


def test_missing_provider_is_a_clear_error(tiny_dirs: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"kernel provider named 'nope'.*ds-ops-kernels"):
        build_engine(tiny_dirs["llama"], {"quantization": {"provider": "nope"}})


@pytest.mark.parametrize("scheme", ["int8_sym", "int4_sym"])
def test_int8_activations_stay_close_to_float_activations(
    scheme: str, tiny_dirs: dict[str, Path]
) -> None:
    """activations: "int8" quantizes each quantized linear's input per group of 32 (opt-in, it
    changes the numerics): on the tiny random model the prompt's logits stay within 2% of their
    range of the float-activation engine's and the greedy tokens are the same."""
    from ds.inference import SamplingParams, generate

    kv = {"kv_cache": {"num_blocks": 64}}
    qcfg = {"scheme": scheme, "group_size": 32}
    fp = build_engine(tiny_dirs["llama"], {**kv, "quantization": qcfg})
    a8 = build_engine(tiny_dirs["llama"], {**kv, "quantization": {**qcfg, "activations": "int8"}})
    assert a8.model.layers[0].gate.activations == "int8"
    p = prompts()[3]
    want, got = fp.put([0], [p]), a8.put([0], [p])
    assert (got - want).abs().max() <= 0.02 * (want.max() - want.min())
    ps = [prompts(n=2, lo=5, hi=40)[i] for i in range(2)]
    params = SamplingParams(max_new_tokens=8)
    assert [r.tokens for r in generate(a8, ps, params)] == [
        r.tokens for r in generate(fp, ps, params)
    ]


def test_quantized_lm_head_is_opt_in_and_matches_its_dequantized_weight(
    tiny_dirs: dict[str, Path],
) -> None:
    """quantization.lm_head: the output head through the quantized linear (a quantized copy of
    the tied embedding, with the same scheme and activations); the lookup keeps the float table.
    Its logits are those of the dense head on the dequantized copy, up to the activations'
    rounding."""
    from ds.inference.models.blocks import DenseLinear
    from ds.inference.quantize import QuantizedLinear
    from ds.ops.quant import dequantize

    kv = {"kv_cache": {"num_blocks": 64}}
    qcfg = {"scheme": "int8_sym", "group_size": 32, "activations": "int8"}
    off = build_engine(tiny_dirs["llama"], {**kv, "quantization": qcfg})
    assert isinstance(off.model.lm_head, DenseLinear)
    on = build_engine(tiny_dirs["llama"], {**kv, "quantization": {**qcfg, "lm_head": True}})
    head = on.model.lm_head
    assert isinstance(head, QuantizedLinear) and head.activations == "int8"
    assert on.model.embed_w.dtype == torch.float32
    x = torch.randn(3, head.weight.shape[1], generator=torch.Generator().manual_seed(0))
    want = x @ dequantize(head.weight, torch.float32).T
    assert (head(x) - want).abs().max() <= 0.02 * want.abs().max()
    p = prompts()[3]
    a, b = off.put([0], [p]), on.put([0], [p])
    assert (a - b).abs().max() <= 0.05 * (a.max() - a.min())
