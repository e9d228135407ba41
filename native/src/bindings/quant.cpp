// Bindings of the quantization kernels. Inputs are flat, contiguous CPU arrays prepared by
// ds.ops.quant.native; outputs are written in place. The GIL is released while kernels run.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
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
        need(bits == 4 || bits == 8, "bits must be 4 or 8");
        need(k > 0 && gs > 0 && k % gs == 0, "k must be a positive multiple of group_size");
        need(bits == 8 || gs % 2 == 0, "4-bit codes need an even group_size");
        const int64_t xs = static_cast<int64_t>(x.size());
        need(xs % k == 0, "x must hold whole rows of k elements");
        const int64_t m = xs / k;
        const int64_t g = n * (k / gs);
        const int64_t bpg = bits == 4 ? gs / 2 : gs;
        need(static_cast<int64_t>(data.size()) == g * bpg, "data has the wrong size");
        need(static_cast<int64_t>(scales.size()) == g, "scales has the wrong size");
        need(!asym || static_cast<int64_t>(zps.size()) == g, "zero_points has the wrong size");
        need(static_cast<int64_t>(y.size()) == m * n, "y has the wrong size");
        const IntScheme s{bits, asym, qmin, qmax};
        nb::gil_scoped_release release;
        ds::quant::linear_int(x.data(), m, k, data.data(), scales.data(),
                              asym ? zps.data() : nullptr, n, gs, s, y.data());
      },
      nb::arg("x"), nb::arg("data"), nb::arg("scales"), nb::arg("zero_points"), nb::arg("k"),
      nb::arg("n"), nb::arg("group_size"), nb::arg("bits"), nb::arg("asym"), nb::arg("qmin"),
      nb::arg("qmax"), nb::arg("y").noconvert(),
      "y[m, n] = x[m, k] W^T from W's integer codes (group-wise, whole groups per row).");

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
