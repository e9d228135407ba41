"""The llama.cpp side of tools/bench/inference_llamacpp.py, run by the peer's own Python (a venv
with ``llama-cpp-python``; nothing of ds is imported here).

One JSON command per line on stdin, one JSON answer per line on the original stdout (llama.cpp's
own logging goes to stderr):

* ``{"op": "convert", "src", "dst", "ftype", "embd_type"}``: ``llama_model_quantize`` (llama.cpp's
  own quantizer, requantizing allowed) from ``src`` to ``dst``; ``embd_type`` (a ggml type id or
  null for llama.cpp's default) sets the token embedding and output tensor types.
* ``{"op": "load", "path", "threads", "n_seq", "n_ctx", "kv_type"}``: a model and one context with
  ``n_seq`` sequences in a unified KV cache of ``n_ctx`` cells.
* ``{"op": "run", "prompts", "new_tokens"}``: every prompt decoded together (llama.cpp's batched
  API, as llama-server does with ``--parallel``): one ``llama_decode`` with all prompts, then one
  per step with one token of each sequence, greedy (argmax), exactly ``new_tokens`` tokens each.
  Answers the tokens, and the wall and CPU seconds to the first token of every sequence and in
  all.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import time
from typing import Any

import llama_cpp as L
import numpy as np


def convert(src: str, dst: str, ftype: int, embd_type: int | None) -> dict[str, Any]:
    p = L.llama_model_quantize_default_params()
    p.ftype = ftype
    p.allow_requantize = True
    p.nthread = 1
    if embd_type is not None:
        p.token_embedding_type = embd_type
        p.output_tensor_type = embd_type
    rc = L.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    if rc != 0:
        raise RuntimeError(f"llama_model_quantize {src} -> {dst} (ftype {ftype}) returned {rc}")
    return {"path": dst, "bytes": os.path.getsize(dst)}


class Peer:
    def __init__(self, path: str, threads: int, n_seq: int, n_ctx: int, kv_type: int) -> None:
        self.model = L.llama_model_load_from_file(path.encode(), L.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {path}")
        cp = L.llama_context_default_params()
        cp.n_ctx = cp.n_batch = n_ctx
        cp.n_ubatch = 512
        cp.n_seq_max = n_seq
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = kv_type
        cp.kv_unified = True
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama_init_from_model failed")
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(n_ctx, 0, n_seq)
        self.mem = L.llama_get_memory(self.ctx)

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        L.llama_model_free(self.model)

    def _decode(self, items: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence, wants logits) items."""
        b = self.batch
        for i, (tok, pos, seq, out) in enumerate(items):
            b.token[i] = tok
            b.pos[i] = pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = seq
            b.logits[i] = out
        b.n_tokens = len(items)
        rc = L.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i: int) -> int:
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))
        return int(row.argmax())

    def run(self, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
        L.llama_memory_clear(self.mem, True)
        t0, c0 = time.perf_counter(), time.process_time()
        items, last = [], []
        for s, p in enumerate(prompts):
            items += [(t, j, s, j == len(p) - 1) for j, t in enumerate(p)]
            last.append(len(items) - 1)
        self._decode(items)
        out = [[self._argmax(i)] for i in last]
        first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        for step in range(1, new_tokens):
            self._decode(
                [(o[-1], len(p) + step - 1, s, True) for s, (p, o) in enumerate(zip(prompts, out))]
            )
            for s, o in enumerate(out):
                o.append(self._argmax(s))
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        return {"tokens": out, "first_s": first, "wall_s": wall, "first_cpu_s": first_cpu,
                "cpu_s": cpu}  # fmt: skip


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the library prints goes to stderr, not into the answers
    L.llama_backend_init()
    peer: Peer | None = None
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        try:
            if op == "convert":
                result = convert(**cmd)
            elif op == "load":
                if peer is not None:
                    peer.close()
                peer = Peer(**cmd)
                result = {"n_vocab": peer.n_vocab}
            elif op == "run":
                assert peer is not None, "run before load"
                result = peer.run(**cmd)
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # reported to the driver, which stops with it
            result = {"error": f"{type(exc).__name__}: {exc}"}
        answers.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
