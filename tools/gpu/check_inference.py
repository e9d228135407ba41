"""Greedy generation of ds.inference against transformers, both on the device."""

from __future__ import annotations

import tempfile
from typing import Any

import torch


def run(device: torch.device, new_tokens: int = 16) -> dict[str, Any]:
    from models import build_llama

    from ds.inference import SamplingParams, build_engine, generate

    model = build_llama("tiny", seed=0)
    with torch.no_grad():  # clear logit margins: greedy must not hinge on near-ties
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.mul_(4.0)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (3, 17, 64, 200)]
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        hf = model.to(device).eval()
        want = []
        for p in prompts:
            ids = torch.tensor([p], device=device)
            with torch.no_grad():
                out = hf.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    pad_token_id=0,
                )
            want.append(out[0, len(p) :].tolist())
        engine = build_engine(tmp, {"device": str(device)})
        got = [
            r.tokens for r in generate(engine, prompts, SamplingParams(max_new_tokens=new_tokens))
        ]
    same = sum(a == b for a, b in zip(got, want, strict=True))
    return {"prompts": len(prompts), "identical": same, "ok": same == len(prompts)}
