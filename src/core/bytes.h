// Bytes with 64-bit integer headers: how results and requests cross ranks (exact at any size,
// the same on every backend).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "dcp/error.h"

namespace dcp {

class ByteWriter {
 public:
  explicit ByteWriter(std::vector<std::uint8_t>& out) : out_(out) {}
  void i64(std::int64_t v) { raw(&v, sizeof v); }
  void f64(double v) { raw(&v, sizeof v); }
  template <class T>  // trivially copyable elements
  void vec(const std::vector<T>& v) {
    i64(static_cast<std::int64_t>(v.size()));
    raw(v.data(), v.size() * sizeof(T));
  }
  void str(const std::string& s) {
    i64(static_cast<std::int64_t>(s.size()));
    raw(s.data(), s.size());
  }
  void raw(const void* p, std::size_t n) {
    const auto* b = static_cast<const std::uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }

 private:
  std::vector<std::uint8_t>& out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::vector<std::uint8_t>& in) : in_(in) {}
  bool done() const noexcept { return at_ == in_.size(); }
  std::int64_t i64() {
    std::int64_t v = 0;
    raw(&v, sizeof v);
    return v;
  }
  double f64() {
    double v = 0;
    raw(&v, sizeof v);
    return v;
  }
  template <class T>
  std::vector<T> vec() {
    std::vector<T> v(count(sizeof(T)));
    raw(v.data(), v.size() * sizeof(T));
    return v;
  }
  std::string str() {
    std::string s(count(1), '\0');
    raw(s.data(), s.size());
    return s;
  }
  // A count of items of `item_bytes` each that must fit in what is left.
  std::size_t count(std::size_t item_bytes) {
    const std::int64_t n = i64();
    DCP_CHECK(n >= 0 && static_cast<std::size_t>(n) <= (in_.size() - at_) / item_bytes, internal,
              "packed bytes: a count of ", n, " overruns the buffer");
    return static_cast<std::size_t>(n);
  }
  void raw(void* p, std::size_t n) {
    DCP_CHECK(n <= in_.size() - at_, internal, "packed bytes end early");
    if (n > 0) std::memcpy(p, in_.data() + at_, n);
    at_ += n;
  }

 private:
  const std::vector<std::uint8_t>& in_;
  std::size_t at_ = 0;
};


}  // namespace dcp
