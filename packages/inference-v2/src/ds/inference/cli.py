"""``ds serve MODEL_DIR``: serve a model over an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ds serve", description=__doc__)
    p.add_argument("model", help="Hugging Face model directory (config.json + safetensors)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--config", help="engine config: a JSON file or inline JSON object")
    p.add_argument("--block-size", type=int, help="kv_cache.block_size")
    p.add_argument("--num-blocks", type=int, help="kv_cache.num_blocks")
    p.add_argument("--prefix-caching", action="store_true", help="reuse cached prompt prefixes")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--served-model-name", help="model id reported to clients (default: dir name)")
    return p


def _config(args: argparse.Namespace) -> dict[str, object]:
    cfg: dict[str, object] = {}
    if args.config:
        src = Path(args.config)
        cfg = json.loads(src.read_text() if src.is_file() else args.config)
    kv = dict(cfg.get("kv_cache", {}))  # type: ignore[call-overload]
    if args.block_size:
        kv["block_size"] = args.block_size
    if args.num_blocks:
        kv["num_blocks"] = args.num_blocks
    if kv:
        cfg["kv_cache"] = kv
    if args.prefix_caching:
        cfg["prefix_caching"] = True
    if args.dtype:
        cfg["dtype"] = args.dtype
    return cfg


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        print("ds serve needs the server extra: pip install 'ds-inference-v2[serve]'")
        return 2
    from ds.inference.engine import build_engine
    from ds.inference.server import create_app
    from ds.inference.tokenizer import TextCodec
    from ds.interfaces.errors import DsError

    try:
        engine = build_engine(args.model, _config(args))
    except DsError as exc:
        print(f"ds serve: {exc}")
        return 2
    name = args.served_model_name or Path(args.model).name
    app = create_app(engine, TextCodec.from_dir(args.model), name)
    print(f"ds serve: {name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
