"""CPUAdagrad with sparse gradients (embedding rows): only the named elements move, exactly as
torch's sparse Adagrad moves them; the optimizers without element-wise sparse semantics refuse."""

from __future__ import annotations

import pytest
import torch

from ds.interfaces.errors import KernelError
from ds.ops.optim import CPUAdagrad, CPUAdam


@pytest.mark.parametrize("shape", [(40, 8), (96,)])
def test_sparse_adagrad_matches_torch(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(shape))
    q = torch.nn.Parameter(p.detach().clone())
    ours, ref = (
        CPUAdagrad([p], lr=0.1, lr_decay=0.01),
        torch.optim.Adagrad([q], lr=0.1, lr_decay=0.01),
    )
    untouched = torch.ones(shape[0], dtype=torch.bool)
    for _ in range(4):
        rows = torch.randint(0, shape[0], (1, 5))  # repeated rows are summed, as torch does
        untouched[rows[0]] = False
        g = torch.sparse_coo_tensor(rows, torch.randn(5, *shape[1:]), shape, check_invariants=True)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q)
    assert torch.equal(ours.state[p]["sum"][untouched], torch.zeros_like(p[untouched]))


def test_sparse_refused_where_it_has_no_element_wise_meaning() -> None:
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.sparse_coo_tensor(
        torch.tensor([[1]]), torch.ones(1), (4,), check_invariants=True
    )
    with pytest.raises(KernelError, match="sparse"):
        CPUAdam([p]).step()
    with pytest.raises(KernelError, match="weight_decay"):
        CPUAdagrad([p], weight_decay=0.1).step()
