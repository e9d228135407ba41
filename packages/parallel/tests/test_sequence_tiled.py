"""Tiled compute: the same output and gradients as the untiled function, one slice of the
sequence at a time, and the ZeRO "gradient not ready" marks on every slice but the last."""

from __future__ import annotations

import copy

import pytest
import torch

from ds.parallel.sequence.tiled import TiledFusedLogitsLoss, TiledMLP, sequence_tiled_compute


class _MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)))


def _grads(m: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in m.parameters()]  # type: ignore[union-attr]


class _Marks:
    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        self.seen: list[bool] = []
        for p in params:
            p.register_post_accumulate_grad_hook(lambda p: self.seen.append(p.ds_grad_is_ready))


@pytest.mark.parametrize("batch", [1, 3])
def test_tiled_mlp_and_generic_form_match_untiled(batch: int) -> None:
    torch.manual_seed(0)
    ref = _MLP()
    x = torch.randn(batch, 13, 8, requires_grad=True)
    g = torch.randn(batch, 13, 8)
    ref(x).backward(g)
    expected, x_grad = _grads(ref), x.grad.clone()  # type: ignore[union-attr]

    for run in ("mlp", "generic"):
        m = copy.deepcopy(ref)
        m.zero_grad(set_to_none=True)
        marks = _Marks([m.up.weight])
        xt = x.detach().requires_grad_(True)
        params = list(m.parameters())
        if run == "mlp":
            out = TiledMLP.apply(type(m).forward, m, xt, 4, params)
        else:
            out = sequence_tiled_compute(
                type(m).forward, 13, 4, {"x": xt}, {"self": m}, "x", params,
                output_unshard_dimension=1, output_reduction=None,
            )  # fmt: skip
        torch.testing.assert_close(out, ref(x).detach())
        out.backward(g)
        torch.testing.assert_close(xt.grad, x_grad)
        for a, b in zip(_grads(m), expected):
            torch.testing.assert_close(a, b)
        assert marks.seen == [False, False, False, True]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_tiled_logits_loss_matches_and_follows_loss_scale(reduction: str) -> None:
    torch.manual_seed(1)
    head = torch.nn.Linear(8, 11, bias=False)
    x = torch.randn(2, 9, 8, requires_grad=True)
    y = torch.randint(0, 11, (2, 9))

    def loss_fn(mod: torch.nn.Module, xs: torch.Tensor, ys: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.cross_entropy(mod(xs), ys, reduction=reduction)

    # 18 tokens in 3 slices of 6: the mean of slice means is the mean over tokens.
    ref_loss = loss_fn(head, x.view(-1, 8), y.view(-1))
    (ref_loss * 4).backward()
    expected_w, expected_x = head.weight.grad.clone(), x.grad.clone()  # type: ignore[union-attr]
    head.weight.grad, xt = None, x.detach().requires_grad_(True)
    loss = TiledFusedLogitsLoss.apply(loss_fn, head, xt, y, None, 3, [head.weight], reduction)
    torch.testing.assert_close(loss, ref_loss.detach())
    (loss * 4).backward()  # a scaled loss scales every gradient
    torch.testing.assert_close(xt.grad, expected_x)
    torch.testing.assert_close(head.weight.grad, expected_w)


def test_logits_loss_checks_shapes() -> None:
    with pytest.raises(ValueError, match="batch, seq"):
        TiledFusedLogitsLoss.apply(
            None, None, torch.zeros(2, 3, 4), torch.zeros(2, 4), None, 2, [], "mean"
        )
