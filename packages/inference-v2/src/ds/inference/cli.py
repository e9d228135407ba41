"""``ds serve MODEL``: serve a model (a Hugging Face directory or a GGUF file) over an
OpenAI-compatible HTTP API.

Options follow vLLM's names where they mean the same thing. SIGTERM (or Ctrl-C) stops accepting
connections, lets requests in flight finish for ``--shutdown-grace`` seconds, then exits 0; if
the engine thread dies the server stops and exits 1.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import threading
from pathlib import Path
from typing import Any

_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def _bytes(text: str) -> int:
    """``2GiB``, ``512M``, ``1e9``: a byte count."""
    m = re.fullmatch(r"\s*([0-9.eE+]+)\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (examples: 2GiB, 512M, 1e9)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is less than one byte")
    return int(value)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ds serve", description=__doc__)
    p.add_argument(
        "model",
        help="Hugging Face model directory (config.json + safetensors) or a GGUF file",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--config", help="engine config: a JSON file or inline JSON object")
    p.add_argument("--block-size", type=int, help="kv_cache.block_size")
    p.add_argument("--num-blocks", type=int, help="kv_cache.num_blocks")
    p.add_argument(
        "--kv-cache-memory-bytes",
        type=_bytes,
        help="KV cache budget (kv_cache.memory_budget_bytes), e.g. 2GiB; instead of --num-blocks",
    )
    p.add_argument(
        "--enable-prefix-caching",
        "--prefix-caching",
        dest="prefix_caching",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="reuse cached prompt prefixes (the default; --no-enable-prefix-caching turns it off)",
    )
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    p.add_argument(
        "--attention",
        choices=["auto", "torch", "triton", "native"],
        help="paged attention: the Triton kernel, the CPU decode kernel (native) or PyTorch "
        "(default auto: Triton on CUDA, native for fp32 on a CPU)",
    )
    p.add_argument(
        "--max-model-len",
        type=int,
        help="tokens per sequence, prompt + output (default: the model's max_position_embeddings)",
    )
    p.add_argument(
        "--max-num-seqs", type=int, help="sequences in the running batch (scheduler.max_running)"
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        help="tokens per forward (scheduler.token_budget)",
    )
    p.add_argument(
        "--quantization",
        choices=["int8_sym", "int4_sym"],
        help="weight-only quantization of the linear layers",
    )
    p.add_argument(
        "--quantization-activations",
        choices=["float", "int8"],
        help="with --quantization (or a quantization section in --config): int8 quantizes the "
        "linear layers' inputs per group too (integer dot products; changes the outputs)",
    )
    p.add_argument("--tokenizer", help="tokenizer directory (default: the model directory)")
    p.add_argument(
        "--chat-template", help="chat template: a Jinja file or the template text itself"
    )
    p.add_argument("--api-key", help="require 'Authorization: Bearer KEY' on /v1 routes")
    p.add_argument(
        "--max-prompt-chars",
        type=int,
        help="characters of prompt text a request may send, refused with a 400 before "
        "tokenizing (default: max(100000, 32 x max_model_len))",
    )
    p.add_argument("--served-model-name", help="model id reported to clients (default: dir name)")
    p.add_argument(
        "--shutdown-grace",
        type=float,
        default=30.0,
        help="seconds requests in flight may take to finish after SIGTERM (default 30)",
    )
    return p


def _config(args: argparse.Namespace) -> dict[str, object]:
    cfg: dict[str, Any] = {}
    if args.config:
        src = Path(args.config)
        cfg = json.loads(src.read_text() if src.is_file() else args.config)
    kv = dict(cfg.get("kv_cache", {}))
    if args.block_size:
        kv["block_size"] = args.block_size
    if args.num_blocks:
        kv["num_blocks"] = args.num_blocks
    if getattr(args, "kv_cache_memory_bytes", None):
        kv["memory_budget_bytes"] = args.kv_cache_memory_bytes
        kv.pop("num_blocks", None)
    if kv:
        cfg["kv_cache"] = kv
    sched = dict(cfg.get("scheduler", {}))
    if getattr(args, "max_num_seqs", None):
        sched["max_running"] = args.max_num_seqs
    if getattr(args, "max_num_batched_tokens", None):
        sched["token_budget"] = args.max_num_batched_tokens
    if sched:
        cfg["scheduler"] = sched
    if getattr(args, "max_model_len", None):
        cfg["max_model_len"] = args.max_model_len
    if getattr(args, "quantization", None):
        cfg["quantization"] = {**cfg.get("quantization", {}), "scheme": args.quantization}
    if getattr(args, "quantization_activations", None):
        if "quantization" not in cfg:
            raise SystemExit(
                "--quantization-activations applies to quantized weights: give --quantization "
                "int8_sym or int4_sym (or a quantization section in --config)"
            )
        cfg["quantization"]["activations"] = args.quantization_activations
    if args.prefix_caching is not None:
        cfg["prefix_caching"] = args.prefix_caching
    if args.dtype:
        cfg["dtype"] = args.dtype
    if getattr(args, "attention", None):
        cfg["attention"] = args.attention
    return cfg


def _tokenizer_dir(args: argparse.Namespace) -> str | Path | None:
    """--tokenizer, else the model directory, else the tokenizer a GGUF file carries."""
    if args.tokenizer:
        return str(args.tokenizer)
    from ds.inference.gguf_file import is_gguf

    if is_gguf(args.model):
        from ds.inference.gguf_tokenizer import tokenizer_dir

        return tokenizer_dir(args.model)
    return str(args.model)


def serve(app: Any, host: str, port: int, grace: float) -> int:
    """Run ``app`` until SIGTERM/SIGINT (exit 0) or until its engine thread dies (exit 1)."""
    import uvicorn

    config = uvicorn.Config(
        app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=max(grace, 0.1)
    )
    server = uvicorn.Server(config)
    app.state.stop_server = lambda: setattr(server, "should_exit", True)
    # uvicorn re-raises a captured SIGTERM/SIGINT to the handler that was installed before it,
    # after its graceful shutdown; with the default handler the drained process would still die
    # "killed by SIGTERM". A no-op handler there makes a clean drain exit 0.
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    loop = app.state.engine_loop
    if loop.dead is not None:
        print(f"ds serve: the engine thread died: {loop.dead}", flush=True)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import uvicorn  # noqa: F401
    except ImportError:
        print("ds serve needs the server extra: pip install 'ds-inference-v2[serve]'")
        return 2
    from ds.inference.engine import build_engine
    from ds.inference.server import create_app
    from ds.inference.tokenizer import TextCodec
    from ds.interfaces.errors import DsError

    try:
        engine = build_engine(args.model, _config(args))
        codec = TextCodec.from_dir(_tokenizer_dir(args), args.chat_template)
    except (DsError, OSError, ValueError) as exc:
        print(f"ds serve: {exc}")
        return 2
    name = args.served_model_name or Path(args.model).name
    app = create_app(
        engine, codec, name, api_key=args.api_key, max_prompt_chars=args.max_prompt_chars
    )
    print(
        f"ds serve: {name} on http://{args.host}:{args.port}/v1 "
        f"(max_model_len {engine.max_context}, {engine.capacity().total_blocks} KV blocks)",
        flush=True,
    )
    return serve(app, args.host, args.port, args.shutdown_grace)


if __name__ == "__main__":
    raise SystemExit(main())
