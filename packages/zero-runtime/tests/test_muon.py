"""Muon against a float64 reference written from the published algorithm (Keller Jordan's
Muon: Nesterov momentum, quintic Newton-Schulz with coefficients (3.4445, -4.7750, 2.0315), five
steps, sqrt(rows / cols) for tall matrices, decoupled weight decay), AdamW for the rest; the
engine's split of a model into the two halves and the configurations it refuses.

Tolerances: ds iterates in fp32, the reference in float64; after five iterations the updates
agree to 2e-5 (atol) per element on matrices whose entries are ~0.1-0.5."""

from __future__ import annotations

import math

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.zero.engine import ZeroEngine
from ds.zero.optim.muon import Muon, muon_param_groups, newton_schulz


def ref_orthogonalize(g: torch.Tensor) -> torch.Tensor:
    a, b, c = 3.4445, -4.7750, 2.0315
    x = g.to(torch.float64)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / (torch.linalg.matrix_norm(x) + 1e-7)
    for _ in range(5):
        s = x @ x.T
        x = a * x + (b * s + c * s @ s) @ x
    return x.T if tall else x


def ref_muon(w, grads, lr, beta, wd):  # type: ignore[no-untyped-def]
    w, m = w.to(torch.float64).clone(), torch.zeros_like(w, dtype=torch.float64)
    for g in grads:
        g = g.to(torch.float64)
        m = beta * m + (1 - beta) * g
        nesterov = (1 - beta) * g + beta * m
        flat = nesterov.reshape(nesterov.shape[0], -1)
        u = ref_orthogonalize(flat) * math.sqrt(max(1.0, flat.shape[0] / flat.shape[1]))
        w = w * (1 - lr * wd) - lr * u.reshape(w.shape)
    return w


def ref_adamw(w, grads, lr, betas, eps, wd):  # type: ignore[no-untyped-def]
    w = w.to(torch.float64).clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    for t, g in enumerate(grads, start=1):
        g = g.to(torch.float64)
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        mhat, vhat = m / (1 - betas[0] ** t), v / (1 - betas[1] ** t)
        w = w * (1 - lr * wd) - lr * mhat / (vhat.sqrt() + eps)
    return w


SHAPES = [(12, 5), (5, 12), (8, 8), (33, 1), (1, 17), (4, 3, 2, 2)]


@pytest.mark.parametrize("ns_method", ["gram", "standard"])
@pytest.mark.parametrize("shape", SHAPES, ids=["x".join(map(str, s)) for s in SHAPES])
def test_matrix_update_matches_float64_reference(shape: tuple[int, ...], ns_method: str) -> None:
    gen = torch.Generator().manual_seed(sum(shape))
    w0 = torch.randn(shape, generator=gen)
    grads = [torch.randn(shape, generator=gen) for _ in range(3)]
    p = torch.nn.Parameter(w0.clone())
    opt = Muon(
        [{"params": [p], "use_muon": True, "lr": 0.05, "weight_decay": 0.1, "ns_method": ns_method}]
    )
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = ref_muon(w0, grads, lr=0.05, beta=0.95, wd=0.1)
    torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=2e-5)


def test_vectors_go_to_adamw_with_deepspeeds_defaults() -> None:
    gen = torch.Generator().manual_seed(1)
    w0 = torch.randn(7, generator=gen)
    grads = [torch.randn(7, generator=gen) for _ in range(4)]
    p = torch.nn.Parameter(w0.clone())
    opt = Muon([{"params": [p], "use_muon": False, "weight_decay": 0.01}])
    group = opt.param_groups[0]
    assert (group["lr"], group["betas"], group["eps"]) == (3e-4, (0.9, 0.95), 1e-10)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    want = ref_adamw(w0, grads, lr=3e-4, betas=(0.9, 0.95), eps=1e-10, wd=0.01)
    torch.testing.assert_close(p.detach().double(), want, rtol=0, atol=1e-6)


def test_orthogonalized_singular_values_near_one() -> None:
    g = torch.randn(16, 40, generator=torch.Generator().manual_seed(2))
    s = torch.linalg.svdvals(newton_schulz(g))
    assert s.min() > 0.5 and s.max() < 1.3  # the quintic's band, not exactly one


def test_groups_split_by_attribute_shape_and_name() -> None:
    model = torch.nn.ModuleDict(
        {
            "embed": torch.nn.Embedding(10, 4),
            "hidden": torch.nn.Linear(4, 4),
            "gate": torch.nn.Linear(4, 4),
        }
    )
    model["gate"].weight.use_muon = False  # an explicit choice wins over the shape
    names = {id(p): n for n, p in model.named_parameters()}
    params = {"lr": 0.01, "muon_lr": 0.04, "adam_lr": 1e-3, "momentum": 0.9, "betas": [0.8, 0.9]}
    groups = muon_param_groups([{"params": list(model.parameters())}], params, names)
    muon, adam = groups
    assert muon["use_muon"] and muon["params"] == [model["hidden"].weight]
    assert (muon["lr"], muon["momentum"]) == (0.04, 0.9) and "betas" not in muon
    assert not adam["use_muon"] and (adam["lr"], adam["betas"]) == (1e-3, (0.8, 0.9))
    assert len(adam["params"]) == 4 and "momentum" not in adam
    assert model["embed"].weight.use_muon is False and model["hidden"].weight.use_muon is True


def test_a_vector_marked_for_muon_is_refused() -> None:
    b = torch.nn.Parameter(torch.zeros(3))
    b.use_muon = True  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="matrices only"):
        muon_param_groups([{"params": [b]}], {}, {id(b): "bias"})


def _engine(stage: int, **zero: object) -> ZeroEngine:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 3))
    cfg = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "Muon", "params": {"lr": 0.02, "ns_method": "standard"}},
        "zero_optimization": {"stage": stage, **zero},
    }
    return ZeroEngine(model, cfg)


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_engine_steps_matrices_with_muon_and_biases_with_adamw(stage: int) -> None:
    engine = _engine(stage)
    model = engine.module
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(3))
    grads = {}
    for n in start:
        grads[n] = start[n].clone().requires_grad_(True)
    out = torch.func.functional_call(model, grads, (x,)).square().mean()
    out.backward()
    engine.backward(model(x).square().mean())
    engine.step()
    for n, p in model.named_parameters():
        g = grads[n].grad
        if p.dim() == 2:
            want = ref_muon(start[n], [g], lr=0.02, beta=0.95, wd=0.0)
        else:
            # The config's lr is shared by both halves (muon_lr / adam_lr set one alone).
            want = ref_adamw(start[n], [g], lr=0.02, betas=(0.9, 0.95), eps=1e-10, wd=0.0)
        torch.testing.assert_close(
            p.detach().double(), want, rtol=0, atol=2e-5, msg=lambda m, n=n: f"{n}: {m}"
        )


def test_stage3_is_refused() -> None:
    with pytest.raises(Exception, match=r"muon.*stage 3|stage 3.*muon"):
        _engine(3)


def test_offload_is_refused() -> None:
    with pytest.raises(Exception, match="does not support optimizer offload"):
        _engine(2, offload_optimizer={"device": "cpu"})
