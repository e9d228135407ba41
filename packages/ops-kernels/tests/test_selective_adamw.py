"""Selective AdamW: the selected columns follow torch's AdamW, the others do not move; the ZeRO-3
(transposed partition) form and the host-resident moments give the same numbers."""

from __future__ import annotations

import pytest
import torch

from ds.ops.optim import SelectiveAdamW, SelectiveAdamWPartitioned

COLS = torch.tensor([0, 2, 3])


def _reference(w: torch.Tensor, grads: list[torch.Tensor], **kw: float) -> torch.Tensor:
    ref = torch.nn.Parameter(w[:, COLS].clone())
    opt = torch.optim.AdamW([ref], **kw)  # type: ignore[arg-type]
    for g in grads:
        ref.grad = g.clone()
        opt.step()
    return ref.detach()


@pytest.mark.parametrize("offload", [False, True])
@pytest.mark.parametrize("amsgrad", [False, True])
def test_selected_columns_follow_adamw(offload: bool, amsgrad: bool) -> None:
    torch.manual_seed(0)
    w = torch.randn(3, 5)
    grads = [torch.randn(3, len(COLS)) for _ in range(4)]
    p = torch.nn.Parameter(w.clone())
    opt = SelectiveAdamW([p], lr=0.01, weight_decay=0.1, amsgrad=amsgrad, offload=offload)
    for g in grads:
        p.selected_indices, p.selected_grad = COLS, g  # type: ignore[attr-defined]
        opt.step()
        assert p.selected_grad is None  # type: ignore[attr-defined]
    expected = _reference(w, grads, lr=0.01, weight_decay=0.1, amsgrad=amsgrad)
    torch.testing.assert_close(p.data[:, COLS], expected)
    assert torch.equal(p.data[:, [1, 4]], w[:, [1, 4]])
    if offload:
        assert p.exp_avg_cpu_data.abs().sum() > 0  # type: ignore[attr-defined]


def test_partitioned_form_updates_transposed_rows_and_snapshot_is_restored() -> None:
    torch.manual_seed(1)
    w = torch.randn(3, 5)
    grads = [torch.randn(len(COLS), 3) for _ in range(3)]
    p = torch.nn.Parameter(torch.zeros(1))
    p.ds_shape, p.ds_tensor = (5, 3), w.T.contiguous().view(-1)  # type: ignore[attr-defined]
    p.complete_column_offset, p.complete_numel, p.group_id = 0, 15, 0  # type: ignore[attr-defined]
    opt = SelectiveAdamWPartitioned([p], lr=0.01)
    rows = p.ds_tensor.view(5, 3)  # type: ignore[attr-defined]
    for g in grads:
        p.selected_indices, p.selected_grad = COLS, g  # type: ignore[attr-defined]
        opt.temp_copy_param([p])
        rows[COLS] += 100.0  # the full optimizer's write, undone by the snapshot
        opt.step()
    expected = _reference(w, [g.T for g in grads], lr=0.01)
    torch.testing.assert_close(rows[COLS].T, expected)
    opt.clear_selected_mv()
    assert opt.state[p]["exp_avg"].abs().sum() == 0
