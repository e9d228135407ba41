"""The inference engine on a simulated GPU: placement, host syncs and device bytes.

The weights come from a real (host) transformers model, as they do when a server loads a
checkpoint; the engine's weights, KV cache and activations must all live on the engine's device,
its forward must never read a device value on the host, and a quantized engine must quantize
where the weights live (no device-to-host copy of the weights at load).
"""

from __future__ import annotations

from typing import Any

import pytest
import tiny_models
import torch

from ds.inference.engine import build_engine
from ds.inference.generation import generate
from ds.interfaces.inference import SamplingParams
from ds.sim.accelerator import SimDevice
from ds.sim.world import sim_kernels

pytestmark = pytest.mark.simgpu

TINY = {**tiny_models.TINY, "max_position_embeddings": 256}
BLOCKS, BLOCK = 16, 16


@pytest.fixture(scope="module")
def model() -> Any:
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY)).eval()


def _config(**extra: Any) -> dict[str, Any]:
    return {
        "device": "cuda:3",
        "dtype": "bfloat16",
        "kv_cache": {"num_blocks": BLOCKS, "block_size": BLOCK},
        **extra,
    }


def _cache_bytes() -> int:
    head_dim = TINY["hidden_size"] // TINY["num_attention_heads"]
    per_layer = 2 * BLOCKS * BLOCK * TINY["num_key_value_heads"] * head_dim * 2  # K and V, bf16
    return TINY["num_hidden_layers"] * per_layer


def test_engine_lives_on_its_device_and_never_syncs_in_forward(model: Any) -> None:
    weights = sum(p.numel() for p in model.parameters()) * 2  # bf16
    with sim_kernels(), SimDevice(3) as dev:
        engine = build_engine(model, _config())
        built = dev.device_bytes().current
        d2h_at_load = dev.obs.d2h_bytes
        prefill = engine.put([1, 2], [[1, 2, 3, 4, 5], list(range(7, 40))])
        decode = engine.put([1, 2], [[6], [41]])  # both sequences decode
        mixed = engine.put([1, 3], [[7], [9, 10, 11]])  # a decode beside a prefill
        syncs = list(dev.host_syncs)
    assert {str(t.device) for t in (prefill, decode, mixed)} == {"cuda:3"}
    assert prefill.shape == (2, TINY["vocab_size"])
    # Weights (the untied LM head included), the KV cache and the rotary frequencies (head_dim/2
    # fp32), nothing else, after the build.
    rope = TINY["hidden_size"] // TINY["num_attention_heads"] // 2 * 4
    assert built == weights + _cache_bytes() + rope
    assert d2h_at_load == 0
    # The ragged batch carries its lengths on the host: no forward reads the device.
    assert syncs == [], [s.where for s in syncs]


def test_quantized_weights_are_made_and_used_on_the_device(model: Any) -> None:
    with sim_kernels(), SimDevice(3) as dev:
        engine = build_engine(model, _config(quantization={"scheme": "int8_sym"}))
        assert dev.obs.d2h_bytes == 0  # quantized where the weights live
        layer = engine.model.layers[0]
        devices = {str(t.device) for t in vars(layer).values() if isinstance(t, torch.Tensor)}
        engine.put([1], [[1, 2, 3]])
        syncs = list(dev.host_syncs)
    assert devices <= {"cuda:3"}
    assert syncs == [], [s.where for s in syncs]


def test_greedy_generation_reads_the_device_once_per_step(model: Any) -> None:
    new = 4
    with sim_kernels(), SimDevice(3) as dev:
        engine = build_engine(model, _config())
        out = generate(engine, [[1, 2, 3], [4, 5, 6, 7]], SamplingParams(max_new_tokens=new))
        syncs = list(dev.host_syncs)
    assert [len(r.tokens) for r in out] == [new, new]
    # Both prompts prefill in one forward and decode together, and each step reads its tokens
    # with one batched argmax (``tolist`` of 2 values: the simulation records each value read);
    # a per-request read from the sampler would show here as sampling.py.
    assert len(syncs) == 2 * new, [s.where for s in syncs]
    assert all("_greedy_tokens" in s.where for s in syncs), [s.where for s in syncs]
