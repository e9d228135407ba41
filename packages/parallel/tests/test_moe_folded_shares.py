"""TPFold.shares: in each expert's run of routes, TP rank r takes the routes whose ordinal is r
modulo tp; together the ranks take every route exactly once, each about 1/tp of each expert's."""

from __future__ import annotations

import torch

from ds.parallel.moe.folded import TPFold


def test_shares_split_each_experts_routes_round_robin() -> None:
    experts = torch.tensor([0, 0, 0, 1, 1, 2, 3, 3, 3, 3])
    shares = TPFold(None, None, 0, 2).shares(experts)  # every TP rank's, by rank
    assert shares[0].tolist() == [0, 2, 3, 5, 6, 8]
    assert shares[1].tolist() == [1, 4, 7, 9]
    three = TPFold(None, None, 0, 3).shares(experts)
    assert [s.tolist() for s in three] == [[0, 3, 5, 6, 9], [1, 4, 7], [2, 8]]


def test_shares_cover_every_route_once() -> None:
    experts = torch.sort(torch.randint(0, 7, (101,), generator=torch.Generator().manual_seed(0)))
    for tp in (1, 2, 4):
        shares = TPFold(None, None, 0, tp).shares(experts.values)
        assert sorted(torch.cat(shares).tolist()) == list(range(101))
