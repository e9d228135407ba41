"""ds.inference on the device: greedy generation against transformers' (parity), and the
engine's throughput against transformers ``generate`` on the same model and prompts."""

from __future__ import annotations

import tempfile
import time
from typing import Any

import torch

# The serve rows' model: a Llama of ~0.2B parameters (random weights; throughput only).
SERVE = dict(
    vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
    num_attention_heads=16, num_key_value_heads=8, max_position_embeddings=2048,
)  # fmt: skip


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parity(device: torch.device, attention: str, tiny: bool, new_tokens: int = 16) -> dict:
    from models import build_llama

    from ds.inference import SamplingParams, build_engine, generate

    model = build_llama("tiny", seed=0)
    with torch.no_grad():  # clear logit margins: greedy must not hinge on near-ties
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    g = torch.Generator().manual_seed(0)
    lengths = (3, 9) if tiny else (3, 17, 64, 200)
    new_tokens = 4 if tiny else new_tokens
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in lengths]
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hf = model.to(device).eval()
        want = []
        for p in prompts:
            ids = torch.tensor([p], device=device)
            with torch.no_grad():
                out = hf.generate(
                    ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens, do_sample=False, pad_token_id=0,
                )  # fmt: skip
            want.append(out[0, len(p) :].tolist())
        engine = build_engine(tmp, {"device": str(device), "attention": attention})
        got = [
            r.tokens for r in generate(engine, prompts, SamplingParams(max_new_tokens=new_tokens))
        ]
    same = sum(a == b for a, b in zip(got, want, strict=True))
    return {"value": same, "unit": f"of {len(prompts)} identical", "attention": engine.attention,
            "ok": same == len(prompts)}  # fmt: skip


class Serve:
    """One model on disk, the prompts, and transformers' reading, shared by the two rows."""

    def __init__(self, device: torch.device, tiny: bool) -> None:
        import transformers

        self.device = device
        shape = dict(SERVE)
        if tiny:
            shape.update(vocab_size=512, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        torch.manual_seed(0)
        cfg = transformers.LlamaConfig(**shape, attn_implementation="sdpa")
        self.model = transformers.LlamaForCausalLM(cfg).to(self.dtype)
        self.tmp = tempfile.TemporaryDirectory()
        self.model.save_pretrained(self.tmp.name)
        n, length, self.new = (4, 8, 4) if tiny else (64, 256, 128)
        g = torch.Generator().manual_seed(1)
        self.prompts = torch.randint(0, shape["vocab_size"], (n, length), generator=g)
        self.hf_tokens_per_s: float | None = None

    def transformers(self) -> dict:
        hf = self.model.to(self.device).eval()
        ids = self.prompts.to(self.device)

        def run(new: int) -> None:
            with torch.no_grad():
                hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                            min_new_tokens=new, do_sample=False, pad_token_id=0)  # fmt: skip

        run(2)  # warm-up
        _sync(self.device)
        t0 = time.perf_counter()
        run(self.new)
        _sync(self.device)
        tps = self.prompts.shape[0] * self.new / (time.perf_counter() - t0)
        self.hf_tokens_per_s = tps
        self.model.cpu()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return {"value": tps, "unit": "new tokens/s", "batch": self.prompts.shape[0],
                "new_tokens": self.new, "ok": tps > 0}  # fmt: skip

    def ds(self) -> dict:
        from ds.inference import SamplingParams, build_engine, generate

        dtype = "bfloat16" if self.dtype == torch.bfloat16 else "float32"
        engine = build_engine(self.tmp.name, {"device": str(self.device), "dtype": dtype})
        prompts = self.prompts.tolist()
        # Warm-up (compiles the kernels) on other prompts: no cached prefix helps the timed run.
        warm = [[(t + 1) % 100 for t in p] for p in prompts[:2]]
        generate(engine, warm, SamplingParams(max_new_tokens=2))
        _sync(self.device)
        t0 = time.perf_counter()
        out = generate(engine, prompts, SamplingParams(max_new_tokens=self.new))
        _sync(self.device)
        tps = sum(len(r.tokens) for r in out) / (time.perf_counter() - t0)
        row: dict[str, Any] = {"value": tps, "unit": "new tokens/s", "attention": engine.attention}
        if self.hf_tokens_per_s:
            row["vs_transformers"] = tps / self.hf_tokens_per_s
            row["ok"] = row["vs_transformers"] >= 1.0
        return row

    def close(self) -> None:
        self.tmp.cleanup()
