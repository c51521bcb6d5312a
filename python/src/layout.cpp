// Ownership math (vectorised over int64 arrays) and topology resolution.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <optional>
#include <string>

#include "bindings.h"
#include "dcp/layout.h"
#include "dcp/topology.h"

namespace dcp::python {
namespace {

using Int64Array = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>;

void check_group(int n, int interleave) {
  if (n < 1) throw py::value_error("n = " + std::to_string(n) + " must be >= 1 (the DCP size)");
  if (interleave < 1) {
    throw py::value_error("interleave = " + std::to_string(interleave) + " must be >= 1");
  }
}

void check_rank(int r, int n) {
  if (r < 0 || r >= n) {
    throw py::value_error("r = " + std::to_string(r) + " must be in [0, n = " + std::to_string(n) +
                          ")");
  }
}

// out[k] = f(in[k]) over an array of any shape; every input must be >= 0.
template <class F>
py::array map_nonnegative(const Int64Array& in, const char* name, F f) {
  py::array_t<std::int64_t> out(std::vector<py::ssize_t>(in.shape(), in.shape() + in.ndim()));
  const std::int64_t* src = in.data();
  std::int64_t* dst = out.mutable_data();
  for (py::ssize_t k = 0; k < in.size(); ++k) {
    if (src[k] < 0) {
      throw py::value_error(std::string(name) + " must be >= 0, got " + std::to_string(src[k]));
    }
    dst[k] = f(src[k]);
  }
  return out;
}

}  // namespace

void bind_layout(py::module_& m) {
  m.def("_owner", [](const Int64Array& p, int n, int i) {
    check_group(n, i);
    return map_nonnegative(p, "p", [&](std::int64_t x) { return layout::owner(x, n, i); });
  }, py::arg("p"), py::arg("n"), py::arg("interleave"));
  m.def("_row", [](const Int64Array& p, int n, int i) {
    check_group(n, i);
    return map_nonnegative(p, "p", [&](std::int64_t x) { return layout::row(x, n, i); });
  }, py::arg("p"), py::arg("n"), py::arg("interleave"));
  m.def("_local_count", [](const Int64Array& x, int r, int n, int i) {
    check_group(n, i);
    check_rank(r, n);
    return map_nonnegative(x, "x", [&](std::int64_t v) { return layout::count(v, r, n, i); });
  }, py::arg("x"), py::arg("r"), py::arg("n"), py::arg("interleave"));
  m.def("_position", [](const Int64Array& row, int r, int n, int i) {
    check_group(n, i);
    check_rank(r, n);
    return map_nonnegative(row, "local_row",
                           [&](std::int64_t v) { return layout::position(v, r, n, i); });
  }, py::arg("local_row"), py::arg("r"), py::arg("n"), py::arg("interleave"));

  m.def("_topology_json", [](int tp_size, int dcp_size, int dp_size, bool enable_dp_attention,
                             int pcp_size, std::optional<std::string> backend,
                             bool replicate_q_proj, const std::string& platform) {
    ParallelConfig c;
    c.tp_size = tp_size;
    c.dcp_size = dcp_size;
    c.dp_size = dp_size;
    c.enable_dp_attention = enable_dp_attention;
    c.pcp_size = pcp_size;
    if (backend) c.dcp_comm_backend = parse_combine_backend(*backend);
    c.replicate_q_proj = replicate_q_proj;
    c.platform = Platform::parse(platform);
    return to_json(resolve(c));
  }, py::arg("tp_size"), py::arg("dcp_size"), py::arg("dp_size"), py::arg("enable_dp_attention"),
     py::arg("pcp_size"), py::arg("dcp_comm_backend"), py::arg("replicate_q_proj"),
     py::arg("platform"));
}

}  // namespace dcp::python
