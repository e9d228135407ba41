// The optimizer kernels, written once over a vector "ISA" type V that provides W-lane fp32 vectors
// and loads/stores of fp32, bf16 and fp16 storage. Each *_<isa>.cpp defines V and includes this
// file inside its own namespace, so the same source is compiled once per instruction set.
//
// Every kernel processes W elements per iteration; the last partial block is staged through small
// zero-padded stack buffers so the body is the one code path for all elements (no separate scalar
// tail that could round differently).
//
// Included inside namespace ds::optim::<isa>; V must be defined before inclusion.

struct F32 {
  using T = float;
  static constexpr DType kind = DType::kF32;
};
struct BF16 {
  using T = uint16_t;
  static constexpr DType kind = DType::kBF16;
};
struct F16 {
  using T = uint16_t;
  static constexpr DType kind = DType::kF16;
};
struct NoOut {
  using T = uint16_t;  // never touched
  static constexpr DType kind = DType::kNone;
};

constexpr int W = V::W;

// Calls body(i, p, g, s1, s2, o) for every W-block of [begin, end): pointers address W elements.
// Always inlined into the kernel: the body's constants are then registers of one function. Called
// out of line, the body reads them through its closure, and since the vector stores may alias
// anything, the compiler reloads every constant from memory in every iteration.
template <class P, class G, class S, class L, class Body>
__attribute__((always_inline)) inline void for_blocks(const Buffers& b, int64_t begin,
                                                      int64_t end, bool has_s2, Body&& body) {
  auto* p = static_cast<typename P::T*>(b.param);
  auto* g = static_cast<const typename G::T*>(b.grad);
  auto* s1 = static_cast<typename S::T*>(b.state1);
  auto* s2 = static_cast<typename S::T*>(b.state2);
  auto* o = static_cast<typename L::T*>(b.lowp);
  int64_t i = begin;
  for (; i + W <= end; i += W) {
    body(p + i, g + i, s1 + i, has_s2 ? s2 + i : nullptr, o ? o + i : nullptr);
  }
  const int64_t rem = end - i;
  if (rem <= 0) return;
  typename P::T tp[W] = {};
  typename G::T tg[W] = {};
  typename S::T ts1[W] = {};
  typename S::T ts2[W] = {};
  typename L::T to[W] = {};
  for (int64_t k = 0; k < rem; ++k) {
    tp[k] = p[i + k];
    tg[k] = g[i + k];
    ts1[k] = s1[i + k];
    if (has_s2) ts2[k] = s2[i + k];
  }
  body(tp, tg, ts1, has_s2 ? ts2 : nullptr, o ? to : nullptr);
  for (int64_t k = 0; k < rem; ++k) {
    p[i + k] = tp[k];
    s1[i + k] = ts1[k];
    if (has_s2) s2[i + k] = ts2[k];
    if (o) o[i + k] = to[k];
  }
}

template <class D>
inline typename V::reg load(const typename D::T* x) {
  if constexpr (D::kind == DType::kF32) return V::load_f32(x);
  else if constexpr (D::kind == DType::kBF16) return V::load_bf16(x);
  else return V::load_f16(x);
}

template <class D>
inline void store(typename D::T* x, typename V::reg v) {
  if constexpr (D::kind == DType::kF32) V::store_f32(x, v);
  else if constexpr (D::kind == DType::kBF16) V::store_bf16(x, v);
  else if constexpr (D::kind == DType::kF16) V::store_f16(x, v);
}

// Low-precision params (bf16/fp16): sqrt and division cost more than the memory traffic of a
// 2-byte element, so the update takes the hardware estimates (V::rough_sqrt, V::rough_div; the
// bound on what they leave in the stored param is in adam_typed; V::fast_sqrt / V::fast_div add
// one Newton step each, about 2^-21 relative, where a step size of 0 needs the unfolded form) and
// folds the step size into the denominator:
//   p - step * m / (sqrt(v) * a + eps)  =  p + m / (sqrt(v) * (a / -step) + eps / -step),
// one fma instead of a multiply per element. The moments are formed as m + (1-b1) * (g - m) and
// v + (1-b2) * (g*g - v), which take one operation fewer than b1*m + (1-b1)*g; they differ from
// it by fp32 rounding only, which the 2-byte storage absorbs. fp32 params always take the
// correctly rounded sqrt and division and the textbook forms (parity with torch within 1e-6).
//
// The folded form needs a finite 1 / step: a step size of 0 (a warm-up schedule's first step),
// or one so small that its reciprocal overflows, takes the unfolded form.
struct Folded {
  float a = 0.f, b = 0.f;
  bool ok = false;
};
inline Folded fold(float scale, float addend, float neg_step) {
  Folded f;
  if (neg_step == 0.f) return f;
  f.a = scale / neg_step;
  f.b = addend / neg_step;
  f.ok = std::isfinite(f.a) && std::isfinite(f.b);
  return f;
}

template <class P, class G, class S, class L>
void adam_typed(const AdamConfig& c, const Buffers& b, int64_t begin, int64_t end) {
  using R = typename V::reg;
  const R b1 = V::set1(c.beta1), omb1 = V::set1(c.one_minus_beta1);
  const R b2 = V::set1(c.beta2), omb2 = V::set1(c.one_minus_beta2);
  const R eps = V::set1(c.eps), wd = V::set1(c.weight_decay);
  const R decay = V::set1(c.decay);
  const R neg_step = V::set1(-c.step_size), ibc2 = V::set1(c.inv_sqrt_bc2);
  const bool l2 = !c.adamw_mode && c.weight_decay != 0.f;
  const bool decoupled = c.adamw_mode && c.weight_decay != 0.f;
  if constexpr (P::kind == DType::kF32) {
    for_blocks<P, G, S, L>(b, begin, end, true, [&](auto* p, auto* g, auto* m, auto* v, auto* o) {
      R pv = load<P>(p);
      R gv = load<G>(g);
      if (l2) gv = V::fma(wd, pv, gv);
      R mv = V::fma(b1, load<S>(m), V::mul(omb1, gv));
      R vv = V::fma(b2, load<S>(v), V::mul(V::mul(omb2, gv), gv));
      if (decoupled) pv = V::mul(pv, decay);
      pv = V::fma(neg_step, V::div(mv, V::fma(V::sqrt(vv), ibc2, eps)), pv);
      store<P>(p, pv);
      store<S>(m, mv);
      store<S>(v, vv);
      if constexpr (L::kind != DType::kNone) store<L>(o, pv);
    });
  } else {
    const Folded f = fold(c.inv_sqrt_bc2, c.eps, -c.step_size);
    const R fa = V::set1(f.a), fb = V::set1(f.b);
    // The per-call choices (decay mode, folded form) become template constants, so the loop
    // carries no tests and no register copies for the paths it does not take.
    auto run = [&](auto l2_c, auto decoupled_c, auto folded_c) {
      constexpr bool kL2 = decltype(l2_c)::value, kDecoupled = decltype(decoupled_c)::value;
      constexpr bool kFolded = decltype(folded_c)::value;
      for_blocks<P, G, S, L>(b, begin, end, true, [&](auto* p, auto* g, auto* m, auto* v, auto*) {
        R pv = load<P>(p);
        R gv = load<G>(g);
        if constexpr (kL2) gv = V::fma(wd, pv, gv);
        const R m0 = load<S>(m), v0 = load<S>(v);
        const R mv = V::fma(omb1, V::sub(gv, m0), m0);
        const R vv = V::fma(omb2, V::fmsub(gv, gv, v0), v0);
        // sqrt and quotient from the hardware estimates alone, for bf16 and fp16 params alike
        // (V::rough_sqrt, V::rough_div: each under 2^-14 relative where the ISA has 14-bit
        // estimates, exact or refined elsewhere), so the update u is within about 2^-13 relative.
        // The error that matters is the one in the stored parameter p' = round(p + u), not in u:
        // half an ulp of p' is at least 2^-12 |p'| in fp16 (2^-9 |p'| in bf16; more for
        // subnormal p'). For |u| <= 2 |p'| (bf16: 16 |p'|) the perturbation 2^-13 |u| is below
        // half an ulp of p': the stored value is the correctly rounded one or, when p + u lies
        // within 2^-13 |u| of a rounding tie, its neighbour, one ulp off, like any fp32 rounding
        // before the store. For |u| > 2 |p'| the update nearly cancels the param,
        // |p| >= |u| - |p'| > |u| / 2, and the perturbation is below 2^-12 |p|, at most half an
        // ulp of p. Either way a step's error stays below half an ulp of the larger of the old
        // and the new param. (The unfolded form below is rare and keeps the refined quotient.)
        const R root = V::rough_sqrt(vv);
        R q;
        if constexpr (kFolded) q = V::rough_div(mv, V::fma(root, fa, fb));
        else q = V::mul(neg_step, V::fast_div(mv, V::fma(root, ibc2, eps)));
        pv = kDecoupled ? V::fma(pv, decay, q) : V::add(pv, q);
        store<P>(p, pv);
        store<S>(m, mv);
        store<S>(v, vv);
      });
    };
    using T = std::true_type;
    using F = std::false_type;
    if (f.ok) {
      if (l2) run(T{}, F{}, T{});
      else if (decoupled) run(F{}, T{}, T{});
      else run(F{}, F{}, T{});
    } else {
      if (l2) run(T{}, F{}, F{});
      else if (decoupled) run(F{}, T{}, F{});
      else run(F{}, F{}, F{});
    }
  }
}

template <class P, class G, class S, class L>
void adagrad_typed(const AdagradConfig& c, const Buffers& b, int64_t begin, int64_t end) {
  using R = typename V::reg;
  const R eps = V::set1(c.eps), wd = V::set1(c.weight_decay), neg_lr = V::set1(-c.lr);
  const bool l2 = c.weight_decay != 0.f;
  if constexpr (P::kind == DType::kF32) {
    for_blocks<P, G, S, L>(b, begin, end, false, [&](auto* p, auto* g, auto* s, auto*, auto* o) {
      R pv = load<P>(p);
      R gv = load<G>(g);
      if (l2) gv = V::fma(wd, pv, gv);
      R sv = V::fma(gv, gv, load<S>(s));
      pv = V::fma(neg_lr, V::div(gv, V::add(V::sqrt(sv), eps)), pv);
      store<P>(p, pv);
      store<S>(s, sv);
      if constexpr (L::kind != DType::kNone) store<L>(o, pv);
    });
  } else {
    // Same folding as Adam's: p + g / (sqrt(s) / -lr + eps / -lr), and the same estimates for
    // sqrt and quotient (the bound in adam_typed holds for this update u as well).
    const Folded f = fold(1.f, c.eps, -c.lr);
    const R fa = V::set1(f.a), fb = V::set1(f.b);
    auto run = [&](auto l2_c, auto folded_c) {
      constexpr bool kL2 = decltype(l2_c)::value, kFolded = decltype(folded_c)::value;
      for_blocks<P, G, S, L>(b, begin, end, false, [&](auto* p, auto* g, auto* s, auto*, auto*) {
        R pv = load<P>(p);
        R gv = load<G>(g);
        if constexpr (kL2) gv = V::fma(wd, pv, gv);
        const R sv = V::fma(gv, gv, load<S>(s));
        const R root = V::rough_sqrt(sv);
        R q;
        if constexpr (kFolded) q = V::rough_div(gv, V::fma(root, fa, fb));
        else q = V::mul(neg_lr, V::fast_div(gv, V::add(root, eps)));
        store<P>(p, V::add(pv, q));
        store<S>(s, sv);
      });
    };
    using T = std::true_type;
    using F = std::false_type;
    if (f.ok) {
      if (l2) run(T{}, T{});
      else run(F{}, T{});
    } else {
      if (l2) run(T{}, F{});
      else run(F{}, F{});
    }
  }
}

template <class P, class G, class S, class L>
void lion_typed(const LionConfig& c, const Buffers& b, int64_t begin, int64_t end) {
  using R = typename V::reg;
  const R b1 = V::set1(c.beta1), omb1 = V::set1(c.one_minus_beta1);
  const R b2 = V::set1(c.beta2), omb2 = V::set1(c.one_minus_beta2);
  const R neg_lr = V::set1(-c.lr), neg_lr_wd = V::set1(-c.lr_wd);
  for_blocks<P, G, S, L>(b, begin, end, false, [&](auto* p, auto* g, auto* m, auto*, auto* o) {
    R pv = load<P>(p);
    R gv = load<G>(g);
    R mv = load<S>(m);
    R dir = V::sign(V::fma(b1, mv, V::mul(omb1, gv)));
    pv = V::add(pv, V::fma(neg_lr, dir, V::mul(neg_lr_wd, pv)));
    mv = V::fma(b2, mv, V::mul(omb2, gv));
    store<P>(p, pv);
    store<S>(m, mv);
    if constexpr (L::kind != DType::kNone) store<L>(o, pv);
  });
}

// Type dispatch: one instantiation per supported combination (see ds::optim::supported).
template <template <class, class, class, class> class K, class Cfg>
void dispatch(const Cfg& c, const Types& t, const Buffers& b, int64_t begin, int64_t end) {
  auto low = [&](auto p, auto g, auto s) {
    using P = decltype(p);
    using G = decltype(g);
    using S = decltype(s);
    switch (t.lowp) {
      case DType::kNone: return K<P, G, S, NoOut>::run(c, b, begin, end);
      case DType::kBF16: return K<P, G, S, BF16>::run(c, b, begin, end);
      case DType::kF16: return K<P, G, S, F16>::run(c, b, begin, end);
      default: break;
    }
  };
  auto lowp_param = [&](auto p) {
    using P = decltype(p);
    const bool g32 = t.grad == DType::kF32, s32 = t.state == DType::kF32;
    if (g32 && s32) return K<P, F32, F32, NoOut>::run(c, b, begin, end);
    if (g32) return K<P, F32, P, NoOut>::run(c, b, begin, end);
    if (s32) return K<P, P, F32, NoOut>::run(c, b, begin, end);
    return K<P, P, P, NoOut>::run(c, b, begin, end);
  };
  switch (t.param) {
    case DType::kF32: return low(F32{}, F32{}, F32{});
    case DType::kBF16: return lowp_param(BF16{});
    case DType::kF16: return lowp_param(F16{});
    default: break;
  }
}

template <class P, class G, class S, class L>
struct AdamK {
  static void run(const AdamConfig& c, const Buffers& b, int64_t s, int64_t e) {
    adam_typed<P, G, S, L>(c, b, s, e);
  }
};
template <class P, class G, class S, class L>
struct AdagradK {
  static void run(const AdagradConfig& c, const Buffers& b, int64_t s, int64_t e) {
    adagrad_typed<P, G, S, L>(c, b, s, e);
  }
};
template <class P, class G, class S, class L>
struct LionK {
  static void run(const LionConfig& c, const Buffers& b, int64_t s, int64_t e) {
    lion_typed<P, G, S, L>(c, b, s, e);
  }
};

void adam_range(const AdamConfig& c, const Types& t, const Buffers& b, int64_t s, int64_t e) {
  dispatch<AdamK>(c, t, b, s, e);
}
void adagrad_range(const AdagradConfig& c, const Types& t, const Buffers& b, int64_t s,
                   int64_t e) {
  dispatch<AdagradK>(c, t, b, s, e);
}
void lion_range(const LionConfig& c, const Types& t, const Buffers& b, int64_t s, int64_t e) {
  dispatch<LionK>(c, t, b, s, e);
}

// Integer lanes so every element width streams the same way; the compiler vectorises this loop to
// the file's ISA width.
template <class U>
void stream_typed(U* a, const U* b, U* c, U* d, int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; ++i) {
    U x = b[i];
    a[i] = static_cast<U>(a[i] + x);
    c[i] = static_cast<U>(c[i] ^ x);
    d[i] = static_cast<U>(d[i] + x);
  }
}

void stream_range(void* a, const void* b, void* c, void* d, int64_t begin, int64_t end,
                  int elem_bytes) {
  if (elem_bytes == 4) {
    stream_typed(static_cast<uint32_t*>(a), static_cast<const uint32_t*>(b),
                 static_cast<uint32_t*>(c), static_cast<uint32_t*>(d), begin, end);
  } else {
    stream_typed(static_cast<uint16_t*>(a), static_cast<const uint16_t*>(b),
                 static_cast<uint16_t*>(c), static_cast<uint16_t*>(d), begin, end);
  }
}
