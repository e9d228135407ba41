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


def _counting_layers() -> list:
    torch.manual_seed(0)
    return [torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)]


def test_set_checkpoint_interval_changes_what_the_next_forward_checkpoints() -> None:
    from torch.utils.checkpoint import checkpoint

    segments: list[int] = []

    def counted(fn, x):  # type: ignore[no-untyped-def]
        segments.append(1)
        return checkpoint(fn, x, use_reentrant=False)

    m = PipelineModule(_counting_layers(), num_stages=1, activation_checkpoint_func=counted)
    x = torch.randn(2, 4)
    m(x)
    assert segments == []  # interval 0: nothing checkpointed
    for interval, expected in [(1, 4), (2, 2), (4, 1), (0, 0)]:
        segments.clear()
        m.set_checkpoint_interval(interval)
        assert m.activation_checkpoint_interval == interval
        m(x)
        assert len(segments) == expected, interval
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="activation_checkpoint_interval"):
            m.set_checkpoint_interval(bad)  # type: ignore[arg-type]


def _train_grads(func, interval: int) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    from ds.parallel.pipeline import PipelineRunner, build

    m = PipelineModule(
        _counting_layers(), num_stages=1, loss_fn=torch.nn.MSELoss(),
        activation_checkpoint_interval=interval, activation_checkpoint_func=func,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randn(2, 4, generator=g), torch.randn(2, 1, generator=g)) for _ in range(2)]
    runner = PipelineRunner(m, None, [0], torch.device("cpu"))
    runner.run(build("1f1b", 1, len(batches), 0), batches)
    assert all(not x.requires_grad for x, _ in batches)  # the caller's batch is left as it was
    return {n: p.grad.clone() for n, p in m.named_parameters()}


def test_reentrant_checkpointing_gets_first_stage_inputs_that_require_grad() -> None:
    # torch's reentrant checkpoint of a segment whose input needs no grad returns an output
    # outside autograd: the first segment's weights would get no gradient (or backward fails).
    # The runner marks the first stage's inputs, so the gradients equal an uncheckpointed run.
    import functools

    from torch.utils.checkpoint import checkpoint

    reentrant = functools.partial(checkpoint, use_reentrant=True)
    m = PipelineModule(_counting_layers(), num_stages=1, activation_checkpoint_func=reentrant)
    assert not m.checkpoint_needs_input_grad()
    m.set_checkpoint_interval(2)
    assert m.checkpoint_needs_input_grad()
    m.activation_checkpoint_func = None  # ds's default: torch's non-reentrant checkpoint
    assert not m.checkpoint_needs_input_grad()
    plain = _train_grads(None, 0)
    for func in (reentrant, None):
        got = _train_grads(func, 1)
        assert got.keys() == plain.keys()
        for name, grad in plain.items():
            torch.testing.assert_close(got[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_config_pipeline_section_sets_interval_and_non_reentrant_checkpointing() -> None:
    import functools
    from types import SimpleNamespace

    from torch.utils.checkpoint import checkpoint

    from ds.parallel.pipeline.engine import apply_checkpointing

    reentrant = functools.partial(checkpoint, use_reentrant=True)

    def module(interval: int = 0) -> PipelineModule:
        return PipelineModule(
            _counting_layers(), num_stages=1, activation_checkpoint_interval=interval,
            activation_checkpoint_func=reentrant,
        )  # fmt: skip

    m = module(3)
    apply_checkpointing(SimpleNamespace(pipeline={"activation_checkpoint_interval": 0}), m)
    assert m.activation_checkpoint_interval == 3  # 0 in the config keeps the module's
    apply_checkpointing(SimpleNamespace(pipeline={"activation_checkpoint_interval": 2}), m)
    assert m.activation_checkpoint_interval == 2 and m.checkpoint_needs_input_grad()
    # use_reentrant=false holds even while checkpointing is off: turning it on later uses it.
    m = module()
    apply_checkpointing(SimpleNamespace(pipeline={"use_reentrant": False}), m)
    assert m.activation_checkpoint_func is None
    m.set_checkpoint_interval(1)
    assert not m.checkpoint_needs_input_grad()
    for bad in ({"activation_checkpoint_interval": -1}, {"use_reentrant": "no"}):
        with pytest.raises(ConfigError, match=r"pipeline\."):
            apply_checkpointing(SimpleNamespace(pipeline=bad), module())
