"""The Triton optimizer kernels against their pure-torch references, on the GPU."""

from __future__ import annotations

from typing import Any

import torch

TOL = {torch.float32: 1e-6, torch.bfloat16: 2**-7, torch.float16: 2**-10}


def _one(
    kind: str, dtype: torch.dtype, n: int, steps: int, device: torch.device
) -> tuple[float, float]:
    """(largest relative difference, fraction of elements beyond the tolerance)."""
    from ds.ops.triton import (
        adagrad,
        adagrad_reference,
        adam,
        adam_reference,
        lion,
        lion_reference,
    )

    gen = torch.Generator().manual_seed(n)
    p = torch.randn(n, generator=gen).to(dtype).to(device)
    states = 2 if kind == "adam" else 1
    s = [torch.zeros(n, dtype=torch.float32, device=device) for _ in range(states)]
    rp, rs = p.clone(), [t.clone() for t in s]
    for step in range(1, steps + 1):
        g = torch.randn(n, generator=gen).to(dtype).to(device)
        if kind == "adam":
            kw: dict[str, Any] = {"step": step, "lr": 1e-2, "weight_decay": 0.05}
            adam.adam_step(p, g, *s, **kw)
            adam_reference.adam_step(rp, g, *rs, **kw)
        elif kind == "lion":
            lion.lion_step(p, g, *s, lr=1e-3, weight_decay=0.1)
            lion_reference.lion_step(rp, g, *rs, lr=1e-3, weight_decay=0.1)
        else:
            adagrad.adagrad_step(p, g, *s, lr=1e-2, weight_decay=0.01)
            adagrad_reference.adagrad_step(rp, g, *rs, lr=1e-2, weight_decay=0.01)
    torch.cuda.synchronize(device)
    rel = (p.float() - rp.float()).abs() / (1 + rp.float().abs())
    # The same fp32 math in another operation order: a few ulps of the storage dtype per step.
    # Lion's sign() may flip where the momentum mix is within an ulp of 0: rare single elements.
    beyond = float((rel > 4 * TOL[dtype] * steps).float().mean())
    return float(rel.max()), beyond


def run(device: torch.device, n: int = 10**6 + 17, steps: int = 10) -> list[dict[str, Any]]:
    rows = []
    for kind in ("adam", "lion", "adagrad"):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            try:
                err, beyond = _one(kind, dtype, n, steps, device)
                rows.append(
                    {
                        "kernel": kind,
                        "dtype": str(dtype)[6:],
                        "max_rel_err": err,
                        "fraction_beyond_tol": beyond,
                        "ok": beyond <= 1e-5,
                    }
                )
            except Exception as exc:
                row = {"kernel": kind, "dtype": str(dtype)[6:], "error": repr(exc), "ok": False}
                rows.append(row)
    return rows
