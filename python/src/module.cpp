// `dcp._dcp`: the extension module under the `dcp` Python package. dcp::Error becomes the
// Python exception its category means, carrying the library's message (the argument and its
// legal values).
#include <pybind11/pybind11.h>

#include "bindings.h"
#include "dcp/error.h"
#include "dcp/serving.h"
#include "dcp/version.h"

namespace py = pybind11;

PYBIND11_MODULE(_dcp, m) {
  m.doc() = "Decode Context Parallelism for MLA attention (C++ core)";
  m.attr("__version__") = dcp::kVersion;
  py::register_exception_translator([](std::exception_ptr e) {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const dcp::RefusedError& err) {  // a request the deployment will not take
      const bool bad_request = err.why() == dcp::Refusal::invalid ||
                               err.why() == dcp::Refusal::past_context ||
                               err.why() == dcp::Refusal::too_long;
      PyErr_SetString(bad_request ? PyExc_ValueError : PyExc_RuntimeError, err.what());
    } catch (const dcp::Error& err) {
      PyObject* type = PyExc_RuntimeError;
      switch (err.category()) {
        case dcp::ErrorCategory::invalid_argument: type = PyExc_ValueError; break;
        case dcp::ErrorCategory::unsupported: type = PyExc_NotImplementedError; break;
        case dcp::ErrorCategory::io: type = PyExc_OSError; break;
        default: break;
      }
      PyErr_SetString(type, err.what());
    }
  });
  dcp::python::bind_layout(m);
  dcp::python::bind_kernels(m);
  dcp::python::bind_llm(m);
}
