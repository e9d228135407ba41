"""GGUF files in: tiny random models written with llama.cpp's ``gguf`` writer load with their
weights, config, tokenizer and chat template; greedy output equals transformers' on the same
dequantized weights; unsupported or damaged files fail with one clear line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf_models import (
    CHATML,
    MIXED_TYPES,
    MORE_TYPES,
    SPECIALS,
    hf_from_gguf,
    tiny_gguf_model,
    vocabulary,
    write_gguf,
)
from inference_models import hf_greedy, prompts

from ds.inference import SamplingParams, build_engine, generate
from ds.inference.gguf_file import SUPPORTED_TYPES, GGUFCheckpoint, is_gguf, read_gguf
from ds.interfaces.errors import ConfigError

gguf = pytest.importorskip("gguf")
NEW_TOKENS = 8


@pytest.fixture(scope="module")
def models() -> dict[str, Any]:
    return {"llama": tiny_gguf_model("llama"), "qwen2": tiny_gguf_model("qwen2", seed=1)}


@pytest.fixture(scope="module")
def files(models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gguf")
    return {
        "llama-f32": write_gguf(root / "llama-f32.gguf", models["llama"]),
        "llama-mixed": write_gguf(root / "llama-mixed.gguf", models["llama"], types=MIXED_TYPES),
        "llama-more": write_gguf(root / "llama-more.gguf", models["llama"], types=MORE_TYPES),
        "qwen2-f16": write_gguf(
            root / "qwen2-f16.gguf",
            models["qwen2"],
            arch="qwen2",
            types={k: "F16" for k in MIXED_TYPES},
        ),
    }


def test_f32_llama_loads_the_original_weights_with_q_k_unpermuted(
    files: dict[str, Path], models: dict[str, Any]
) -> None:
    config, weights = read_gguf(files["llama-f32"])
    ref = models["llama"].state_dict()
    assert set(weights) == set(ref)
    for name, tensor in ref.items():
        assert torch.equal(weights[name], tensor), name
    hf = models["llama"].config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        assert config[key] == getattr(hf, key), key
    assert config["num_key_value_heads"] == hf.num_key_value_heads
    assert config["model_type"] == "llama" and config["vocab_size"] == hf.vocab_size
    assert config["tie_word_embeddings"] is False
    assert config["eos_token_id"] == vocabulary().index("<|im_end|>")


def test_end_of_turn_token_also_ends_generation(models: dict[str, Any], tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "eot.gguf", models["llama"], end_of_turn=True)
    engine = build_engine(path, {"kv_cache": {"num_blocks": 8}})
    ends = sorted(vocabulary().index(t) for t in ("<|im_end|>", "<|endoftext|>"))
    assert list(engine.eos_token_ids) == ends


def test_every_supported_type_dequantizes_as_transformers_reads_the_file(
    files: dict[str, Path], models: dict[str, Any]
) -> None:
    used = set()
    for path in (files["llama-mixed"], files["llama-more"]):
        used |= {t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}
        _, weights = read_gguf(path)
        theirs = hf_from_gguf(path).state_dict()
        for name, tensor in theirs.items():
            assert torch.equal(weights[name], tensor), (path.name, name)
    assert used == set(SUPPORTED_TYPES)
    _, weights = read_gguf(files["llama-mixed"])
    # Types quantized from the model (not random K-quant blocks) stay close to its weights.
    ref = models["llama"].state_dict()
    bounds = {
        "embed_tokens": 0.01,
        "q_proj": 0.15,
        "k_proj": 0.15,
        "gate_proj": 1e-3,
        "up_proj": 1e-2,
    }
    for name, tensor in ref.items():
        for part, bound in bounds.items():
            if part in name:
                err = (weights[name] - tensor).abs().max() / tensor.abs().max()
                assert err < bound, (name, float(err))


@pytest.mark.parametrize("name", ["llama-mixed", "llama-more", "qwen2-f16"])
def test_greedy_equals_transformers_on_the_dequantized_weights(
    name: str, files: dict[str, Path]
) -> None:
    path = files[name]
    hf = hf_from_gguf(path)
    ps = prompts(n=3, lo=3, hi=40, vocab=hf.config.vocab_size)
    want = [hf_greedy(hf, p, NEW_TOKENS) for p in ps]
    engine = build_engine(path, {"kv_cache": {"block_size": 16, "num_blocks": 64}})
    got = generate(engine, ps, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in got] == want


def test_q8_0_file_keeps_its_grid_in_ds_int8_weights(
    models: dict[str, Any], tmp_path: Path
) -> None:
    from ds.inference.quantize import load_provider

    q8 = {k: "Q8_0" for k in MIXED_TYPES}
    path = write_gguf(tmp_path / "q8.gguf", models["llama"], types=q8)
    _, weights = read_gguf(path)
    provider = load_provider("cpu")
    w = weights["model.layers.1.mlp.down_proj.weight"]
    # Q8_0's block of 32 with scale amax/127 is ds's int8_sym with group_size 32: no change.
    assert torch.equal(provider.dequantize(provider.quantize(w, "int8_sym", 32), torch.float32), w)
    ps = prompts(n=2, lo=3, hi=30, vocab=models["llama"].config.vocab_size)
    kv = {"block_size": 16, "num_blocks": 32}
    plain = build_engine(path, {"kv_cache": kv})
    int8 = build_engine(
        path, {"kv_cache": kv, "quantization": {"scheme": "int8_sym", "group_size": 32}}
    )
    params = SamplingParams(max_new_tokens=NEW_TOKENS)
    assert [r.tokens for r in generate(int8, ps, params)] == [
        r.tokens for r in generate(plain, ps, params)
    ]


def test_qwen2_keeps_its_q_k_layout_and_biases(
    files: dict[str, Path], models: dict[str, Any]
) -> None:
    config, weights = read_gguf(files["qwen2-f16"])
    ref = models["qwen2"].state_dict()
    assert config["model_type"] == "qwen2" and config["tie_word_embeddings"] is True
    q = "model.layers.0.self_attn.q_proj."
    assert torch.equal(weights[q + "bias"], ref[q + "bias"])
    assert torch.equal(weights[q + "weight"], ref[q + "weight"].half().float())
    _, bf16 = read_gguf(files["qwen2-f16"], torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in bf16.values())
    assert torch.equal(bf16[q + "weight"], weights[q + "weight"].bfloat16())


def test_qwen3_with_its_own_head_size_and_q_k_norms(tmp_path: Path) -> None:
    model = tiny_gguf_model("qwen3", seed=2)
    path = write_gguf(tmp_path / "qwen3.gguf", model, arch="qwen3")
    config, weights = read_gguf(path)
    assert config["model_type"] == "qwen3" and config["head_dim"] == 32
    ref = model.state_dict()
    assert all(torch.equal(weights[k], ref[k]) for k in weights)
    assert "model.layers.1.self_attn.k_norm.weight" in weights
    ps = prompts(n=2, lo=3, hi=30, vocab=model.config.vocab_size)
    engine = build_engine(path, {"kv_cache": {"block_size": 16, "num_blocks": 32}})
    got = generate(engine, ps, SamplingParams(max_new_tokens=NEW_TOKENS))
    assert [r.tokens for r in got] == [hf_greedy(model, p, NEW_TOKENS) for p in ps]


@pytest.mark.parametrize("add_bos", [False, True])
def test_tokenizer_and_chat_template_come_from_the_metadata(
    add_bos: bool, models: dict[str, Any], tmp_path: Path
) -> None:
    import transformers

    from ds.inference.gguf_file import open_gguf
    from ds.inference.gguf_tokenizer import write_tokenizer_dir
    from ds.inference.tokenizer import TextCodec

    path = write_gguf(tmp_path / "tok.gguf", models["llama"], add_bos=add_bos)
    codec = TextCodec.from_dir(write_tokenizer_dir(open_gguf(path), tmp_path / "tok"))
    hf_tok = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file=path.name)
    vocab = vocabulary()
    text = "in the hat, the <|im_end|> end"
    ids = codec.encode(text)
    assert ids[1 if add_bos else 0 :] == hf_tok(text, add_special_tokens=False).input_ids
    assert vocab.index("Ġthe") in ids and vocab.index("<|im_end|>") in ids
    assert (ids[0] == vocab.index("<|im_start|>")) is add_bos
    assert codec.decode(ids) == text.replace("<|im_end|>", "")
    assert codec.chat_template == CHATML
    assert codec.special["eos_token"] == "<|im_end|>"
    chat = codec.chat_ids([{"role": "user", "content": "the"}])
    assert chat[0] == vocab.index("<|im_start|>") and chat.count(vocab.index(SPECIALS[1])) == 2


def test_ds_serve_finds_the_tokenizer_inside_the_gguf(files: dict[str, Path]) -> None:
    from ds.inference import cli

    args = cli._parser().parse_args([str(files["llama-f32"])])
    directory = Path(cli._tokenizer_dir(args))
    assert (directory / "tokenizer.json").is_file()
    assert (directory / "tokenizer_config.json").is_file()
    explicit = cli._parser().parse_args([str(files["llama-f32"]), "--tokenizer", "elsewhere"])
    assert cli._tokenizer_dir(explicit) == "elsewhere"


def _bare_gguf(path: Path, arch: str) -> Path:
    """A GGUF of architecture ``arch`` with one tensor and no other metadata."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_without_tokenizer_serves_token_ids(tmp_path: Path) -> None:
    from ds.inference import cli
    from ds.inference.tokenizer import TextCodec

    path = _bare_gguf(tmp_path / "bare.gguf", "llama")
    directory = cli._tokenizer_dir(cli._parser().parse_args([str(path)]))
    assert directory is None and not TextCodec.from_dir(directory).available


def test_container_parser_reads_what_gguf_reader_reads(
    files: dict[str, Path], tmp_path: Path
) -> None:
    from ds.inference.gguf_parse import GGUFContainer

    path = tmp_path / "kinds.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_bool("t.bool", True)
    w.add_int8("t.i8", -5)
    w.add_uint64("t.u64", 2**40 + 3)
    w.add_float64("t.f64", 0.1)
    w.add_float32("t.f32", 0.1)
    w.add_string("t.str", "héllo")
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.strs", ["a", "", "日本"])
    w.add_tensor("x", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for file in (path, files["llama-mixed"]):
        ours = GGUFContainer(file)
        ref = gguf.GGUFReader(str(file))
        assert set(ours.metadata) == set(ref.fields) - {"GGUF.version", "GGUF.tensor_count",
                                                        "GGUF.kv_count"}  # fmt: skip
        for key, value in ours.metadata.items():
            assert value == ref.fields[key].contents(), key
        for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
            assert (mine.name, mine.offset) == (theirs.name, theirs.data_offset)
            data = ours.data(mine, theirs.tensor_type)
            assert np.array_equal(data, theirs.data), mine.name


# -- bad input --------------------------------------------------------------------------------
def _one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_unsupported_tensor_type_names_it_and_the_supported_ones(
    models: dict[str, Any], tmp_path: Path
) -> None:
    path = write_gguf(tmp_path / "iq4.gguf", models["llama"], types={"ffn_up": "IQ4_NL"})
    with pytest.raises(ConfigError) as exc:
        build_engine(path)
    text = _one_line(exc)
    assert "IQ4_NL" in text and "ffn_up" in text and "supported: F32, F16, BF16" in text


def test_unsupported_architecture_names_it(tmp_path: Path) -> None:
    path = _bare_gguf(tmp_path / "gpt2.gguf", "gpt2")
    with pytest.raises(ConfigError) as exc:
        build_engine(path)
    assert "'gpt2' is not supported; supported: llama, qwen2, qwen3" in _one_line(exc)


def test_truncated_and_corrupt_files_fail_with_a_load_error(
    files: dict[str, Path], tmp_path: Path
) -> None:
    data = files["llama-f32"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 4096])
    with pytest.raises(ConfigError) as exc:
        GGUFCheckpoint(cut)
    assert "truncated" in _one_line(exc)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    with pytest.raises(ConfigError) as exc:
        build_engine(junk)
    assert "not a readable GGUF file" in _one_line(exc)
    assert is_gguf(junk) and not is_gguf(tmp_path)


def test_unknown_tensor_type_id_is_a_load_error(files: dict[str, Path], tmp_path: Path) -> None:
    path = tmp_path / "unknown-type.gguf"
    path.write_bytes(files["llama-f32"].read_bytes())
    reader = gguf.GGUFReader(str(path), "r+")
    reader.tensors[3].field.parts[4][0] = 99  # the tensor's ggml type id
    reader.data.flush()
    del reader
    with pytest.raises(ConfigError) as exc:
        build_engine(path)
    assert "unknown GGUF type id 99; supported: F32, F16" in _one_line(exc)


def test_ds_serve_exits_2_on_a_damaged_gguf(
    files: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("uvicorn")
    from ds.inference import cli

    data = files["llama-f32"].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) // 2])
    assert cli.main([str(cut)]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("ds serve: ") and "truncated" in out and "\n" not in out
