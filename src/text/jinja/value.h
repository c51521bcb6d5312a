// The values a chat template computes with: Python's none, booleans, numbers, strings, lists and
// tuples, insertion-ordered dicts, plus callables; what printing, comparing and JSON make of them;
// and the bounds every rendering keeps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dcp/error.h"

namespace dcp::jinja {

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion-ordered, like Python
using Args = std::vector<Value>;
using Kwargs = std::vector<std::pair<std::string, Value>>;
using Function = std::function<Value(const Args&, const Kwargs&)>;

struct Value {
  enum Kind { undefined, none, boolean, integer, real, string, list, dict, function };
  Kind kind = undefined;
  bool b = false;
  std::int64_t i = 0;
  double d = 0;
  std::string s;
  std::shared_ptr<List> l;
  std::shared_ptr<Dict> m;
  bool is_namespace = false;  // a dict whose attributes {% set ns.x %} may assign
  bool is_tuple = false;      // a list that is Python's tuple: printed (a, b), never == a list
  std::shared_ptr<Function> f;

  // One line a kind.
  // clang-format off
  static Value None() { Value v; v.kind = none; return v; }
  static Value Bool(bool x) { Value v; v.kind = boolean; v.b = x; return v; }
  static Value Int(std::int64_t x) { Value v; v.kind = integer; v.i = x; return v; }
  static Value Real(double x) { Value v; v.kind = real; v.d = x; return v; }
  static Value Str(std::string x) { Value v; v.kind = string; v.s = std::move(x); return v; }
  static Value Lst(List x) { Value v; v.kind = list; v.l = share(std::move(x)); return v; }
  static Value Tup(List x) { Value v = Lst(std::move(x)); v.is_tuple = true; return v; }
  static Value Dct(Dict x) { Value v; v.kind = dict; v.m = share(std::move(x)); return v; }
  static Value Fn(Function x) { Value v; v.kind = function; v.f = share(std::move(x)); return v; }
  // clang-format on
  template <class T>
  static std::shared_ptr<T> share(T x) {
    return std::make_shared<T>(std::move(x));
  }

  bool numeric() const { return kind == integer || kind == real || kind == boolean; }
  double as_real() const {
    return kind == real ? d : kind == boolean ? (b ? 1 : 0) : static_cast<double>(i);
  }
  const Value* find(const std::string& key) const {
    if (kind != dict) return nullptr;
    for (const auto& [k, v] : *m)
      if (k == key) return &v;
    return nullptr;
  }
};

// Bounds on one rendering: a chat template renders a prompt, and a template that would loop or
// grow without end (a typo, a hostile file) fails instead of taking the machine.
constexpr std::size_t kMaxRange = 100000, kMaxIterations = 10000000, kMaxOutput = 64u << 20;
// A macro call costs about what five loop iterations do (its scope and arguments).
constexpr std::size_t kMaxMacroCalls = 1000000;
// Nesting: of values (a namespace may hold itself) and of expressions in the source.
constexpr int kMaxDepth = 200;

// Throws dcp::Error (invalid_argument) naming the template's line.
[[noreturn]] void fail(int line, const std::string& what);

const char* kind_name(const Value& v);
// A string's characters (UTF-8 sequences; a stray byte counts as one), as Python indexes str.
List characters(const std::string& s);
bool truthy(const Value& v);
// What {{ v }} prints (Python's str()).
std::string to_str(const Value& v);
// Python's repr().
std::string repr(const Value& v, int depth = 0);
bool equal(const Value& a, const Value& b, int depth = 0);
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
// Python's json.dumps (ensure_ascii off, ", " and ": " separators, or `indent`).
// How tojson writes JSON: Hugging Face's tojson filter is Python's json.dumps with these options.
struct JsonStyle {
  std::optional<std::string> indent;  // one level's indentation; none: all on one line
  std::string item_separator = ", ", key_separator = ": ";
  bool sort_keys = false, ensure_ascii = false;
};
void dump_json(const Value& v, std::string& out, const JsonStyle& style, int depth = 0);

// Counts one level of a recursion for its lifetime; past kMaxDepth levels, fails naming `what`.
class DepthGuard {
 public:
  DepthGuard(int& depth, int line, const char* what) : depth_(depth) {
    if (++depth_ > kMaxDepth) fail(line, str(what, " nested deeper than ", kMaxDepth));
  }
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;

 private:
  int& depth_;
};

}  // namespace dcp::jinja
