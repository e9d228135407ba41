// Bindings of the quantization kernels. Inputs are flat, contiguous CPU arrays prepared by
// ds.ops.quant.native; outputs are written in place. The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "ds/quant.h"

namespace nb = nanobind;
using ds::quant::Fp8Format;
using ds::quant::InputType;
using ds::quant::IntScheme;

namespace {

using Any = nb::ndarray<nb::device::cpu, nb::c_contig>;
using U8 = nb::ndarray<uint8_t, nb::device::cpu, nb::c_contig>;
using F32 = nb::ndarray<float, nb::device::cpu, nb::c_contig>;

InputType input_type(const Any& x) {
  const nb::dlpack::dtype dt = x.dtype();
  if (dt == nb::dtype<float>()) return InputType::F32;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) && dt.bits == 16)
    return InputType::F16;
  if (dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat) && dt.bits == 16)
    return InputType::BF16;
  throw std::invalid_argument("quantize: input must be float32, float16 or bfloat16");
}

void need(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

Fp8Format fp8_format(int e_bits) {
  need(e_bits == 4 || e_bits == 5, "fp8 format must be e4m3 (4) or e5m2 (5)");
  return e_bits == 4 ? Fp8Format::E4M3 : Fp8Format::E5M2;
}

int64_t groups(int64_t n, int64_t gs) {
  need(gs > 0, "group_size must be positive");
  return (n + gs - 1) / gs;
}

// A weight for linear_int, checked once. A decode step calls each layer once with one row; each
// array crossing the binding through DLPack costs about 2 us, so passing the weight's three
// arrays every call cost more than the kernel on a small layer. ds.ops.quant.linear keeps one
// per quantized weight and passes only the addresses of x and y, which it has checked. The
// ndarray members keep the weight's tensors alive as long as this object.
class QLinearWeight {
 public:
  QLinearWeight(U8 data, F32 scales, F32 zps, int64_t k, int64_t n, int64_t gs, int bits,
                bool asym, int qmin, int qmax)
      : data_(data), scales_(scales), zps_(zps), k_(k), n_(n), gs_(gs),
        s_{bits, asym, qmin, qmax} {
    need(bits == 4 || bits == 8, "bits must be 4 or 8");
    need(k > 0 && gs > 0 && k % gs == 0, "k must be a positive multiple of group_size");
    need(bits == 8 || gs % 2 == 0, "4-bit codes need an even group_size");
    need(n >= 0, "n must not be negative");
    const int64_t g = n * (k / gs);
    const int64_t bpg = bits == 4 ? gs / 2 : gs;
    need(static_cast<int64_t>(data.size()) == g * bpg, "data has the wrong size");
    need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
    need(!asym || static_cast<int64_t>(zps.size()) == g, "zero_points has the wrong size");
  }

  void run(const float* x, int64_t m, float* y) const {
    nb::gil_scoped_release release;
    ds::quant::linear_int(x, m, k_, data_.data(), scales_.data(),
                          s_.asym ? zps_.data() : nullptr, n_, gs_, s_, y);
  }

  // linear_int_a8: x quantized to int8 per block of one group (symmetric schemes only). The
  // first call packs the weight (ds::quant::A8Packed, a second copy of its codes and scales)
  // while it holds the GIL, so calls from several Python threads pack it once.
  void run_a8(const float* x, int64_t m, float* y) const {
    need(!s_.asym, "int8 activations need a symmetric weight scheme (int8_sym or int4_sym)");
    if (!packed_ && ds::quant::a8_packs(gs_)) {
      packed_ = std::make_unique<ds::quant::A8Packed>(
          ds::quant::pack_a8(data_.data(), scales_.data(), n_, k_, gs_, s_.bits));
    }
    nb::gil_scoped_release release;
    if (packed_) {
      ds::quant::linear_a8_packed(x, m, *packed_, y);
    } else {
      ds::quant::linear_int_a8(x, m, k_, data_.data(), scales_.data(), n_, gs_, s_, y);
    }
  }

  size_t a8_packed_bytes() const { return packed_ ? packed_->bytes() : 0; }

 private:
  U8 data_;
  F32 scales_;
  F32 zps_;
  int64_t k_, n_, gs_;
  IntScheme s_;
  mutable std::unique_ptr<ds::quant::A8Packed> packed_;
};

}  // namespace

void register_quant(nb::module_& m) {
  m.def(
      "quant_int",
      [](Any x, int64_t gs, int bits, bool asym, int qmin, int qmax, U8 data, F32 scales,
         F32 zps) {
        const InputType in = input_type(x);
        const int64_t n = static_cast<int64_t>(x.size());
        const int64_t g = groups(n, gs);
        const int64_t bpg = bits == 4 ? (gs + 1) / 2 : gs;
        need(bits == 4 || bits == 8, "bits must be 4 or 8");
        need(static_cast<int64_t>(data.size()) == g * bpg, "data has the wrong size");
        need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
        need(!asym || static_cast<int64_t>(zps.size()) == g, "zero_points has the wrong size");
        const IntScheme s{bits, asym, qmin, qmax};
        const void* xp = x.data();
        nb::gil_scoped_release release;
        ds::quant::quantize_int(xp, in, n, gs, s, data.data(), scales.data(),
                                asym ? zps.data() : nullptr);
      },
      nb::arg("x"), nb::arg("group_size"), nb::arg("bits"), nb::arg("asym"), nb::arg("qmin"),
      nb::arg("qmax"), nb::arg("data").noconvert(), nb::arg("scales").noconvert(),
      nb::arg("zero_points").noconvert(),
      "Group-wise integer quantization of flat x into data/scales/zero_points (in place).");

  m.def(
      "dequant_int",
      [](U8 data, F32 scales, F32 zps, int64_t gs, int bits, bool asym, int qmin, int qmax,
         F32 out) {
        const int64_t n = static_cast<int64_t>(out.size());
        const int64_t g = groups(n, gs);
        const int64_t bpg = bits == 4 ? (gs + 1) / 2 : gs;
        need(bits == 4 || bits == 8, "bits must be 4 or 8");
        need(static_cast<int64_t>(data.size()) == g * bpg, "data has the wrong size");
        need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
        need(!asym || static_cast<int64_t>(zps.size()) == g, "zero_points has the wrong size");
        const IntScheme s{bits, asym, qmin, qmax};
        nb::gil_scoped_release release;
        ds::quant::dequantize_int(data.data(), scales.data(), asym ? zps.data() : nullptr, n, gs,
                                  s, out.data());
      },
      nb::arg("data"), nb::arg("scales"), nb::arg("zero_points"), nb::arg("group_size"),
      nb::arg("bits"), nb::arg("asym"), nb::arg("qmin"), nb::arg("qmax"),
      nb::arg("out").noconvert(), "Group-wise integer dequantization into float32 out.");

  m.def(
      "linear_int",
      [](F32 x, U8 data, F32 scales, F32 zps, int64_t k, int64_t n, int64_t gs, int bits,
         bool asym, int qmin, int qmax, F32 y) {
        const QLinearWeight w(data, scales, zps, k, n, gs, bits, asym, qmin, qmax);
        const int64_t xs = static_cast<int64_t>(x.size());
        need(xs % k == 0, "x must hold whole rows of k elements");
        const int64_t m = xs / k;
        need(static_cast<int64_t>(y.size()) == m * n, "y has the wrong size");
        w.run(x.data(), m, y.data());
      },
      nb::arg("x"), nb::arg("data"), nb::arg("scales"), nb::arg("zero_points"), nb::arg("k"),
      nb::arg("n"), nb::arg("group_size"), nb::arg("bits"), nb::arg("asym"), nb::arg("qmin"),
      nb::arg("qmax"), nb::arg("y").noconvert(),
      "y[m, n] = x[m, k] W^T from W's integer codes (group-wise, whole groups per row).");

  nb::class_<QLinearWeight>(m, "QLinearWeight",
                            "A weight checked once for many linear_int calls (see run).")
      .def(nb::init<U8, F32, F32, int64_t, int64_t, int64_t, int, bool, int, int>(),
           nb::arg("data"), nb::arg("scales"), nb::arg("zero_points"), nb::arg("k"),
           nb::arg("n"), nb::arg("group_size"), nb::arg("bits"), nb::arg("asym"),
           nb::arg("qmin"), nb::arg("qmax"))
      .def(
          "run",
          [](const QLinearWeight& w, uintptr_t x, int64_t m, uintptr_t y, bool int8_x) {
            need(m >= 0, "m must not be negative");
            if (m > 0) need(x != 0 && y != 0, "run needs the addresses of x and y");
            const auto* xp = reinterpret_cast<const float*>(x);
            auto* yp = reinterpret_cast<float*>(y);
            if (int8_x) {
              w.run_a8(xp, m, yp);
            } else {
              w.run(xp, m, yp);
            }
          },
          nb::arg("x_address"), nb::arg("m"), nb::arg("y_address"), nb::arg("int8_x") = false,
          "y[m, n] = x[m, k] W^T at raw addresses: the caller guarantees contiguous float32 x "
          "of m * k and y of m * n elements, alive for the call. int8_x: x quantized to int8 "
          "per block of one group, integer dot products per group (linear_int_a8).")
      .def_prop_ro("a8_packed_bytes", &QLinearWeight::a8_packed_bytes,
                   "Bytes of the copy the first int8_x run packed (0 before it, or where groups "
                   "are not a multiple of 32 and the stored layout is read).");

  m.def(
      "quant_activations",
      [](F32 x, int64_t block, nb::ndarray<int8_t, nb::device::cpu, nb::c_contig> codes,
         F32 scales) {
        const int64_t n = static_cast<int64_t>(x.size());
        need(block > 0 && n % block == 0, "x must hold whole blocks");
        need(static_cast<int64_t>(codes.size()) == n, "codes has the wrong size");
        need(static_cast<int64_t>(scales.size()) == n / block, "scales has the wrong size");
        nb::gil_scoped_release release;
        ds::quant::quantize_activations(x.data(), n, block, codes.data(), scales.data());
      },
      nb::arg("x"), nb::arg("block"), nb::arg("codes").noconvert(), nb::arg("scales").noconvert(),
      "The activation quantization of linear_int_a8: int8 codes and a scale per block.");
  m.def(
      "int8_dot_isa", [] { return std::string(ds::quant::dot_isa_name(ds::quant::dot_isa())); },
      "Integer dot-product variant linear_int_a8 uses now (groups of a multiple of 32).");
  m.def(
      "set_int8_dot_isa",
      [](const std::string& name) {
        ds::quant::DotIsa d;
        need(ds::quant::parse_dot_isa(name.c_str(), &d),
             "unknown dot-product variant '" + name + "'; use one of " +
                 ds::quant::dot_isas_built());
        return ds::quant::set_dot_isa(d);
      },
      nb::arg("name"),
      "Cap linear_int_a8's variant (e.g. to test each one). Returns False if this CPU or the "
      "SIMD level in use cannot run it.");
  m.def(
      "int8_dot_isas_built", [] { return std::string(ds::quant::dot_isas_built()); },
      "Integer dot-product variants compiled into this build.");

  m.def(
      "quant_fp8",
      [](Any x, int64_t gs, int e_bits, U8 data, F32 scales) {
        const InputType in = input_type(x);
        const Fp8Format f = fp8_format(e_bits);
        const int64_t n = static_cast<int64_t>(x.size());
        const int64_t g = groups(n, gs);
        need(static_cast<int64_t>(data.size()) == g * gs, "data has the wrong size");
        need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
        const void* xp = x.data();
        nb::gil_scoped_release release;
        ds::quant::quantize_fp8(xp, in, n, gs, f, data.data(), scales.data());
      },
      nb::arg("x"), nb::arg("group_size"), nb::arg("exponent_bits"), nb::arg("data").noconvert(),
      nb::arg("scales").noconvert(), "Group-wise fp8 quantization (codes written as bytes).");

  m.def(
      "dequant_fp8",
      [](U8 data, F32 scales, int64_t gs, int e_bits, F32 out) {
        const Fp8Format f = fp8_format(e_bits);
        const int64_t n = static_cast<int64_t>(out.size());
        const int64_t g = groups(n, gs);
        need(static_cast<int64_t>(data.size()) == g * gs, "data has the wrong size");
        need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
        nb::gil_scoped_release release;
        ds::quant::dequantize_fp8(data.data(), scales.data(), n, gs, f, out.data());
      },
      nb::arg("data"), nb::arg("scales"), nb::arg("group_size"), nb::arg("exponent_bits"),
      nb::arg("out").noconvert(), "Group-wise fp8 dequantization into float32 out.");
}
