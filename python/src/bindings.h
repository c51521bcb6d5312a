// The parts of the `_dcp` extension module, one file each.
#pragma once

#include <pybind11/pybind11.h>

namespace dcp::python {

namespace py = pybind11;

void bind_layout(py::module_& m);   // layout.cpp: ownership math and topology
void bind_kernels(py::module_& m);  // kernels.cpp: mla_decode and merge_states
void bind_llm(py::module_& m);      // llm.cpp: the offline LLM

}  // namespace dcp::python
