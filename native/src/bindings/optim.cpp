// Bindings of the optimizer kernels. Tensors arrive through DLPack (t.detach() on the Python
// side) and are updated in place; every argument is checked here so a bad call is a clear
// ValueError (turned into KernelError by ds.ops), never a crash. The GIL is released while the
// kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ds/optim.h"

namespace nb = nanobind;
using ds::optim::Buffers;
using ds::optim::DType;
using ds::optim::Types;

namespace {

using Array = nb::ndarray<>;
using ArrayList = std::vector<Array>;

const char* dtype_name(DType d) {
  switch (d) {
    case DType::kF32: return "float32";
    case DType::kBF16: return "bfloat16";
    case DType::kF16: return "float16";
    default: return "none";
  }
}

[[noreturn]] void fail(const std::string& msg) { throw nb::value_error(msg.c_str()); }

std::string where(const char* name, size_t i) {
  return std::string(name) + "[" + std::to_string(i) + "]";
}

DType dtype_of(const Array& a, const char* name, size_t i) {
  const nb::dlpack::dtype dt = a.dtype();
  if (dt.lanes == 1) {
    if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float)) {
      if (dt.bits == 32) return DType::kF32;
      if (dt.bits == 16) return DType::kF16;
    }
    if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16)
      return DType::kBF16;
  }
  fail(where(name, i) + " has an unsupported dtype; use float32, bfloat16 or float16");
}

bool contiguous(const Array& a) {
  int64_t expected = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(d));
  }
  return true;
}

void check_supported(const Types& t) {
  if (!ds::optim::supported(t))
    fail(std::string("unsupported dtypes: params ") + dtype_name(t.param) + ", grads " +
         dtype_name(t.grad) + ", state " + dtype_name(t.state) + ", low_precision_out " +
         dtype_name(t.lowp) +
         ". fp32 params take fp32 grads and state (low-precision copy bf16/fp16 optional); "
         "bf16/fp16 params take grads and state of their own dtype or fp32, no copy");
}

// Checks one list (device, layout, size, one dtype for the whole list); returns its dtype.
DType check_list(const ArrayList& list, const char* name, const ArrayList& params) {
  if (list.size() != params.size())
    fail(std::string(name) + " has " + std::to_string(list.size()) + " tensors but params has " +
         std::to_string(params.size()) + "; pass one per parameter");
  DType kind = DType::kNone;
  for (size_t i = 0; i < list.size(); ++i) {
    const Array& a = list[i];
    if (a.device_type() != nb::device::cpu::value)
      fail(where(name, i) + " is not a CPU tensor; the native optimizer kernels run on CPU "
           "memory only (move it with .cpu() or use a GPU kernel provider)");
    if (!contiguous(a))
      fail(where(name, i) + " is not contiguous; call .contiguous() on it first");
    if (a.size() != params[i].size())
      fail(where(name, i) + " has " + std::to_string(a.size()) + " elements but params[" +
           std::to_string(i) + "] has " + std::to_string(params[i].size()));
    const DType d = dtype_of(a, name, i);
    if (i == 0) kind = d;
    else if (d != kind)
      fail(where(name, i) + " is " + dtype_name(d) + " but " + name + "[0] is " +
           dtype_name(kind) + "; one call takes one dtype per buffer kind");
  }
  return kind;
}

struct Prepared {
  Types types;
  std::vector<Buffers> buffers;
};

Prepared prepare(const ArrayList& params, const ArrayList& grads, const ArrayList& s1,
                 const ArrayList* s2, const std::optional<ArrayList>& lowp) {
  Prepared out;
  if (params.empty()) return out;
  out.types.param = check_list(params, "params", params);
  out.types.grad = check_list(grads, "grads", params);
  out.types.state = check_list(s1, "state", params);
  if (s2) {
    DType d2 = check_list(*s2, "exp_avg_sq", params);
    if (d2 != out.types.state)
      fail(std::string("exp_avg_sq is ") + dtype_name(d2) + " but exp_avg is " +
           dtype_name(out.types.state) + "; both moments must share a dtype");
  }
  if (lowp) {
    out.types.lowp = check_list(*lowp, "low_precision_out", params);
    if (out.types.lowp == DType::kF32)
      fail("low_precision_out must be bfloat16 or float16, not float32");
  }
  check_supported(out.types);
  out.buffers.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    Buffers& b = out.buffers[i];
    b.param = params[i].data();
    b.grad = grads[i].data();
    b.state1 = s1[i].data();
    b.state2 = s2 ? (*s2)[i].data() : nullptr;
    b.lowp = lowp ? (*lowp)[i].data() : nullptr;
    b.n = static_cast<int64_t>(params[i].size());
  }
  return out;
}

void check_step(int64_t step) {
  if (step < 1) fail("step must be >= 1 (the count of this update, starting at 1)");
}

ds::optim::AdamConfig adam_config(int64_t step, double lr, double beta1, double beta2, double eps,
                                  double weight_decay, bool adamw_mode, bool bias_correction) {
  check_step(step);
  ds::optim::AdamConfig c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.eps = static_cast<float>(eps);
  c.weight_decay = static_cast<float>(weight_decay);
  c.adamw_mode = adamw_mode;
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.decay = static_cast<float>(1.0 - lr * weight_decay);
  // Bias corrections in double: beta^step underflows gracefully and loses nothing.
  const double t = static_cast<double>(step);
  const double bc1 = bias_correction ? 1.0 - std::pow(beta1, t) : 1.0;
  const double bc2 = bias_correction ? 1.0 - std::pow(beta2, t) : 1.0;
  c.step_size = static_cast<float>(lr / bc1);
  c.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(bc2));
  return c;
}

ds::optim::AdagradConfig adagrad_config(double lr, double eps, double weight_decay) {
  ds::optim::AdagradConfig c;
  c.lr = static_cast<float>(lr);
  c.eps = static_cast<float>(eps);
  c.weight_decay = static_cast<float>(weight_decay);
  return c;
}

ds::optim::LionConfig lion_config(double lr, double beta1, double beta2, double weight_decay) {
  ds::optim::LionConfig c;
  c.lr = static_cast<float>(lr);
  c.beta1 = static_cast<float>(beta1);
  c.beta2 = static_cast<float>(beta2);
  c.weight_decay = static_cast<float>(weight_decay);
  c.one_minus_beta1 = static_cast<float>(1.0 - beta1);
  c.one_minus_beta2 = static_cast<float>(1.0 - beta2);
  c.lr_wd = static_cast<float>(lr * weight_decay);
  return c;
}

// Address-list form used by ds.ops for long parameter lists: the Python side has checked every
// tensor (CPU, contiguous, dtype, size) and holds references for the duration of the call;
// converting hundreds of tensors through DLPack one by one would cost more than a small step.
using Ptrs = std::vector<uintptr_t>;

Prepared prepare_ptrs(const std::vector<int>& dtypes, const Ptrs& params, const Ptrs& grads,
                      const Ptrs& s1, const Ptrs* s2, const Ptrs& lowp,
                      const std::vector<int64_t>& numels) {
  if (dtypes.size() != 4) fail("dtypes must hold 4 codes: param, grad, state, low_precision_out");
  for (int d : dtypes)
    if (d < 0 || d > 3) fail("dtype codes are 0 f32, 1 bf16, 2 f16, 3 none");
  const size_t n = params.size();
  if (grads.size() != n || s1.size() != n || (s2 && s2->size() != n) || numels.size() != n ||
      (!lowp.empty() && lowp.size() != n))
    fail("address lists must all have one entry per parameter");
  Prepared out;
  out.types = Types{static_cast<DType>(dtypes[0]), static_cast<DType>(dtypes[1]),
                    static_cast<DType>(dtypes[2]), static_cast<DType>(dtypes[3])};
  if ((out.types.lowp == DType::kNone) != lowp.empty())
    fail("low_precision_out addresses must be given exactly when its dtype is not none");
  check_supported(out.types);
  out.buffers.resize(n);
  for (size_t i = 0; i < n; ++i) {
    Buffers& b = out.buffers[i];
    b.param = reinterpret_cast<void*>(params[i]);
    b.grad = reinterpret_cast<const void*>(grads[i]);
    b.state1 = reinterpret_cast<void*>(s1[i]);
    b.state2 = s2 ? reinterpret_cast<void*>((*s2)[i]) : nullptr;
    b.lowp = lowp.empty() ? nullptr : reinterpret_cast<void*>(lowp[i]);
    b.n = numels[i];
  }
  return out;
}

}  // namespace

void register_optim(nb::module_& m) {
  m.def(
      "adam_step",
      [](const ArrayList& params, const ArrayList& grads, const ArrayList& exp_avg,
         const ArrayList& exp_avg_sq, const std::optional<ArrayList>& lowp, int64_t step,
         double lr, double beta1, double beta2, double eps, double weight_decay, bool adamw_mode,
         bool bias_correction) {
        const ds::optim::AdamConfig c = adam_config(step, lr, beta1, beta2, eps, weight_decay,
                                                    adamw_mode, bias_correction);
        Prepared p = prepare(params, grads, exp_avg, &exp_avg_sq, lowp);
        nb::gil_scoped_release release;
        ds::optim::adam_step(c, p.types, p.buffers);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("exp_avg"), nb::arg("exp_avg_sq"),
      nb::arg("low_precision_out").none(), nb::arg("step"), nb::arg("lr"), nb::arg("beta1"),
      nb::arg("beta2"), nb::arg("eps"), nb::arg("weight_decay"), nb::arg("adamw_mode"),
      nb::arg("bias_correction"),
      "Fused Adam/AdamW step over lists of flat CPU buffers, updated in place.");

  m.def(
      "adagrad_step",
      [](const ArrayList& params, const ArrayList& grads, const ArrayList& state_sum,
         const std::optional<ArrayList>& lowp, double lr, double eps, double weight_decay) {
        Prepared p = prepare(params, grads, state_sum, nullptr, lowp);
        const ds::optim::AdagradConfig c = adagrad_config(lr, eps, weight_decay);
        nb::gil_scoped_release release;
        ds::optim::adagrad_step(c, p.types, p.buffers);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("state_sum"),
      nb::arg("low_precision_out").none(), nb::arg("lr"), nb::arg("eps"),
      nb::arg("weight_decay"), "Fused Adagrad step (lr already decayed), in place.");

  m.def(
      "lion_step",
      [](const ArrayList& params, const ArrayList& grads, const ArrayList& exp_avg,
         const std::optional<ArrayList>& lowp, double lr, double beta1, double beta2,
         double weight_decay) {
        Prepared p = prepare(params, grads, exp_avg, nullptr, lowp);
        const ds::optim::LionConfig c = lion_config(lr, beta1, beta2, weight_decay);
        nb::gil_scoped_release release;
        ds::optim::lion_step(c, p.types, p.buffers);
      },
      nb::arg("params"), nb::arg("grads"), nb::arg("exp_avg"),
      nb::arg("low_precision_out").none(), nb::arg("lr"), nb::arg("beta1"), nb::arg("beta2"),
      nb::arg("weight_decay"), "Fused Lion step, in place.");

  m.def(
      "adam_step_ptrs",
      [](const std::vector<int>& dtypes, const Ptrs& params, const Ptrs& grads,
         const Ptrs& exp_avg, const Ptrs& exp_avg_sq, const Ptrs& lowp,
         const std::vector<int64_t>& numels, int64_t step, double lr, double beta1, double beta2,
         double eps, double weight_decay, bool adamw_mode, bool bias_correction) {
        const ds::optim::AdamConfig c = adam_config(step, lr, beta1, beta2, eps, weight_decay,
                                                    adamw_mode, bias_correction);
        Prepared p = prepare_ptrs(dtypes, params, grads, exp_avg, &exp_avg_sq, lowp, numels);
        nb::gil_scoped_release release;
        ds::optim::adam_step(c, p.types, p.buffers);
      },
      "Adam step on address lists already checked by ds.ops (internal).");
  m.def(
      "adagrad_step_ptrs",
      [](const std::vector<int>& dtypes, const Ptrs& params, const Ptrs& grads,
         const Ptrs& state_sum, const Ptrs& lowp, const std::vector<int64_t>& numels, double lr,
         double eps, double weight_decay) {
        const ds::optim::AdagradConfig c = adagrad_config(lr, eps, weight_decay);
        Prepared p = prepare_ptrs(dtypes, params, grads, state_sum, nullptr, lowp, numels);
        nb::gil_scoped_release release;
        ds::optim::adagrad_step(c, p.types, p.buffers);
      },
      "Adagrad step on address lists already checked by ds.ops (internal).");
  m.def(
      "lion_step_ptrs",
      [](const std::vector<int>& dtypes, const Ptrs& params, const Ptrs& grads,
         const Ptrs& exp_avg, const Ptrs& lowp, const std::vector<int64_t>& numels, double lr,
         double beta1, double beta2, double weight_decay) {
        const ds::optim::LionConfig c = lion_config(lr, beta1, beta2, weight_decay);
        Prepared p = prepare_ptrs(dtypes, params, grads, exp_avg, nullptr, lowp, numels);
        nb::gil_scoped_release release;
        ds::optim::lion_step(c, p.types, p.buffers);
      },
      "Lion step on address lists already checked by ds.ops (internal).");

  m.def(
      "stream_4r3w",
      [](Array a, Array b, Array c, Array d) {
        ArrayList ps{a};
        DType k = check_list(ps, "a", ps);
        for (const Array* x : {&b, &c, &d}) {
          ArrayList one{*x};
          if (check_list(one, "b/c/d", ps) != k) fail("all four buffers must share a dtype");
        }
        const int bytes = k == DType::kF32 ? 4 : 2;
        void* pa = a.data();
        const void* pb = b.data();
        void* pc = c.data();
        void* pd = d.data();
        const int64_t n = static_cast<int64_t>(a.size());
        nb::gil_scoped_release release;
        ds::optim::stream_4r3w(pa, pb, pc, pd, n, bytes);
      },
      nb::arg("a"), nb::arg("b"), nb::arg("c"), nb::arg("d"),
      "Bandwidth reference: reads a, b, c, d and writes a, c, d (the traffic of an fp32 Adam "
      "step) with trivial arithmetic.");
  m.def(
      "stream_4r3w_ptrs",
      [](int elem_bytes, const Ptrs& a, const Ptrs& b, const Ptrs& c, const Ptrs& d,
         const std::vector<int64_t>& numels) {
        const size_t k = numels.size();
        if (a.size() != k || b.size() != k || c.size() != k || d.size() != k)
          fail("stream_4r3w: the four address lists and numels must have one entry per tensor");
        if (elem_bytes != 2 && elem_bytes != 4) fail("stream_4r3w: elem_bytes must be 2 or 4");
        std::vector<Buffers> bufs(k);
        for (size_t i = 0; i < k; ++i) {
          if (numels[i] < 0) fail("stream_4r3w: negative element count");
          bufs[i].param = reinterpret_cast<void*>(a[i]);
          bufs[i].grad = reinterpret_cast<const void*>(b[i]);
          bufs[i].state1 = reinterpret_cast<void*>(c[i]);
          bufs[i].state2 = reinterpret_cast<void*>(d[i]);
          bufs[i].n = numels[i];
        }
        nb::gil_scoped_release release;
        ds::optim::stream_4r3w_tensors(bufs, elem_bytes);
      },
      "Bandwidth reference over address lists already checked by ds.ops (internal).");
}
