"""`ds serve` argument handling (the server itself is exercised in tests/inference)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from ds.inference.cli import _config, _parser, main
from ds.interfaces import registry


def test_serve_verb_is_registered() -> None:
    assert registry.list_providers(registry.CLI)["serve"].value == "ds.inference.cli:main"


def test_flags_override_config_file(tmp_path: Path) -> None:
    cfg = tmp_path / "engine.json"
    cfg.write_text('{"kv_cache": {"block_size": 64, "num_blocks": 9}, "dtype": "float32"}')
    args: argparse.Namespace = _parser().parse_args(
        ["m", "--config", str(cfg), "--num-blocks", "100", "--prefix-caching"]
    )
    assert _config(args) == {
        "kv_cache": {"block_size": 64, "num_blocks": 100},
        "dtype": "float32",
        "prefix_caching": True,
    }
    inline = _parser().parse_args(["m", "--config", '{"scheduler": {"token_budget": 64}}'])
    assert _config(inline) == {"scheduler": {"token_budget": 64}}
    off = _parser().parse_args(["m", "--config", str(cfg), "--no-enable-prefix-caching"])
    assert _config(off)["prefix_caching"] is False


def test_prefix_caching_is_on_by_default() -> None:
    from ds.inference.config import EngineConfig

    assert EngineConfig().prefix_caching is True


def test_bad_model_directory_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope")]) == 2
    assert "config.json" in capsys.readouterr().out


def test_vllm_style_options_map_to_the_engine_config() -> None:
    args = _parser().parse_args(
        [
            "m",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "256",
            "--kv-cache-memory-bytes",
            "1.5GiB",
            "--quantization",
            "int4_sym",
            "--enable-prefix-caching",
            "--tokenizer",
            "tok",
            "--chat-template",
            "t.jinja",
            "--api-key",
            "k",
        ]
    )
    assert _config(args) == {
        "kv_cache": {"memory_budget_bytes": int(1.5 * 2**30)},
        "scheduler": {"max_running": 8, "token_budget": 256},
        "max_model_len": 2048,
        "quantization": {"scheme": "int4_sym"},
        "prefix_caching": True,
    }
    assert (args.tokenizer, args.chat_template, args.api_key) == ("tok", "t.jinja", "k")
    with pytest.raises(SystemExit):
        _parser().parse_args(["m", "--kv-cache-memory-bytes", "lots"])


def test_bad_chat_template_exits_2(
    tiny_dirs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tiny_dirs["llama"]), "--chat-template", "no template here"]) == 2
    assert "--chat-template" in capsys.readouterr().out


def test_quantization_activations_flag() -> None:
    args = _parser().parse_args(
        ["m", "--quantization", "int8_sym", "--quantization-activations", "int8"]
    )
    assert _config(args)["quantization"] == {"scheme": "int8_sym", "activations": "int8"}
    with pytest.raises(SystemExit, match="--quantization"):
        _config(_parser().parse_args(["m", "--quantization-activations", "int8"]))
