"""FLOP counts against hand-computed values and against torch's FlopCounterMode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from tiny_models import llama_shape
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from ds.interfaces.errors import ConfigError
from ds.monitor.flops import FlopsProfiler, format_profile, get_model_profile


def _torch_flops(fn) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("batch,fin,fout", [(3, 5, 7), (1, 17, 1), (8, 64, 33)])
def test_linear_matches_hand_count_and_torch(batch: int, fin: int, fout: int) -> None:
    lin = torch.nn.Linear(fin, fout)
    x = torch.randn(batch, fin)
    flops, macs, params = get_model_profile(lin, args=(x,), print_profile=False, as_string=False)
    assert macs == batch * fin * fout
    assert flops == 2 * batch * fin * fout
    assert params == fin * fout + fout
    assert flops == _torch_flops(lambda: lin(x))


class _Attn(torch.nn.Module):
    def forward(self, q, k, v):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(q, k, v, is_causal=False)


@pytest.mark.parametrize("b,h,sq,sk,d", [(2, 4, 8, 8, 16), (1, 3, 5, 11, 7)])
def test_sdpa_fused_kernel_counted_as_its_two_products(b, h, sq, sk, d) -> None:
    q, k, v = torch.randn(b, h, sq, d), torch.randn(b, h, sk, d), torch.randn(b, h, sk, d)
    attn = _Attn()
    flops, _, _ = get_model_profile(attn, args=(q, k, v), print_profile=False, as_string=False)
    assert flops == 4 * b * h * sq * sk * d
    # torch counts the math path (its bmm products); the fused CPU kernel it does not count.
    with sdpa_kernel(SDPBackend.MATH):
        assert _torch_flops(lambda: attn(q, k, v)) == flops


def _tiny_llama():  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(
        **llama_shape(48, 80, layers=1, heads=4, kv_heads=2, vocab=64), attn_implementation="sdpa"
    )
    return cfg, LlamaDecoderLayer(cfg, layer_idx=0).eval(), LlamaRotaryEmbedding(cfg)


def test_llama_block_matches_hand_count_and_torch() -> None:
    cfg, block, rope = _tiny_llama()
    b, s = 2, 9
    h, i = cfg.hidden_size, cfg.intermediate_size
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    d = h // heads
    x = torch.randn(b, s, h)
    pos = torch.arange(s).unsqueeze(0).expand(b, s)
    emb = rope(x, pos)

    def run():  # type: ignore[no-untyped-def]
        return block(x, position_embeddings=emb, attention_mask=None)

    prof = FlopsProfiler(block)
    prof.start_profile()
    with torch.no_grad():
        run()
    prof.stop_profile()
    tokens = b * s
    proj = tokens * (h * h + 2 * h * kv * d + h * h)  # q, k, v, o
    mlp = tokens * 3 * h * i  # gate, up, down
    attn = 2 * b * heads * s * s * d  # Q·Kᵀ and P·V
    assert prof.root.macs == proj + mlp + attn
    assert prof.stats["self_attn"].macs == proj + attn
    assert prof.stats["mlp"].macs == mlp
    assert prof.stats["mlp.down_proj"].macs == tokens * i * h
    with sdpa_kernel(SDPBackend.MATH), torch.no_grad():
        assert _torch_flops(run) == prof.root.flops
    text = format_profile(prof, top_modules=2)
    assert "mlp (LlamaMLP)" in text and "depth 1:" in text


def test_only_forward_counted_and_backward_by_rule() -> None:
    lin = torch.nn.Linear(6, 4)
    x = torch.randn(5, 6)
    prof = FlopsProfiler(lin, recompute_fwd_factor=1.0)
    prof.start_profile()
    lin(x).sum().backward()
    prof.stop_profile()
    assert prof.root.flops == 2 * 5 * 6 * 4
    assert prof.training_flops() == 4 * prof.root.flops
    assert prof.forward_passes == 1
    # DeepSpeed's attributes: the totals of the window just profiled, kept past end_profile
    assert (prof.flops, prof.macs, prof.params) == (2 * 5 * 6 * 4, 5 * 6 * 4, 6 * 4 + 4)
    prof.end_profile()
    assert prof.flops == 2 * 5 * 6 * 4


def test_input_shape_and_string_results(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.ReLU(), torch.nn.Linear(20, 3))
    out = tmp_path / "profile.txt"
    flops, macs, params = get_model_profile(model, input_shape=(4, 10), output_file=str(out))
    assert macs == "1.04 KMACs" and flops == "2.08 KFLOPs" and params == "283"
    text = out.read_text()
    assert "0 (Linear)" in text and "fwd MFU" in text


def test_bad_input_is_one_error() -> None:
    lin = torch.nn.Linear(2, 2)
    with pytest.raises(ConfigError, match="input_shape"):
        get_model_profile(lin, print_profile=False)
    with pytest.raises(ConfigError, match="not both"):
        get_model_profile(lin, input_shape=(1, 2), args=(torch.ones(1, 2),), print_profile=False)
