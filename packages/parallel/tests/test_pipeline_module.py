"""PipelineModule in one process: partition methods, which layers a stage builds, tied weights,
per-layer state, activation checkpointing, and bad input."""

from __future__ import annotations

import pytest
import torch

from ds.interfaces.errors import ConfigError
from ds.interfaces.parallel import pp_replica
from ds.parallel.pipeline import LayerSpec, PipelineModule, TiedLayerSpec, partition


def test_partition_methods() -> None:
    names = ["Embed", "Block", "Block", "Block", "Block", "Norm"]
    counts = [100, 10, 10, 10, 10, 1]
    assert partition("uniform", 3, names, counts) == [0, 2, 4, 6]
    # balanced parameters: the embedding alone, the rest together
    assert partition("parameters", 2, names, counts) == [0, 1, 6]
    # type:Block gives each stage two blocks
    assert partition("type:block", 2, names, counts) == [0, 3, 6]


@pytest.mark.parametrize(
    ("method", "parts", "words"),
    [
        ("uniform", 7, ["num_stages=7", "number of layers 6", "at most 6"]),
        ("type:attn", 2, ["type:attn", "matches none"]),
        ("best", 2, ["'best'", "uniform"]),
    ],
)
def test_partition_bad_input(method: str, parts: int, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        partition(method, parts, ["A"] * 6, [1] * 6)
    assert "\n" not in str(e.value)
    for w in words:
        assert w in str(e.value)


def _layers() -> list:
    return [
        TiedLayerSpec("embed", torch.nn.Embedding, 10, 4),
        LayerSpec(torch.nn.Linear, 4, 4),
        torch.nn.ReLU(),
        LayerSpec(torch.nn.Linear, 4, 4),
        TiedLayerSpec("embed", torch.nn.Embedding, 10, 4, forward_fn=lambda m, x: x @ m.weight.T),
    ]


def test_each_stage_builds_only_its_layers_with_tied_copies() -> None:
    stages = [
        PipelineModule(_layers(), num_stages=2, partition_method="uniform", stage_id=s)
        for s in range(2)
    ]
    assert stages[0].parts == [0, 3, 5]
    assert {n for n, _ in stages[0].named_parameters()} == {
        "tied_modules.embed.weight", "1.weight", "1.bias"}  # fmt: skip
    assert {n for n, _ in stages[1].named_parameters()} == {
        "tied_modules.embed.weight", "3.weight", "3.bias"}  # fmt: skip
    assert stages[0].tied_stages() == {"embed": [0, 1]}
    # the later stage's copy is left out of the norm; the owner's is counted
    assert not pp_replica(stages[0].tied_modules["embed"].weight)
    assert pp_replica(stages[1].tied_modules["embed"].weight)
    # per-layer files: the tied module only from its owner, under its first index
    assert sorted(stages[0].layer_state_dicts()) == [0, 1, 2]  # the ReLU: an empty file
    assert sorted(stages[1].layer_state_dicts()) == [3]
    assert stages[1].layer_files_needed() == {"3": 3, "tied_modules.embed": 0}


def test_one_stage_is_the_whole_model_and_seeds_follow_the_layer_index() -> None:
    a = PipelineModule(_layers(), num_stages=1, seed_layers=True, base_seed=3)
    b = PipelineModule(_layers(), num_stages=1, seed_layers=True, base_seed=3)
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        assert torch.equal(p, q), n
    ids = torch.tensor([[1, 2, 3]])
    manual = a.tied_modules["embed"](ids)
    manual = a._modules["3"](torch.relu(a._modules["1"](manual))) @ a.tied_modules["embed"].weight.T
    torch.testing.assert_close(a(ids), manual)


def test_activation_checkpointing_gives_the_same_gradients() -> None:
    plain = PipelineModule(_layers(), num_stages=1, seed_layers=True)
    ckpt = PipelineModule(
        _layers(), num_stages=1, seed_layers=True, activation_checkpoint_interval=1
    )
    ids = torch.tensor([[1, 2, 3, 4]])
    for m in (plain, ckpt):
        m(ids).square().mean().backward()
    for (n, p), (_, q) in zip(plain.named_parameters(), ckpt.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, msg=n)


def test_bad_stage_input_is_one_line() -> None:
    with pytest.raises(ConfigError, match="num_stages=6 exceeds the number of layers 5"):
        PipelineModule(_layers(), num_stages=6, stage_id=0)
    from ds.parallel.pipeline import check_stages

    with pytest.raises(ConfigError) as e:
        check_stages(3, 4)
    assert "num_stages=3 does not divide the world size 4" in str(e.value)
    with pytest.raises(TypeError, match="the class itself"):
        LayerSpec(torch.nn.Linear(2, 2))  # type: ignore[arg-type]


def test_without_loss_fn_a_one_element_output_is_the_loss() -> None:
    from types import SimpleNamespace

    from ds.parallel.pipeline.runner import PipelineRunner

    runner = SimpleNamespace(module=SimpleNamespace(loss_fn=None))
    out = torch.ones(1, 1, requires_grad=True)
    assert PipelineRunner._loss(runner, out, None) is out  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss_fn"):
        PipelineRunner._loss(runner, torch.ones(2, 1), None)  # type: ignore[arg-type]
