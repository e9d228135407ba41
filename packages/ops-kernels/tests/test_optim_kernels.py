"""The fused CPU optimizer kernels (ds.ops.cpu_optim) against torch.optim and float64 references:
100 steps on random data, sizes 1 to 10^6+17, fp32/bf16/fp16 params and states, every SIMD variant
this CPU runs, lists vs single tensors, thread counts, rounding, and argument errors."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from ds.interfaces.errors import KernelError
from ds.ops import _C, cpu_optim

SMALL = [1, 7, 1023, 4096 + 3]
BIG = 10**6 + 17
STEPS = 100


def _simd_levels() -> list[str]:
    order = ["scalar", "neon", "avx2", "avx512", "avx512_bf16"]
    best = order.index(_C.detected_simd_level())
    return [lvl for lvl in _C.simd_levels_built().split(",") if order.index(lvl) <= best]


LEVELS = _simd_levels()
# Every SIMD variant on the small sizes; the large size (10^6+17) on the variant in use, which
# keeps the suite's runtime modest.
SIZED = [(lvl, n) for lvl in LEVELS for n in SMALL] + [(_C.simd_level(), BIG)]
SIZED_SMALL = [(lvl, n) for lvl in LEVELS for n in SMALL]


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(params=LEVELS)
def simd(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test once per SIMD variant this CPU can execute."""
    before = _C.simd_level()
    assert _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(before)


@pytest.fixture
def level(request: pytest.FixtureRequest) -> Iterator[str]:
    """The SIMD variant named by a test's ``level`` parameter, restored afterwards."""
    before = _C.simd_level()
    assert _C.set_simd_level(request.param)
    yield request.param
    _C.set_simd_level(before)


def adam_ref(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    step: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
    adamw: bool,
    bias_correction: bool = True,
    compute: torch.dtype = torch.float64,
) -> None:
    p64, g64, m64, v64 = (t.to(compute) for t in (p, g, m, v))
    if not adamw and wd:
        g64 = g64 + wd * p64
    m64 = beta1 * m64 + (1 - beta1) * g64
    v64 = beta2 * v64 + (1 - beta2) * g64 * g64
    bc1 = 1 - beta1**step if bias_correction else 1.0
    bc2 = 1 - beta2**step if bias_correction else 1.0
    if adamw and wd:
        p64 = p64 * (1 - lr * wd)
    p64 = p64 - (lr / bc1) * m64 / (v64.sqrt() / bc2**0.5 + eps)
    p.copy_(p64)
    m.copy_(m64)
    v.copy_(v64)


def adagrad_ref(
    p: torch.Tensor, g: torch.Tensor, s: torch.Tensor, lr: float, eps: float, wd: float
) -> None:
    p64, g64, s64 = (t.double() for t in (p, g, s))
    if wd:
        g64 = g64 + wd * p64
    s64 = s64 + g64 * g64
    p64 = p64 - lr * g64 / (s64.sqrt() + eps)
    p.copy_(p64)
    s.copy_(s64)


def lion_ref(
    p: torch.Tensor,
    g: torch.Tensor,
    m: torch.Tensor,
    lr: float,
    beta1: float,
    beta2: float,
    wd: float,
) -> torch.Tensor:
    """Updates in place; returns |b1*m + (1-b1)*g| (how close each sign decision was to 0)."""
    p64, g64, m64 = (t.double() for t in (p, g, m))
    c = beta1 * m64 + (1 - beta1) * g64
    p64 = p64 * (1 - lr * wd) - lr * torch.sign(c)
    m64 = beta2 * m64 + (1 - beta2) * g64
    p.copy_(p64)
    m.copy_(m64)
    return c.abs()


LP_DTYPES = [torch.bfloat16, torch.float16]


def _close_fp32(got: torch.Tensor, want: torch.Tensor) -> None:
    # 1e-6 relative to the tensor's scale (elements that cross zero have no own scale).
    scale = float(want.abs().max()) or 1.0
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * scale)


def _close_lowp(got: torch.Tensor, want: torch.Tensor, steps: int = STEPS) -> None:
    # Kernel (fp32 math) and reference (fp64 math) round to the same storage dtype each step.
    # Near a rounding tie they may land one unit in the last place (ulp) apart; from then on the
    # two sequences round independently, so the gap may grow by at most one ulp per step. Bound:
    # steps ulps per element; and nearly every element must agree exactly.
    eps = torch.finfo(got.dtype).eps
    scale = float(want.float().abs().max()) or 1.0
    torch.testing.assert_close(
        got.float(), want.float(), rtol=steps * eps, atol=steps * eps * scale * 1e-3
    )
    exact = float((got == want).float().mean())
    assert exact >= 0.95, f"only {exact:.4f} of elements equal the reference exactly"


# -- fp32 parity with torch.optim ------------------------------------------------------------------


@pytest.mark.parametrize(("level", "size"), SIZED, indirect=["level"])
@pytest.mark.parametrize("adamw_mode", [True, False])
def test_adam_fp32_matches_torch(level: str, size: int, adamw_mode: bool) -> None:
    torch.manual_seed(size)
    lr, wd = 1e-3, 0.05
    p = torch.randn(size)
    m, v = torch.zeros(size), torch.zeros(size)
    ref = torch.nn.Parameter(p.clone())
    cls = torch.optim.AdamW if adamw_mode else torch.optim.Adam
    opt = cls([ref], lr=lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=wd)
    for step in range(1, STEPS + 1):
        g = torch.randn(size)
        cpu_optim.adam_step(p, g, m, v, step=step, lr=lr, weight_decay=wd, adamw_mode=adamw_mode)
        ref.grad = g
        opt.step()
    _close_fp32(p, ref.detach())
    _close_fp32(m, opt.state[ref]["exp_avg"])
    _close_fp32(v, opt.state[ref]["exp_avg_sq"])


@pytest.mark.parametrize(("level", "size"), SIZED, indirect=["level"])
def test_adagrad_fp32_matches_torch(level: str, size: int) -> None:
    torch.manual_seed(size)
    lr, wd = 1e-2, 0.01
    p = torch.randn(size)
    s = torch.zeros(size)
    ref = torch.nn.Parameter(p.clone())
    opt = torch.optim.Adagrad([ref], lr=lr, eps=1e-10, weight_decay=wd)
    for _ in range(STEPS):
        g = torch.randn(size)
        cpu_optim.adagrad_step(p, g, s, lr=lr, eps=1e-10, weight_decay=wd)
        ref.grad = g
        opt.step()
    _close_fp32(p, ref.detach())
    _close_fp32(s, opt.state[ref]["sum"])


@pytest.mark.parametrize(("level", "size"), SIZED, indirect=["level"])
def test_lion_fp32_matches_float64_reference(level: str, size: int) -> None:
    torch.manual_seed(size)
    lr, b1, b2, wd = 1e-4, 0.9, 0.99, 0.1
    p = torch.randn(size)
    m = torch.zeros(size)
    rp, rm = p.clone(), m.clone()
    for _ in range(STEPS):
        g = torch.randn(size)
        cpu_optim.lion_step(p, g, m, lr=lr, beta1=b1, beta2=b2, weight_decay=wd)
        lion_ref(rp, g, rm, lr, b1, b2, wd)
    _close_fp32(m, rm)
    # sign() of an interpolation within fp32 rounding of zero may be decided differently by fp32
    # and fp64 arithmetic; such an element is 2*lr off. Everything else is within 1e-6.
    bad = (p - rp).abs() > 1e-6 * float(rp.abs().max())
    assert int(bad.sum()) <= 5
    if bool(bad.any()):
        assert float((p - rp)[bad].abs().max()) <= 2 * lr * 2 + 1e-6


# -- low-precision params and state ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("level", "size", "dtype"),
    [(lvl, n, dt) for lvl, n in SIZED_SMALL for dt in LP_DTYPES]
    + [(_C.simd_level(), BIG, torch.bfloat16)],
    indirect=["level"],
)
def test_adam_low_precision_params_fp32_state(level: str, size: int, dtype: torch.dtype) -> None:
    _adam_lowp(dtype, size, grad_dtype=dtype, state_dtype=torch.float32)


@pytest.mark.parametrize("dtype", LP_DTYPES)
@pytest.mark.parametrize("grad_fp32", [True, False])
@pytest.mark.parametrize("state_fp32", [True, False])
def test_adam_low_precision_dtype_combinations(
    simd: str, dtype: torch.dtype, grad_fp32: bool, state_fp32: bool
) -> None:
    _adam_lowp(
        dtype,
        4096 + 3,
        grad_dtype=torch.float32 if grad_fp32 else dtype,
        state_dtype=torch.float32 if state_fp32 else dtype,
    )


def _adam_lowp(
    dtype: torch.dtype, size: int, grad_dtype: torch.dtype, state_dtype: torch.dtype
) -> None:
    torch.manual_seed(size)
    lr, wd = 1e-2, 0.01
    p = torch.randn(size).to(dtype)
    m, v = torch.zeros(size, dtype=state_dtype), torch.zeros(size, dtype=state_dtype)
    rp, rm, rv = p.clone(), m.clone(), v.clone()
    for step in range(1, STEPS + 1):
        g = torch.randn(size).to(grad_dtype)
        cpu_optim.adam_step(p, g, m, v, step=step, lr=lr, weight_decay=wd)
        # fp32 math is far more precise than the bf16/fp16 storage, and cheaper on 10^6 elements
        adam_ref(rp, g, rm, rv, step, lr, 0.9, 0.999, 1e-8, wd, adamw=True, compute=torch.float32)
    assert p.dtype == dtype and m.dtype == state_dtype
    _close_lowp(p, rp)
    if state_dtype == torch.float32:
        _close_fp32(m, rm)
    else:
        _close_lowp(m, rm)


@pytest.mark.parametrize("dtype", LP_DTYPES)
def test_adagrad_and_lion_low_precision(simd: str, dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    n = 4096 + 3
    p = torch.randn(n).to(dtype)
    s = torch.zeros(n, dtype=dtype)
    rp, rs = p.clone(), s.clone()
    q = torch.randn(n).to(dtype)
    m = torch.zeros(n)
    rq, rm = q.clone(), m.clone()
    for _ in range(STEPS):
        g = torch.randn(n).to(dtype)
        cpu_optim.adagrad_step(p, g, s, lr=1e-2, eps=1e-10, weight_decay=0.0)
        adagrad_ref(rp, g, rs, 1e-2, 1e-10, 0.0)
        cpu_optim.lion_step(q, g, m, lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.0)
        lion_ref(rq, g, rm, 1e-2, 0.9, 0.99, 0.0)
    _close_lowp(p, rp)
    _close_lowp(s, rs)
    _close_lowp(q, rq)


@pytest.mark.parametrize("dtype", LP_DTYPES)
@pytest.mark.parametrize("lr", [0.0, 1e-45])
def test_low_precision_zero_or_tiny_step_size(simd: str, dtype: torch.dtype, lr: float) -> None:
    # The low-precision update divides by the step size's reciprocal; a step size of 0 (warm-up
    # schedules start there) or one whose reciprocal overflows takes the unfolded form: params
    # stay finite and unchanged (the update is below half an ulp), moments still move.
    torch.manual_seed(3)
    n = 1000
    p = torch.randn(n).to(dtype)
    before = p.clone()
    m, v = torch.zeros(n, dtype=dtype), torch.zeros(n, dtype=dtype)
    a, s = p.clone(), torch.zeros(n, dtype=dtype)
    for step in range(1, 4):
        g = torch.randn(n).to(dtype)
        cpu_optim.adam_step(p, g, m, v, step=step, lr=lr, weight_decay=0.1)
        cpu_optim.adagrad_step(a, g, s, lr=lr, weight_decay=0.1)
    assert torch.equal(p, before)
    assert torch.equal(a, before)
    assert bool(m.ne(0).any()) and bool(v.gt(0).any()) and bool(s.gt(0).any())


# -- fused low-precision copy and dtype conversions -------------------------------------------------


@pytest.mark.parametrize("dtype", LP_DTYPES)
def test_low_precision_copy_equals_torch_rounding(simd: str, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    n = 10_007
    p = torch.randn(n) * 3
    m, v = torch.zeros(n), torch.zeros(n)
    low = torch.empty(n, dtype=dtype)
    for step in range(1, 4):
        cpu_optim.adam_step(p, torch.randn(n), m, v, step=step, lr=1e-2, low_precision_out=low)
        assert torch.equal(low, p.to(dtype))


def _special_values() -> torch.Tensor:
    f32 = torch.finfo(torch.float32)
    vals = [0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"), 65504.0, 65519.0, 65520.0, 1e5]
    vals += [6.1e-5, 6.0e-8, 3.0e-8, 2.9e-8, 1e-40, f32.max, f32.tiny, 1.0 + 2**-8, 1.0 + 2**-9]
    vals += [1.0 + 3 * 2**-9, 1.0 + 2**-11, 1.0 + 3 * 2**-11, 0.1, 1 / 3, -2.5e-6]
    x = torch.tensor(vals, dtype=torch.float32)
    return torch.cat([x, torch.randn(1000) * 1e3, torch.randn(1000) * 1e-6])


@pytest.mark.parametrize("dtype", LP_DTYPES)
def test_rounding_of_special_values_matches_torch(simd: str, dtype: torch.dtype) -> None:
    # lr = 0 and zero grads leave params unchanged, so the copy is a pure fp32 -> dtype rounding.
    p = _special_values()
    n = p.numel()
    low = torch.empty(n, dtype=dtype)
    cpu_optim.adam_step(
        p, torch.zeros(n), torch.zeros(n), torch.zeros(n), step=1, lr=0.0, low_precision_out=low
    )
    assert torch.equal(low, p.to(dtype))
    # NaN stays NaN.
    nan = torch.full((33,), float("nan"))
    low = torch.empty(33, dtype=dtype)
    cpu_optim.adam_step(
        nan,
        torch.zeros(33),
        torch.zeros(33),
        torch.zeros(33),
        step=1,
        lr=0.0,
        low_precision_out=low,
    )
    assert bool(low.isnan().all())


def test_bf16_stores_of_vectors_with_zeros_and_subnormals_match_torch(simd: str) -> None:
    # The bf16 store converts 32 lanes at once and re-checks only vectors with a zero result lane
    # (a zero input, or a subnormal the conversion flushed): cover each kind of vector, with the
    # odd lane in each half of the 32, for the params' low-precision copy and for bf16 state.
    tiny = torch.finfo(torch.float32).tiny
    blocks = []
    for lane in (3, 17, 31):
        normal = torch.randn(32) + 4.0
        with_zero = normal.clone()
        with_zero[lane] = 0.0
        with_sub = normal.clone()
        with_sub[lane] = tiny / 3
        with_both = with_sub.clone()
        with_both[(lane + 9) % 32] = -0.0
        only_sub = torch.full((32,), -tiny / 7)
        blocks += [normal, with_zero, with_sub, with_both, only_sub]
    x = torch.cat(blocks)
    n = x.numel()
    low = torch.empty(n, dtype=torch.bfloat16)
    p = x.clone()
    cpu_optim.adam_step(
        p, torch.zeros(n), torch.zeros(n), torch.zeros(n), step=1, lr=0.0, low_precision_out=low
    )
    assert torch.equal(low.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    # bf16 state: with beta1 = 0 and beta2 = 0 the new moments are g and g^2, rounded on store.
    g = x.to(torch.bfloat16)
    pb = torch.ones(n, dtype=torch.bfloat16)
    m, v = torch.zeros(n, dtype=torch.bfloat16), torch.zeros(n, dtype=torch.bfloat16)
    cpu_optim.adam_step(pb, g, m, v, step=1, lr=0.0, beta1=0.0, beta2=0.0)
    # (values, not bits: m = 0 + (g - 0) turns -0 into +0, as b1*m + (1-b1)*g does in torch)
    assert torch.equal(m, g)
    assert bool((m != 0).sum() == (g != 0).sum() > 0)
    assert torch.equal(v, (g.float() * g.float()).to(torch.bfloat16))


@pytest.mark.parametrize("dtype", LP_DTYPES)
def test_low_precision_params_round_trip_unchanged(simd: str, dtype: torch.dtype) -> None:
    p = _special_values().to(dtype)
    p = p[p.isfinite()].contiguous()
    before = p.clone()
    n = p.numel()
    z = torch.zeros(n, dtype=dtype)
    cpu_optim.adam_step(p, z, z.clone(), z.clone(), step=1, lr=0.0)
    assert torch.equal(p, before)


# -- lists, threads --------------------------------------------------------------------------------


def _tensors(sizes: list[int], seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(dtype) for s in sizes]


LIST_SIZES = [1, 7, 1023, 4099, 65, 0, 100_003, 33, 70_000, 5]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_list_call_equals_per_tensor_calls(simd: str, dtype: torch.dtype) -> None:
    ps, gs = _tensors(LIST_SIZES, 1, dtype), _tensors(LIST_SIZES, 2, dtype)
    ms, vs = _tensors(LIST_SIZES, 3), [t.abs() for t in _tensors(LIST_SIZES, 4)]
    qs, ns, ws = [t.clone() for t in ps], [t.clone() for t in ms], [t.clone() for t in vs]
    kw = {"step": 3, "lr": 1e-2, "weight_decay": 0.1}
    cpu_optim.adam_step(ps, gs, ms, vs, **kw)
    for q, g, n, w in zip(qs, gs, ns, ws, strict=True):
        cpu_optim.adam_step(q, g, n, w, **kw)
    for a, b in zip(ps + ms + vs, qs + ns + ws, strict=True):
        assert torch.equal(a, b)


def test_one_and_two_threads_give_identical_results() -> None:
    # Element-wise kernels: the split across threads must not change a single bit.
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            ps, gs = _tensors(LIST_SIZES, 5), _tensors(LIST_SIZES, 6)
            ms = [torch.zeros_like(p) for p in ps]
            low = [torch.empty_like(p, dtype=torch.float16) for p in ps]
            for step in range(1, 4):
                cpu_optim.lion_step(ps, gs, ms, lr=1e-3)
                cpu_optim.adam_step(
                    ps, gs, ms, [m.abs() for m in ms], step=step, lr=1e-3, low_precision_out=low
                )
            assert _C.get_num_threads() == threads
            results.append(ps + ms + low)
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert torch.equal(a, b)


def test_bandwidth_reference_kernel_traffic_pattern() -> None:
    a, b = torch.arange(1000, dtype=torch.int32), torch.full((1000,), 3, dtype=torch.int32)
    a, b = a.view(torch.float32), b.view(torch.float32)
    c, d = a.clone(), a.clone()
    cpu_optim.stream_4r3w(a, b, c, d)
    ai = a.view(torch.int32)
    assert torch.equal(ai, torch.arange(1000, dtype=torch.int32) + 3)
    assert torch.equal(c.view(torch.int32), torch.arange(1000, dtype=torch.int32) ^ 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("threads", [1, 2])
def test_bandwidth_reference_over_lists_matches_single_calls(
    dtype: torch.dtype, threads: int
) -> None:
    itype = torch.int32 if dtype == torch.float32 else torch.int16
    sizes = [1, 63, 64, 40000, 7, 33000, 0, 129]  # a split across threads lands inside tensors
    gen = torch.Generator().manual_seed(3)

    def rand(n: int) -> torch.Tensor:
        return torch.randint(-(2**14), 2**14, (n,), generator=gen, dtype=itype)

    lists = [[rand(n) for n in sizes] for _ in range(4)]
    before_a = [t.clone() for t in lists[0]]
    expect = [[t.clone() for t in ts] for ts in lists]
    for a, b, c, d in zip(*expect, strict=True):
        cpu_optim.stream_4r3w(a.view(dtype), b.view(dtype), c.view(dtype), d.view(dtype))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        cpu_optim.stream_4r3w(*([t.view(dtype) for t in ts] for ts in lists))
    finally:
        torch.set_num_threads(before)
    for got, want in zip(lists, expect, strict=True):
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)
    # a += b in the integer lanes, for every tensor of the list (the call did write)
    for a, a0, b in zip(lists[0], before_a, lists[1], strict=True):
        assert torch.equal(a, (a0 + b).to(itype))


def test_bandwidth_reference_over_lists_rejects_mixed_dtypes() -> None:
    f, h = torch.zeros(4), torch.zeros(4, dtype=torch.bfloat16)
    with pytest.raises(KernelError, match="share one dtype"):
        cpu_optim.stream_4r3w([f], [f], [h], [h])
    with pytest.raises(KernelError, match="elements"):
        cpu_optim.stream_4r3w([f], [torch.zeros(5)], [f], [f])


# -- errors ----------------------------------------------------------------------------------------


def _adam(*tensors: object, **kw: object) -> None:
    args = {"step": 1, "lr": 1e-3, **kw}
    cpu_optim.adam_step(*tensors, **args)  # type: ignore[arg-type]


def _z(n: int = 8, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.zeros(n, dtype=dtype)


@pytest.mark.parametrize("as_list", [False, True])
def test_rejects_grad_requiring_tensor(as_list: bool) -> None:
    p = torch.nn.Parameter(_z())
    args = [p, _z(), _z(), _z()]
    with pytest.raises(KernelError, match=r"params\[0\] requires grad.*detach"):
        _adam(*([a] for a in args) if as_list else args)


@pytest.mark.parametrize("as_list", [False, True])
def test_rejects_non_cpu_tensor(as_list: bool) -> None:
    args = [_z(), torch.zeros(8, device="meta"), _z(), _z()]
    with pytest.raises(KernelError, match=r"grads\[0\] is on device meta.*CPU"):
        _adam(*([a] for a in args) if as_list else args)


@pytest.mark.parametrize("as_list", [False, True])
def test_rejects_non_contiguous(as_list: bool) -> None:
    args = [_z(), _z(), torch.zeros(4, 4).t(), _z(16)]
    args[0], args[1] = _z(16), _z(16)
    with pytest.raises(KernelError, match=r"exp_avg\[0\] is not contiguous"):
        _adam(*([a] for a in args) if as_list else args)


@pytest.mark.parametrize("as_list", [False, True])
def test_rejects_size_mismatch(as_list: bool) -> None:
    args = [_z(), _z(), _z(), _z(9)]
    with pytest.raises(KernelError, match=r"exp_avg_sq\[0\] has 9 elements but params\[0\] has 8"):
        _adam(*([a] for a in args) if as_list else args)


@pytest.mark.parametrize("as_list", [False, True])
def test_rejects_unsupported_dtype_combination(as_list: bool) -> None:
    args = [_z(), _z(dtype=torch.bfloat16), _z(), _z()]
    with pytest.raises(KernelError, match="unsupported dtypes: params float32, grads bfloat16"):
        _adam(*([a] for a in args) if as_list else args)
    args = [_z(dtype=torch.bfloat16), _z(dtype=torch.bfloat16), _z(dtype=torch.float16), _z()]
    with pytest.raises(KernelError, match="exp_avg"):
        _adam(*([a] for a in args) if as_list else args)


def test_rejects_other_bad_arguments() -> None:
    with pytest.raises(KernelError, match=r"dtype torch.float64"):
        _adam([_z(dtype=torch.float64)], [_z()], [_z()], [_z()])
    with pytest.raises(KernelError, match="grads has 1 tensors but params has 2"):
        _adam([_z(), _z()], [_z()], [_z(), _z()], [_z(), _z()])
    with pytest.raises(KernelError, match=r"params\[1\] is torch.bfloat16 but params\[0\]"):
        _adam([_z(), _z(dtype=torch.bfloat16)], [_z(), _z()], [_z(), _z()], [_z(), _z()])
    with pytest.raises(KernelError, match="low_precision_out must be bfloat16 or float16"):
        _adam(_z(), _z(), _z(), _z(), low_precision_out=_z())
    with pytest.raises(KernelError, match="step must be >= 1"):
        _adam(_z(), _z(), _z(), _z(), step=0)
    with pytest.raises(KernelError, match=r"not a torch\.Tensor"):
        _adam([_z(), "x"], [_z(), _z()], [_z(), _z()], [_z(), _z()])
    with pytest.raises(KernelError, match="low-precision copy"):
        _adam(
            *(_z(dtype=torch.bfloat16) for _ in range(4)), low_precision_out=_z(dtype=torch.float16)
        )


def _child_step(q: object, x: list[torch.Tensor]) -> None:
    # Only the ds kernel runs on large tensors here: torch's own OpenMP regions are not usable in
    # a child forked after the parent ran them (a libgomp limitation, not ds's).
    cpu_optim.adam_step(*x, step=1, lr=1e-3)
    q.put((_C.get_num_threads(), float(x[0][::1000].sum())))  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_kernels_work_in_a_forked_child_after_the_pool_started() -> None:
    # The child inherits the pool object but not its threads; it must not wait on them.
    import multiprocessing as mp

    torch.set_num_threads(2)
    x = [torch.randn(200_000) for _ in range(4)]
    x[3].abs_()
    want = [t.clone() for t in x]
    cpu_optim.adam_step(*x, step=1, lr=1e-3)  # parent pool running with 2 threads
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    proc = ctx.Process(target=_child_step, args=(q, want))
    proc.start()
    threads, checksum = q.get(timeout=60)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert threads == 2  # the child sized a fresh pool from torch.get_num_threads()
    assert checksum == float(x[0][::1000].sum())  # same update as the parent's
