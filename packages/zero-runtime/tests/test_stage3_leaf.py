"""ZeRO-3 leaf modules: marking by class, name and suffix, the config section, and a leaf whose
forward picks a different child each step (per-child hooks would miss the unused child)."""

from __future__ import annotations

import pytest
import torch
from _stage3 import stage3
from torch import nn

from ds.zero.config.sections_aux import DEFAULT_LEAF_MODULE_CLASSES, LeafModuleConfig
from ds.zero.stage3 import ParamStatus, shard_of
from ds.zero.stage3.leaf import (
    get_z3_leaf_modules,
    mark_by_class,
    mark_by_name,
    mark_by_suffix,
    z3_leaf_module,
)


class Alternating(nn.Module):
    def __init__(self, d: int = 8) -> None:
        super().__init__()
        self.pick = nn.ModuleList([nn.Linear(d, d), nn.Linear(d, d)])
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Reads the chosen child's weight directly: only a whole-subtree gather serves it.
        lin = self.pick[self.calls % 2]
        self.calls += 1
        return nn.functional.linear(x, lin.weight, lin.bias)


class Wrapper(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Alternating()


def test_marking_by_class_name_and_suffix() -> None:
    m = Wrapper()
    qualified = f"{Alternating.__module__}.{Alternating.__qualname__}"
    assert mark_by_class(m, [qualified]) == [m.inner] and z3_leaf_module(m.inner)
    assert mark_by_class(m, [Alternating], flag=False) == [m.inner]
    assert get_z3_leaf_modules(m) == []
    assert mark_by_class(m, ["Missing"], raise_if_not_found=False) == []
    with pytest.raises(ValueError):
        mark_by_class(m, [nn.Conv2d])
    assert mark_by_name(m, ["inner", "nope"], raise_if_not_found=False) == ([m.inner], ["nope"])
    assert mark_by_suffix(m, ["pick"]) == ([m.inner.pick], [])


def test_config_section_defaults_and_strings() -> None:
    assert LeafModuleConfig().classes == DEFAULT_LEAF_MODULE_CLASSES
    cfg = LeafModuleConfig(classes="a.B", names=["x", "x"], name_suffixes="tail")
    assert (cfg.classes, cfg.names, cfg.name_suffixes) == (["a.B"], ["x"], ["tail"])


def test_leaf_from_config_gathers_whole_subtree() -> None:
    torch.manual_seed(0)
    model = Wrapper()
    ref = Alternating()
    ref.load_state_dict(model.inner.state_dict())
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    eng = stage3(model, opt, stage3_param_persistence_threshold=0, leaf_module={"names": ["inner"]})
    assert z3_leaf_module(model.inner)
    x = torch.randn(2, 8)
    for _ in range(2):
        assert torch.allclose(model.inner(x), ref(x))
    assert all(shard_of(p).status is ParamStatus.NOT_AVAILABLE for p in model.parameters())
    del eng
