"""Which paged attention an engine runs: ``attention`` in the config and ``ds serve --attention``;
``auto`` (the default) is the Triton kernel on CUDA and PyTorch elsewhere. The Triton engine
generates what the PyTorch engine does (the kernel through ``TRITON_INTERPRET=1`` on CPU)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    # Must be set before the kernel is defined (it is built on first use).
    os.environ.setdefault("TRITON_INTERPRET", "1")

from ds.inference.attention import cuda_runtime, paged_attention, select_attention
from ds.inference.cli import _config, _parser
from ds.inference.config import EngineConfig
from ds.interfaces.errors import ConfigError


@pytest.mark.parametrize(
    ("requested", "device", "alibi", "block", "want"),
    [
        ("auto", "cpu", False, 16, "torch"),
        ("auto", "cuda", False, 16, "triton"),
        ("auto", "cuda:3", False, 32, "triton"),
        ("auto", torch.device("cuda", 1), False, 16, "triton"),
        ("auto", "mps", False, 16, "torch"),
        ("auto", "cuda", True, 16, "torch"),  # the kernel has no ALiBi bias
        ("auto", "cuda", False, 24, "torch"),  # nor blocks of other than a power of two
        ("torch", "cuda", False, 16, "torch"),
        ("triton", "cpu", False, 16, "triton"),
        ("triton", "cuda", True, 16, "triton"),  # explicit: the kernel itself refuses ALiBi
    ],
)
def test_selection(
    requested: str, device: str | torch.device, alibi: bool, block: int, want: str
) -> None:
    assert select_attention(requested, device, alibi=alibi, block_size=block) == want  # type: ignore[arg-type]


def test_simulated_cuda_devices_keep_torch() -> None:
    """Fake CUDA tensors (the simulation) hold no memory a kernel could read: auto is torch."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    got = select_attention("auto", "cuda:3", alibi=False, block_size=16, cuda_runtime=False)
    assert got == "torch"
    with FakeTensorMode():
        assert cuda_runtime() is False
    assert cuda_runtime() is torch.cuda.is_available()


def test_config_default_is_auto_and_the_key_is_checked() -> None:
    assert EngineConfig().attention == "auto"
    assert EngineConfig.parse({"attention": "triton"}).attention == "triton"
    with pytest.raises(ConfigError, match="attention"):
        EngineConfig.parse({"attention": "flash"})


def test_serve_flag_sets_the_config_key(capsys: pytest.CaptureFixture[str]) -> None:
    assert _config(_parser().parse_args(["m", "--attention", "triton"]))["attention"] == "triton"
    assert _config(_parser().parse_args(["m", "--attention", "torch"]))["attention"] == "torch"
    assert "attention" not in _config(_parser().parse_args(["m"]))  # the config decides
    inline = '{"attention": "torch"}'
    args = _parser().parse_args(["m", "--config", inline, "--attention", "triton"])
    assert _config(args)["attention"] == "triton"  # the flag wins over the file
    with pytest.raises(SystemExit):
        _parser().parse_args(["m", "--attention", "flash"])
    assert "invalid choice" in capsys.readouterr().err


def test_cpu_selection_with_the_native_decode_kernel() -> None:
    def pick(requested: str, alibi: bool = False) -> str:
        return select_attention(requested, "cpu", alibi=alibi, block_size=16, native_decode=True)  # type: ignore[arg-type]

    assert pick("auto") == "native"
    assert pick("auto", alibi=True) == "torch"
    assert pick("torch") == "torch"
    assert select_attention("auto", "cuda", alibi=False, block_size=16, native_decode=True) == (
        "triton"
    )


def test_engine_on_cpu_resolves_auto_to_native_for_fp32(tiny_dirs: dict[str, Path]) -> None:
    from ds.inference import build_engine

    engine = build_engine(tiny_dirs["llama"])
    assert engine.attention == "native"
    assert engine.model.attention.keywords["decode_kernel"] is not None  # type: ignore[attr-defined]
    bf16 = build_engine(tiny_dirs["llama"], {"dtype": "bfloat16"})
    assert bf16.attention == "torch" and bf16.model.attention is paged_attention
    with pytest.raises(ConfigError, match="fp32"):
        build_engine(tiny_dirs["llama"], {"dtype": "bfloat16", "attention": "native"})
    half_cache = build_engine(tiny_dirs["llama"], {"kv_cache": {"dtype": "float16"}})
    assert half_cache.attention == "torch"


def test_native_engine_matches_torch(tiny_dirs: dict[str, Path]) -> None:
    """Logits of a prompt chunk and of decodes (the kernel) against PyTorch's; greedy tokens
    equal."""
    engines = _engines_from_flag(tiny_dirs["llama"], ("torch", "native"))
    assert engines["native"].attention == "native"
    prompts = [list(range(5, 24)), list(range(40, 43)), list(range(60, 90))]
    logits = {name: _greedy_logits(e, prompts, 4) for name, e in engines.items()}
    torch.testing.assert_close(logits["native"], logits["torch"], atol=1e-5, rtol=1e-5)
    assert torch.equal(logits["native"].argmax(-1), logits["torch"].argmax(-1))


def test_triton_engine_from_the_serve_flag_matches_torch(tiny_dirs: dict[str, Path]) -> None:
    """Logits of a prompt chunk and of decodes through the kernel equal PyTorch's."""
    pytest.importorskip("triton")
    from ds.inference.triton_attention import paged_attention_triton

    engines = _engines_from_flag(tiny_dirs["llama"], ("torch", "triton"))
    assert engines["triton"].attention == "triton"
    assert engines["triton"].model.attention is paged_attention_triton
    prompts = [list(range(5, 24)), list(range(40, 43))]
    logits = {name: _greedy_logits(e, prompts, 2) for name, e in engines.items()}
    torch.testing.assert_close(logits["triton"], logits["torch"], atol=1e-4, rtol=1e-4)


def _engines_from_flag(model: Path, names: tuple[str, ...]) -> dict[str, Any]:
    from ds.inference import build_engine

    base = ["m", "--block-size", "8", "--num-blocks", "32"]
    return {
        name: build_engine(model, _config(_parser().parse_args([*base, "--attention", name])))
        for name in names
    }


def _greedy_logits(engine: Any, prompts: list[list[int]], decodes: int) -> torch.Tensor:
    """The prompts' last-token logits, then those of ``decodes`` greedy steps, which continue
    from the cache the first forward wrote: [decodes + 1, sequences, vocab]."""
    uids = list(range(len(prompts)))
    steps = [engine.put(uids, prompts)]
    for _ in range(decodes):
        steps.append(engine.put(uids, [[t] for t in steps[-1].argmax(-1).tolist()]))
    return torch.stack(steps)
