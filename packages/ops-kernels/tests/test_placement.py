"""Placement of optimizer state (ds.ops.placement): state tensors start at least MIN_GAP bytes,
modulo PERIOD, from the buffers the fused step walks them with, whatever the caller's tensors'
addresses; small tensors stay plain; the optimizers keep the placement across a checkpoint."""

from __future__ import annotations

import random

import pytest
import torch

from ds.ops import placement
from ds.ops.optim import CPUAdagrad, CPUAdam, CPULion
from ds.ops.placement import MIN_BYTES, MIN_GAP, PERIOD, congruent_pairs, zeros_apart
from ds.ops.provider import CpuKernelProvider

MB = 1 << 20


def _dist(a: torch.Tensor, b: torch.Tensor) -> int:
    d = (a.data_ptr() - b.data_ptr()) % PERIOD
    return min(d, PERIOD - d)


@pytest.fixture(scope="module")
def arena() -> torch.Tensor:
    # Untouched pages of one large allocation: views at chosen offsets give the caller's tensors
    # any address relation a real allocator could produce (congruent modulo 32 MiB included).
    return torch.empty(3 * PERIOD + 16 * MB, dtype=torch.uint8)


def _view(arena: torch.Tensor, offset: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
    start = (-arena.data_ptr()) % 64 + offset  # 64-byte aligned, like torch's allocations
    return arena[start : start + nbytes].view(dtype)


def test_state_avoids_congruent_buffers(arena: torch.Tensor) -> None:
    nbytes = 4 * MB
    # Three buffers at the same address modulo PERIOD, and one a few KiB off it.
    avoid = [_view(arena, k * PERIOD, nbytes, torch.float32) for k in range(3)]
    avoid.append(_view(arena, 2 * PERIOD + 8 * MB + 4096, nbytes, torch.float32))
    assert len(congruent_pairs([(str(i), t) for i, t in enumerate(avoid)])) == 3
    out = zeros_apart((1024, 1024), torch.float32, avoid)
    assert out.shape == (1024, 1024) and out.dtype == torch.float32 and out.is_contiguous()
    assert torch.count_nonzero(out) == 0
    assert all(_dist(out, a) >= MIN_GAP for a in avoid)


def test_random_address_sets_always_get_a_free_slot(arena: torch.Tensor) -> None:
    rng = random.Random(7)
    for _ in range(200):
        k = rng.randint(1, 6)
        # Offsets clustered in a few hundred KiB around congruent spots: the hard case.
        offs = [rng.randrange(3) * PERIOD + rng.randrange(0, 512 << 10, 64) for _ in range(k)]
        avoid = [_view(arena, o, MIN_BYTES, torch.uint8) for o in offs]
        out = zeros_apart((MIN_BYTES // 2,), torch.float16, avoid)
        assert all(_dist(out, a) >= MIN_GAP for a in avoid), offs
        # The padding is bounded by the number of buffers avoided.
        assert out.untyped_storage().nbytes() <= MIN_BYTES + 2 * k * MIN_GAP


def test_dense_address_sets(arena: torch.Tensor) -> None:
    # 200 buffers spread over the whole period leave about a fifth of the addresses free, so a
    # plain allocation would land too close in most of these trials.
    rng = random.Random(11)
    padded = []
    for _ in range(10):
        offs = sorted(rng.sample(range(0, PERIOD, 4096), 200))
        avoid = [_view(arena, o, MIN_BYTES, torch.uint8) for o in offs]
        out = zeros_apart((MIN_BYTES,), torch.uint8, avoid)
        assert all(_dist(out, a) >= MIN_GAP for a in avoid)
        assert torch.count_nonzero(out) == 0
        padded.append(out.untyped_storage().nbytes() > MIN_BYTES)
        # A generator of the buffers is read once, for the argument check and the placement
        # alike (read twice, the placement would see none of them).
        out = zeros_apart((MIN_BYTES,), torch.uint8, (a for a in avoid))
        assert all(_dist(out, a) >= MIN_GAP for a in avoid)
    # A plain allocation that already lies apart is kept unpadded; here most cannot be.
    assert any(padded)
    with pytest.raises(ValueError, match="at most 255"):
        zeros_apart((MIN_BYTES,), torch.uint8, [avoid[0]] * 256)


def test_fill_value_and_small_tensors(arena: torch.Tensor) -> None:
    big = [_view(arena, 0, 4 * MB, torch.float32)]
    full = zeros_apart((MB,), torch.float32, big, fill=0.25)
    assert torch.equal(full, torch.full((MB,), 0.25))
    small = zeros_apart((1000,), torch.bfloat16, big)
    assert small.untyped_storage().nbytes() == 2000  # plain: under MIN_BYTES nothing is padded
    assert torch.count_nonzero(small) == 0
    # Nothing large to avoid: plain as well.
    plain = zeros_apart((MB,), torch.float32, [torch.empty(10)])
    assert plain.untyped_storage().nbytes() == 4 * MB


def test_congruent_pairs_reports_only_near_pairs(arena: torch.Tensor) -> None:
    a = _view(arena, 0, 4 * MB, torch.uint8)
    b = _view(arena, PERIOD + MIN_GAP // 2, 4 * MB, torch.uint8)  # 32 KiB off modulo PERIOD
    c = _view(arena, PERIOD + 8 * MB, 4 * MB, torch.uint8)  # 8 MiB off
    small = _view(arena, 2 * PERIOD, 1024, torch.uint8)  # congruent with a, but small
    assert congruent_pairs([("a", a), ("b", b), ("c", c), ("s", small)]) == [("a", "b")]


def test_bad_arguments_name_the_mistake_before_touching_elements() -> None:
    # A tensor passed where a list of them belongs is itself iterable; each call must refuse it
    # up front instead of walking its elements (which, for a large tensor, exhausts memory).
    big = torch.empty(MIN_BYTES)
    with pytest.raises(TypeError, match=r"got one tensor; pass \[tensor\]"):
        zeros_apart((MB,), torch.float32, big)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="placed_copy: avoid must hold tensors, got int"):
        placement.placed_copy(torch.zeros(4), [big, 3])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="expected \\(name, tensor\\) pairs, got one tensor"):
        congruent_pairs(big)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="got an item of type Tensor"):
        congruent_pairs([big, big])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="got an item of type tuple"):
        congruent_pairs([(big, "grad")])  # type: ignore[list-item]


def _adversarial_param(arena: torch.Tensor, dtype: torch.dtype) -> torch.nn.Parameter:
    # Param and grad congruent modulo PERIOD, as the caller's allocator may place them.
    n = 2 * MB  # elements: 4-8 MiB per buffer
    nbytes = n * torch.empty((), dtype=dtype).element_size()
    p = torch.nn.Parameter(_view(arena, 0, nbytes, dtype))
    p.data.normal_()
    p.grad = _view(arena, PERIOD, nbytes, dtype).normal_()
    return p


@pytest.mark.parametrize(
    ("cls", "names", "kwargs"),
    [
        (CPUAdam, ("exp_avg", "exp_avg_sq"), {"fp32_optimizer_states": False}),
        (CPUAdam, ("exp_avg", "exp_avg_sq"), {}),
        (CPULion, ("exp_avg",), {}),
        (CPUAdagrad, ("sum",), {"initial_accumulator_value": 0.5}),
    ],
)
def test_optimizer_state_is_placed_and_kept_across_load(
    arena: torch.Tensor,
    cls: type,
    names: tuple[str, ...],
    kwargs: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A plain allocation lands apart from two given buffers by chance too, so the test also
    # records what each state tensor was placed against (the real function still runs).
    from ds.ops.optim import _base

    calls: list[tuple[int, set[int]]] = []

    def recording(shape, dtype, avoid=(), fill=0.0):  # type: ignore[no-untyped-def]
        out = placement.zeros_apart(shape, dtype, avoid, fill)
        calls.append((out.data_ptr(), {t.data_ptr() for t in avoid}))
        return out

    monkeypatch.setattr(_base, "zeros_apart", recording)
    p = _adversarial_param(arena, torch.bfloat16)
    ref = torch.nn.Parameter(p.detach().clone())
    ref.grad = p.grad.clone()
    opt, ref_opt = cls([p], lr=1e-3, **kwargs), cls([ref], lr=1e-3, **kwargs)
    opt.step()
    with torch.no_grad():  # the reference's state: plain allocations, same values
        ref_opt.step()
    named = [("param", p), ("grad", p.grad)] + [(n, opt.state[p][n]) for n in names]
    assert congruent_pairs(named) == [("param", "grad")]
    placed = dict(calls)
    for i, n in enumerate(names):  # each state avoided the param, the grad and earlier state
        want = {p.data_ptr(), p.grad.data_ptr()} | {opt.state[p][m].data_ptr() for m in names[:i]}
        assert placed[opt.state[p][n].data_ptr()] == want
    # Placement changes addresses only: the step is bit-identical to one on plain tensors.
    assert torch.equal(p.detach(), ref.detach())
    for n in names:
        assert torch.equal(opt.state[p][n], ref_opt.state[ref][n])

    saved = opt.state_dict()
    fresh = cls([p], lr=1e-3, **kwargs)
    fresh.load_state_dict(saved)
    named = [("param", p), ("grad", p.grad)] + [(n, fresh.state[p][n]) for n in names]
    assert congruent_pairs(named) == [("param", "grad")]
    for n in names:
        assert torch.equal(fresh.state[p][n], opt.state[p][n])
        assert fresh.state[p][n].dtype == opt.state[p][n].dtype


def test_provider_new_state(arena: torch.Tensor) -> None:
    like = _view(arena, 0, 4 * MB, torch.float32)
    grad = _view(arena, 2 * PERIOD, 4 * MB, torch.float32)
    out = CpuKernelProvider().new_state(like, (like, grad))
    assert out.shape == like.shape and out.dtype == like.dtype
    assert torch.count_nonzero(out) == 0
    assert _dist(out, like) >= MIN_GAP and _dist(out, grad) >= MIN_GAP
    # Off the CPU there is nothing to place: zeros on the tensor's own device.
    meta = CpuKernelProvider().new_state(torch.empty(3, 5, device="meta"), ())
    assert meta.device.type == "meta" and meta.shape == (3, 5)


def test_module_constants_are_consistent() -> None:
    # The counting argument of zeros_apart needs candidate slots MIN_GAP apart to fit in PERIOD.
    assert PERIOD % MIN_GAP == 0 and PERIOD // MIN_GAP > 2 * 16 + 1
    assert placement.MIN_BYTES >= MIN_GAP
