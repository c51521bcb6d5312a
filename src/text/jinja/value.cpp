#include "value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "python_str.h"

namespace dcp::jinja {
namespace {

using ordered_json = nlohmann::ordered_json;

// Python's repr of a float: the shortest digits that read back, written positionally when the
// decimal point falls within 4 zeros before them to 16 digits after their start ("0.0004",
// "1000000000000000.0"), else with an exponent of at least two digits ("1e-05", "1e+16").
std::string real_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  const std::string text(buf, r.ptr);  // "-1.2345e-05"
  const std::size_t e = text.find('e');
  const bool negative = text[0] == '-';
  std::string digits;
  for (std::size_t k = negative ? 1 : 0; k < e; ++k)
    if (text[k] != '.') digits += text[k];
  const int exponent = std::stoi(text.substr(e + 1));
  const int point = exponent + 1;  // digits before the decimal point
  std::string out = negative ? "-" : "";
  if (point <= -4 || point > 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    const int magnitude = exponent < 0 ? -exponent : exponent;
    out += std::string(exponent < 0 ? "e-" : "e+") + (magnitude < 10 ? "0" : "") +
           std::to_string(magnitude);
  } else if (point <= 0) {
    out += "0." + std::string(static_cast<std::size_t>(-point), '0') + digits;
  } else if (static_cast<std::size_t>(point) >= digits.size()) {
    out += digits + std::string(static_cast<std::size_t>(point) - digits.size(), '0') + ".0";
  } else {
    out += digits.substr(0, static_cast<std::size_t>(point)) + "." +
           digits.substr(static_cast<std::size_t>(point));
  }
  return out;
}

[[noreturn]] void too_deep() {
  throw Error(ErrorCategory::invalid_argument, str("chat template: values nested deeper than ",
                                                   kMaxDepth, " (a namespace that holds itself?)"));
}

}  // namespace

[[noreturn]] void fail(int line, const std::string& what) {
  throw Error(ErrorCategory::invalid_argument, str("chat template line ", line, ": ", what));
}

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Value::undefined: return "undefined";
    case Value::none: return "none";
    case Value::boolean: return "boolean";
    case Value::integer: return "integer";
    case Value::real: return "float";
    case Value::string: return "string";
    case Value::list: return v.is_tuple ? "tuple" : "list";
    case Value::dict: return "dict";
    case Value::function: return "function";
  }
  return "?";
}

List characters(const std::string& s) {
  List out;
  for (std::size_t k = 0; k < s.size();) {
    const auto c = static_cast<unsigned char>(s[k]);
    std::size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
    len = std::min(len, s.size() - k);
    out.push_back(Value::Str(s.substr(k, len)));
    k += len;
  }
  return out;
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::undefined:
    case Value::none: return false;
    case Value::boolean: return v.b;
    case Value::integer: return v.i != 0;
    case Value::real: return v.d != 0;
    case Value::string: return !v.s.empty();
    case Value::list: return !v.l->empty();
    case Value::dict: return !v.m->empty();
    case Value::function: return true;
  }
  return false;
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::undefined: return "";
    case Value::none: return "None";
    case Value::boolean: return v.b ? "True" : "False";
    case Value::integer: return std::to_string(v.i);
    case Value::real: return real_repr(v.d);
    case Value::string: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v, int depth) {
  if (depth > kMaxDepth) too_deep();
  switch (v.kind) {
    case Value::string: return py_repr(v.s);
    case Value::list: {
      std::string out = v.is_tuple ? "(" : "[";
      for (std::size_t k = 0; k < v.l->size(); ++k)
        out += (k ? ", " : "") + repr((*v.l)[k], depth + 1);
      if (v.is_tuple) return out + (v.l->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Value::dict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : *v.m) {
        out += (first ? "'" : ", '") + k + "': " + repr(x, depth + 1);
        first = false;
      }
      return out + "}";
    }
    case Value::function: return "<function>";
    default: return to_str(v);
  }
}

bool equal(const Value& a, const Value& b, int depth) {
  if (depth > kMaxDepth) too_deep();
  if (a.numeric() && b.numeric()) return a.as_real() == b.as_real();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::undefined:
    case Value::none: return true;
    case Value::string: return a.s == b.s;
    case Value::list: {
      if (a.is_tuple != b.is_tuple || a.l->size() != b.l->size()) return false;
      for (std::size_t k = 0; k < a.l->size(); ++k)
        if (!equal((*a.l)[k], (*b.l)[k], depth + 1)) return false;
      return true;
    }
    case Value::dict: {
      if (a.m->size() != b.m->size()) return false;
      for (const auto& [k, x] : *a.m) {
        const Value* y = b.find(k);
        if (!y || !equal(x, *y, depth + 1)) return false;
      }
      return true;
    }
    default: return a.f == b.f;
  }
}

Value from_json(const ordered_json& j, int depth) {
  if (depth > kMaxDepth) too_deep();
  switch (j.type()) {
    case ordered_json::value_t::null: return Value::None();
    case ordered_json::value_t::boolean: return Value::Bool(j.get<bool>());
    case ordered_json::value_t::number_integer:
    case ordered_json::value_t::number_unsigned: return Value::Int(j.get<std::int64_t>());
    case ordered_json::value_t::number_float: return Value::Real(j.get<double>());
    case ordered_json::value_t::string: return Value::Str(j.get<std::string>());
    case ordered_json::value_t::array: {
      List l;
      for (const ordered_json& e : j) l.push_back(from_json(e, depth + 1));
      return Value::Lst(std::move(l));
    }
    case ordered_json::value_t::object: {
      Dict m;
      for (const auto& [k, e] : j.items()) m.emplace_back(k, from_json(e, depth + 1));
      return Value::Dct(std::move(m));
    }
    default: return Value::None();
  }
}

void dump_json(const Value& v, std::string& out, const JsonStyle& style, int depth) {
  if (depth > kMaxDepth) too_deep();
  const auto newline = [&](int d) {
    if (!style.indent) return;
    if (out.size() > kMaxOutput)
      throw Error(ErrorCategory::invalid_argument,
                  str("chat template: tojson() past ", kMaxOutput, " bytes"));
    out += '\n';
    for (int k = 0; k < d; ++k) out += *style.indent;
  };
  const auto string = [&](const std::string& s) {
    const std::string text =
        ordered_json(s).dump(-1, ' ', style.ensure_ascii, ordered_json::error_handler_t::replace);
    if (!style.ensure_ascii) {
      out += text;
      return;
    }
    for (char c : text)
      out += c == '\x7f' ? std::string("\\u007f") : std::string(1, c);  // as Python
  };
  switch (v.kind) {
    case Value::undefined:  // json.dumps refuses Jinja's Undefined
      throw Error(ErrorCategory::invalid_argument, "chat template: tojson() of an undefined value");
    case Value::none: out += "null"; return;
    case Value::boolean: out += v.b ? "true" : "false"; return;
    case Value::integer: out += std::to_string(v.i); return;
    case Value::real:  // Python writes the non-finite numbers as JavaScript names them
      out += std::isnan(v.d)   ? "NaN"
             : std::isinf(v.d) ? (v.d > 0 ? "Infinity" : "-Infinity")
                               : real_repr(v.d);
      return;
    case Value::string: string(v.s); return;
    case Value::list: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += style.item_separator;
        newline(depth + 1);
        dump_json((*v.l)[k], out, style, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::dict: {
      if (v.m->empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : *v.m) items.push_back(&item);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](const auto* a, const auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t k = 0; k < items.size(); ++k) {
        if (k) out += style.item_separator;
        newline(depth + 1);
        string(items[k]->first);
        out += style.key_separator;
        dump_json(items[k]->second, out, style, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::function: out += "null"; return;
  }
}

}  // namespace dcp::jinja
