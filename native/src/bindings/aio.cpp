// Bindings of the block-wise async file I/O handle. Buffers arrive as flat uint8 views of CPU
// tensors; the Python wrapper keeps them alive until their operation has been waited for.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ds/aio.h"

namespace nb = nanobind;
using ds::aio::AioConfig;
using ds::aio::AioHandle;
using ds::aio::OpResult;

namespace {

using Bytes = nb::ndarray<uint8_t, nb::device::cpu, nb::c_contig>;

nb::dict to_dict(const OpResult& r) {
  nb::dict d;
  d["id"] = r.id;
  d["write"] = r.write;
  d["path"] = r.path;
  d["offset"] = r.offset;
  d["nbytes"] = r.nbytes;
  d["bytes_done"] = r.bytes_done;
  d["error"] = r.error;
  d["message"] = r.message;
  d["direct_bytes"] = r.direct_bytes;
  return d;
}

}  // namespace

void register_aio(nb::module_& m) {
  nb::class_<AioHandle>(m, "AioHandle")
      .def(
          "__init__",
          [](AioHandle* self, int64_t block_size, int queue_depth, int intra_op_parallelism,
             bool single_submit, bool overlap_events, bool use_o_direct) {
            AioConfig c;
            c.block_size = block_size;
            c.queue_depth = queue_depth;
            c.intra_op_parallelism = intra_op_parallelism;
            c.single_submit = single_submit;
            c.overlap_events = overlap_events;
            c.use_o_direct = use_o_direct;
            new (self) AioHandle(c);
          },
          nb::arg("block_size"), nb::arg("queue_depth"), nb::arg("intra_op_parallelism"),
          nb::arg("single_submit"), nb::arg("overlap_events"), nb::arg("use_o_direct"))
      .def(
          "submit",
          [](AioHandle& h, bool write, Bytes buf, const std::string& path, int64_t offset,
             bool async) {
            char* p = reinterpret_cast<char*>(buf.data());
            const int64_t n = static_cast<int64_t>(buf.size());
            nb::gil_scoped_release release;
            return h.submit(write, p, n, path, offset, async);
          },
          nb::arg("write"), nb::arg("buffer"), nb::arg("path"), nb::arg("offset"),
          nb::arg("collected_by_wait_all"))
      .def(
          "wait_op",
          [](AioHandle& h, int64_t id) {
            OpResult r;
            {
              nb::gil_scoped_release release;
              r = h.wait_op(id);
            }
            return to_dict(r);
          },
          nb::arg("id"))
      .def("wait_all",
           [](AioHandle& h) {
             std::vector<OpResult> rs;
             {
               nb::gil_scoped_release release;
               rs = h.wait_all();
             }
             nb::list out;
             for (const auto& r : rs) out.append(to_dict(r));
             return out;
           })
      .def("in_flight", &AioHandle::in_flight);
  m.attr("AIO_DIRECT_ALIGN") = ds::aio::kDirectAlign;
}
