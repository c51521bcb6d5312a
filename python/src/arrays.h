// Checks on the numpy arrays the module receives. The Python package turns torch tensors into
// numpy views first (bf16 as uint16), so every kernel argument arrives here as a numpy array;
// nothing is copied or cast on the way in: a wrong dtype, rank or a non-contiguous array is a
// ValueError naming the argument.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dcp::python {

namespace py = pybind11;

template <class T>
bool has_dtype(const py::array& a) {
  return a.dtype().is(py::dtype::of<T>());
}

inline std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// `name` must have `ndim` dimensions and be C-contiguous (a strided view would need a copy the
// caller did not ask for).
inline void require_layout(const py::array& a, const char* name, int ndim) {
  if (a.ndim() != ndim) {
    throw py::value_error(std::string(name) + " must have " + std::to_string(ndim) +
                          " dimensions, got shape " + shape_text(a));
  }
  if (!(a.flags() & py::array::c_style)) {
    throw py::value_error(std::string(name) +
                          " must be C-contiguous (call .contiguous() or numpy.ascontiguousarray)");
  }
}

template <class T>
void require(const py::array& a, const char* name, int ndim, const char* dtype_name) {
  if (!has_dtype<T>(a)) {
    throw py::value_error(std::string(name) + " must be " + dtype_name + ", got " +
                          std::string(py::str(a.dtype())));
  }
  require_layout(a, name, ndim);
}

inline void require_dim(const py::array& a, const char* name, int axis, py::ssize_t want,
                        const char* what) {
  if (a.shape(axis) != want) {
    throw py::value_error(std::string(name) + " has shape " + shape_text(a) + ": dimension " +
                          std::to_string(axis) + " must be " + std::to_string(want) + " (" + what +
                          ")");
  }
}

}  // namespace dcp::python
