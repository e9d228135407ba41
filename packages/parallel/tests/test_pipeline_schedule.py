"""Pipeline schedules as instruction lists: every micro-batch forwarded and backwarded once per
chunk, the lists run without deadlock, and the simulated bubble is the formula."""

from __future__ import annotations

import pytest

from ds.interfaces.errors import ConfigError
from ds.parallel.pipeline import SCHEDULES, bubble_fraction, build, forward_only, simulate
from ds.parallel.pipeline.schedule import Action

CASES = [("gpipe", 2, 4, 1), ("gpipe", 4, 3, 1), ("1f1b", 2, 4, 1), ("1f1b", 4, 8, 1),
         ("1f1b", 4, 5, 1), ("interleaved_1f1b", 2, 4, 2), ("interleaved_1f1b", 4, 8, 2),
         ("interleaved_1f1b", 2, 2, 3)]  # fmt: skip


def _lists(name: str, p: int, m: int, v: int) -> list[list[Action]]:
    return [build(name, p, m, s, v) for s in range(p)]


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
def test_each_microbatch_once_forward_then_backward(name: str, p: int, m: int, v: int) -> None:
    for actions in _lists(name, p, m, v):
        want = {(mb, c) for mb in range(m) for c in range(v)}
        forwards = [(a.microbatch, a.chunk) for a in actions if a.kind == "F"]
        backwards = [(a.microbatch, a.chunk) for a in actions if a.kind == "B"]
        assert sorted(forwards) == sorted(want) and sorted(backwards) == sorted(want)
        position = {(a.kind, a.microbatch, a.chunk): i for i, a in enumerate(actions)}
        for mb, c in want:
            assert position[("F", mb, c)] < position[("B", mb, c)]


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
@pytest.mark.parametrize("t_backward", [1.0, 2.0])
def test_runs_without_deadlock_and_bubble_is_the_formula(
    name: str, p: int, m: int, v: int, t_backward: float
) -> None:
    sim = simulate(_lists(name, p, m, v), v, 1.0, t_backward)
    assert sim.bubble_fraction == pytest.approx(bubble_fraction(p, m, v), abs=1e-12)
    assert sim.makespan == pytest.approx((1.0 + t_backward) * (m + (p - 1) / v))


def test_1f1b_holds_fewer_activations_than_gpipe() -> None:
    p, m = 4, 8
    gpipe = simulate(_lists("gpipe", p, m, 1)).peak_live
    one = simulate(_lists("1f1b", p, m, 1)).peak_live
    assert gpipe == (m,) * p
    assert one == tuple(p - s for s in range(p))


def test_a_wrong_order_is_caught_as_a_deadlock() -> None:
    # Stage 1 would backward micro-batch 1 before it ever forwards it.
    bad = [
        build("gpipe", 2, 2, 0),
        [Action("B", 1), Action("F", 0), Action("F", 1), Action("B", 0)],
    ]
    with pytest.raises(AssertionError, match="deadlock"):
        simulate(bad)


def test_forward_only_keeps_the_order_and_runs() -> None:
    lists = [forward_only(a) for a in _lists("interleaved_1f1b", 2, 4, 2)]
    assert all(a.kind == "F" for acts in lists for a in acts)
    simulate(lists, chunks=2)


@pytest.mark.parametrize(
    ("name", "p", "m", "words"),
    [
        ("1f1b", 4, 2, ["2 micro-batches on 4 stages", "gradient_accumulation_steps >= 4"]),
        ("interleaved_1f1b", 2, 1, ["1 micro-batches on 2 stages", ">= 2"]),
        ("interleaved_1f1b", 2, 3, ["multiple of 2"]),
        ("zigzag", 2, 4, ["zigzag", "gpipe"]),
    ],
)
def test_bad_microbatch_counts_are_one_line(name: str, p: int, m: int, words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        build(name, p, m, 0, 2)
    msg = str(e.value)
    assert "\n" not in msg
    for w in words:
        assert w in msg


def test_gpipe_runs_fewer_microbatches_than_stages() -> None:
    assert SCHEDULES == ("gpipe", "1f1b", "interleaved_1f1b")
    simulate(_lists("gpipe", 4, 2, 1))
