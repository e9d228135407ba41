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
    mark_by_granularity,
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


class Blocks(nn.Module):
    """Two small blocks (granularity 2 * 72 // 3 = 48) under a list, and a larger head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Alternating() for _ in range(2))
        self.head = nn.Linear(8, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = torch.tanh(b(x))
        return self.head(x).sum()


def test_granularity_threshold_marks_outermost_small_subtrees() -> None:
    m = Blocks()
    assert mark_by_granularity(m, 0) == [] and mark_by_granularity(m, 47) == []
    # The root (granularity (2 * 144 + 576) // 8 = 108) stays; the list is never a leaf.
    assert mark_by_granularity(m, 100) == list(m.blocks)
    assert not z3_leaf_module(m) and not z3_leaf_module(m.blocks) and not z3_leaf_module(m.head)
    whole = Blocks()
    assert mark_by_granularity(whole, 108) == [whole]  # the outermost one only


def test_granularity_threshold_from_config_trains_as_torch() -> None:
    """The leaves the threshold makes read their children's weights directly (Alternating):
    only their whole-subtree gather serves that, and training matches plain PyTorch."""
    torch.manual_seed(0)
    model = Blocks()
    ref = Blocks()
    ref.load_state_dict(model.state_dict())
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    eng = stage3(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        stage3_param_persistence_threshold=0,
        stage3_module_granularity_threshold=100,
    )
    assert get_z3_leaf_modules(model) == list(model.blocks)
    for step in range(3):
        x = torch.randn(2, 8, generator=torch.Generator().manual_seed(step))
        ref_opt.zero_grad()
        ref(x).backward()
        ref_opt.step()
        eng.backward(eng(x))
        eng.step()
    with eng.strategy.partitioner.hold():
        for a, b in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(b.data, a.data, rtol=1e-6, atol=1e-6)
