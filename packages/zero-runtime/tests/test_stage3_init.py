"""ds.zero.Init, GatheredParameters, meta-device construction and consolidated weights."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from _stage3 import stage3
from torch import nn

import ds.zero
from ds.zero.init import load_state_dict_into_shards
from ds.zero.stage3 import shard_of


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 6)
        self.body = nn.Sequential(nn.Linear(6, 6), nn.Tanh())
        self.head = nn.Linear(6, 11, bias=False)
        self.head.weight = self.emb.weight  # tied, as in most language models

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.emb(idx)))


class Custom(nn.Linear):
    """A subclass that edits its weights after the parent's __init__ (must see them whole)."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        with torch.no_grad():
            self.weight.fill_(0.5)


def _plain_and_partitioned(seed: int) -> tuple[Tied, Tied]:
    """The same model built from ``seed`` twice: plainly, then partitioned by ``ds.zero.Init``."""
    torch.manual_seed(seed)
    ref = Tied()
    torch.manual_seed(seed)
    with ds.zero.Init():
        return ref, Tied()


def test_init_partitions_as_created() -> None:
    ref, model = _plain_and_partitioned(0)
    with ds.zero.Init():
        custom = Custom()
    assert all(p.numel() == 0 for p in model.parameters())
    assert model.head.weight is model.emb.weight
    assert shard_of(custom.weight).shard[:16].eq(0.5).all()
    with ds.zero.GatheredParameters(list(model.parameters())):
        for p, q in zip(model.parameters(), ref.parameters()):
            assert torch.equal(p, q)
    assert all(p.numel() == 0 for p in model.parameters())
    # Classes defined and modules built after the context exits are left alone.
    assert nn.Linear(2, 2).weight.numel() == 4


def test_gathered_parameters_modifier_writes_back() -> None:
    with ds.zero.Init():
        model = nn.Linear(3, 2)
    with ds.zero.GatheredParameters(model.weight, modifier_rank=0), torch.no_grad():
        model.weight.copy_(torch.arange(6.0).view(2, 3))
    assert model.weight.numel() == 0
    assert torch.equal(shard_of(model.weight).shard[:6], torch.arange(6.0))


def test_meta_construction_then_load_like_from_pretrained() -> None:
    torch.manual_seed(1)
    pretrained = Tied()
    with torch.device("meta"), ds.zero.Init():
        model = Tied()
    assert model.head.weight is model.emb.weight and model.emb.weight.device.type == "cpu"
    load_state_dict_into_shards(model, pretrained.state_dict())
    rt = stage3(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        stage3_param_persistence_threshold=0,
    )
    idx = torch.randint(0, 11, (3, 5))
    torch.testing.assert_close(model(idx), pretrained(idx), rtol=0, atol=0)
    sd = model.state_dict()  # consolidated by the stage-3 state_dict hook
    for k, v in pretrained.state_dict().items():
        assert torch.equal(sd[k], v), k
    assert rt.strategy.partitioner.acct.live_bytes == 0


def test_engine_trains_init_model_like_plain() -> None:
    ref, model = _plain_and_partitioned(2)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    rt = stage3(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-2),
        stage3_param_persistence_threshold=8,
    )
    for step in range(5):
        idx = torch.randint(0, 11, (4, 5), generator=torch.Generator().manual_seed(step))
        opt_ref.zero_grad()
        a = ref(idx).logsumexp(-1).mean()
        a.backward()
        opt_ref.step()
        b = model(idx).logsumexp(-1).mean()
        rt.backward(b)
        rt.step()
        assert torch.allclose(a, b, rtol=1e-6)
    full = rt.strategy.consolidated_state_dict()
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(full[k], v, rtol=1e-5, atol=1e-6)


def test_nvme_offload_without_provider_names_the_distribution(tmp_path: object) -> None:
    from ds.interfaces.errors import ProviderNotFoundError

    model = nn.Linear(4, 4)
    with pytest.raises(ProviderNotFoundError, match="ds-ops-kernels"):
        stage3(
            copy.deepcopy(model),
            torch.optim.AdamW(model.parameters()),
            offload_param={"device": "nvme", "nvme_path": str(tmp_path)},
        )


@pytest.mark.parametrize("variant", ["bf16", "nvme"])
def test_modifier_edits_reach_the_master_copy(variant: str, tmp_path: object) -> None:
    """An edit inside GatheredParameters(modifier_rank=0) survives the next optimizer step."""
    from ds.interfaces.registry import get

    model = nn.Linear(6, 4)
    zero: dict[str, Any] = {}
    config: dict[str, Any] = {}
    kernels = None
    if variant == "bf16":
        model = model.to(torch.bfloat16)  # bf16 shards, fp32 masters
    else:
        kernels = get("ds.kernels", "cpu")()
        zero = {
            "offload_param": {"device": "nvme", "nvme_path": str(tmp_path)},
            "offload_optimizer": {"device": "nvme", "nvme_path": str(tmp_path)},
        }
        config = {"aio": {"block_size": 4096, "queue_depth": 2}}
    rt = stage3(
        model,
        torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0),
        kernels=kernels,
        config=config,
        stage3_param_persistence_threshold=0,
        **zero,
    )
    edited = torch.arange(24.0).view(4, 6).to(model.weight.dtype)
    with ds.zero.GatheredParameters(model.weight, modifier_rank=0), torch.no_grad():
        model.weight.copy_(edited)
    rt.backward(model(torch.ones(2, 6, dtype=edited.dtype)).float().sum())
    rt.step()  # lr 0: the update must write back exactly the edited values
    assert torch.equal(rt.strategy.consolidated_state_dict()["weight"], edited)
    rt.destroy()


def test_meta_model_without_init_is_a_clear_error() -> None:
    from ds.interfaces.errors import ConfigError

    with torch.device("meta"):
        model = nn.Linear(3, 3)
    with pytest.raises(ConfigError, match=r"meta device.*ds\.zero\.Init"):
        stage3(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_parameters_carry_deepspeed_attributes() -> None:
    with ds.zero.Init():
        lin = nn.Linear(4, 3)
    w = lin.weight
    assert (w.ds_numel, tuple(w.ds_shape), w.ds_persist) == (12, (3, 4), False)
    assert w.ds_id == shard_of(w).ds_id and w.ds_tensor is shard_of(w).shard
    assert w.ds_status is ds.zero.stage3.ParamStatus.NOT_AVAILABLE
    with ds.zero.GatheredParameters([w]):
        assert w.ds_status is ds.zero.stage3.ParamStatus.AVAILABLE
    assert w.ds_status is ds.zero.stage3.ParamStatus.NOT_AVAILABLE


def test_one_rank_group_under_a_multi_rank_launch_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ds.interfaces.errors import ConfigError
    from ds.zero.init import single_rank_group_contradiction as why

    assert why(1, None, {"WORLD_SIZE": "1"}) is None and why(4, None, {"WORLD_SIZE": "4"}) is None
    assert (
        why(1, object(), {"WORLD_SIZE": "4"}) is None and why(1, None, {"WORLD_SIZE": "x"}) is None
    )
    assert "WORLD_SIZE=4" in (why(1, None, {"WORLD_SIZE": "4"}) or "")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="init_distributed"):
        ds.zero.Init()
