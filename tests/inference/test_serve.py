"""End to end: `ds serve` on loopback, concurrent streaming OpenAI-client requests, outputs equal
offline generation of the same model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import torch
from tiny_models import tiny_model
from world import free_port

sys.path.insert(0, str(Path(__file__).parent))
from serve_model import serve_command

VOCAB = 512


def _tiny_model_dir(root: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tiny_model(vocab_size=VOCAB)
    out = root / "tiny-llama"
    model.save_pretrained(out, safe_serialization=True)
    # A word-level tokenizer over the model's vocabulary: "w0" .. "w511", space separated.
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(out / "tokenizer.json"))
    return out


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_streaming_requests_equal_offline_generation(tmp_path: Path) -> None:
    openai = pytest.importorskip("openai")
    pytest.importorskip("fastapi")
    from ds.inference import SamplingParams, build_engine, generate
    from ds.inference.tokenizer import TextCodec

    model_dir = _tiny_model_dir(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [
            *serve_command(),
            str(model_dir),
            "--port",
            str(port),
            "--block-size",
            "16",
            "--num-blocks",
            "256",
            "--prefix-caching",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=60
        )
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"ds serve exited early:\n{proc.stdout.read() if proc.stdout else ''}")
            try:
                assert client.models.list().data[0].id == "tiny-llama"
                break
            except openai.APIConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("ds serve did not come up within 120 s")
                time.sleep(0.5)

        g = torch.Generator().manual_seed(1)
        prompts = [
            " ".join(f"w{int(t)}" for t in torch.randint(1, VOCAB, (n,), generator=g))
            for n in (3, 17, 40, 90, 130, 7)
        ]
        max_tokens = [12, 5, 20, 9, 16, 1]
        results: dict[int, tuple[str, list[int], str | None]] = {}
        errors: list[BaseException] = []

        def ask(i: int) -> None:
            try:
                stream = client.completions.create(
                    model="tiny-llama",
                    prompt=prompts[i],
                    max_tokens=max_tokens[i],
                    temperature=0.0,
                    stream=True,
                )
                text, ids, reason = "", [], None
                for chunk in stream:
                    c: Any = chunk.choices[0]
                    text += c.text
                    ids.extend(c.model_extra["token_ids"])
                    reason = c.finish_reason or reason
                results[i] = (text, ids, reason)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors

        codec = TextCodec.from_dir(model_dir)
        engine = build_engine(model_dir, {"kv_cache": {"block_size": 16, "num_blocks": 256}})
        offline = generate(
            engine,
            [codec.encode(p) for p in prompts],
            [SamplingParams(max_new_tokens=m) for m in max_tokens],
            decode=codec.decode,
        )
        for i, want in enumerate(offline):
            text, ids, reason = results[i]
            assert ids == want.tokens
            assert text.strip() == want.text
            assert reason == "length"

        # A non-streaming chat request works too and reports usage.
        chat = client.chat.completions.create(
            model="tiny-llama",
            messages=[{"role": "user", "content": "w5 w6 w7"}],
            max_tokens=4,
            temperature=0.0,
        )
        assert chat.usage is not None and chat.usage.completion_tokens == 4
        # Requests the cache can never hold are refused with a clear message.
        with pytest.raises(openai.BadRequestError, match=r"maximum context length|whole KV cache"):
            client.completions.create(model="tiny-llama", prompt=prompts[0], max_tokens=10**6)

        # A client that disconnects mid-stream frees its KV blocks without running to the end.
        health = f"http://127.0.0.1:{port}/health"

        def free_blocks() -> int:
            with urllib.request.urlopen(health, timeout=30) as resp:
                return int(json.loads(resp.read())["free_blocks"])

        stream = client.completions.create(
            model="tiny-llama", prompt=prompts[3], max_tokens=900, temperature=0.0, stream=True
        )
        chunks = iter(stream)
        next(chunks)
        next(chunks)
        assert free_blocks() < 256
        stream.close()
        deadline = time.monotonic() + 60
        while free_blocks() != 256:
            assert time.monotonic() < deadline, "aborted request still holds KV blocks"
            time.sleep(0.2)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
