"""The engine's parameter groups: how the user's groups split and the metadata each carries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.moe import REPLICA_ATTR, ReplicaGroup
from ds.interfaces.parallel import PP_REPLICA_ATTR, TP_DIM_ATTR, MeshShape
from ds.zero.param_groups import (
    META_KEY,
    GroupMeta,
    engine_param_groups,
    group_meta,
    hyper_params,
)


def _model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))


def _mesh(**sizes: int) -> SimpleNamespace:
    # The split reads only the mesh's shape.
    return SimpleNamespace(shape=MeshShape(**sizes))


def test_without_a_mesh_each_user_group_is_one_group_with_its_origin() -> None:
    model = _model()
    user = [
        {"params": list(model[0].parameters()), "lr": 0.1},
        {"params": list(model[1].parameters()), "lr": 0.2, "weight_decay": 0.0},
    ]
    groups, origin = engine_param_groups(model, user, None, stage=2)
    assert origin == [0, 1]
    assert [group_meta(g) for g in groups] == [GroupMeta(origin=0), GroupMeta(origin=1)]
    assert hyper_params(groups[1]) == {"lr": 0.2, "weight_decay": 0.0}
    assert [g["params"] for g in groups] == [u["params"] for u in user]


def test_tensor_parallel_slices_and_tied_copies_get_groups_of_their_own() -> None:
    model = _model()
    setattr(model[0].weight, TP_DIM_ATTR, 0)
    setattr(model[1].weight, PP_REPLICA_ATTR, True)
    groups, origin = engine_param_groups(model, None, _mesh(tp=2, pp=2), stage=1)
    metas = [group_meta(g) for g in groups]
    assert origin == [0, 0, 0]
    assert [(m.tp_sliced, m.pp_replica) for m in metas] == [
        (False, False),
        (False, True),
        (True, False),
    ]
    assert groups[1]["params"] == [model[1].weight]
    assert groups[2]["params"] == [model[0].weight]
    assert all(META_KEY not in hyper_params(g) and "params" not in hyper_params(g) for g in groups)


def test_experts_leave_their_group_per_replica_group_and_stage3_refuses_them() -> None:
    model = _model()
    experts = ReplicaGroup("ep_size_2", None, (0, 1))
    setattr(model[1].weight, REPLICA_ATTR, experts)
    setattr(model[1].bias, REPLICA_ATTR, experts)
    groups, origin = engine_param_groups(model, None, _mesh(tp=2), stage=2)
    assert origin == [0, 0]
    assert group_meta(groups[0]).replica is None
    assert group_meta(groups[1]) == GroupMeta(origin=0, replica=experts)
    assert groups[1]["params"] == [model[1].weight, model[1].bias]
    with pytest.raises(ConfigError, match="stage=3 with mixture-of-experts"):
        engine_param_groups(model, None, None, stage=3)


def test_a_group_the_engine_did_not_split_reads_as_the_defaults() -> None:
    group = {"params": [], "lr": 1.0}
    assert group_meta(group) == GroupMeta()
    assert hyper_params(group) == {"lr": 1.0}
