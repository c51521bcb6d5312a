// A Jinja interpreter for chat templates (see dcp/chat_template.h for what it covers).
//
// Source -> segments (text and tags, with Jinja's whitespace rules applied) -> a tree of nodes
// (text, output, if, for, set) with expression trees -> rendered against scopes of values.
#include "dcp/chat_template.h"

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdint>
#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <variant>

#include "dcp/error.h"

namespace dcp {
namespace {

using ordered_json = nlohmann::ordered_json;

// ---- values ----

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
  std::shared_ptr<Function> f;

  // One line a kind.
  // clang-format off
  static Value None() { Value v; v.kind = none; return v; }
  static Value Bool(bool x) { Value v; v.kind = boolean; v.b = x; return v; }
  static Value Int(std::int64_t x) { Value v; v.kind = integer; v.i = x; return v; }
  static Value Real(double x) { Value v; v.kind = real; v.d = x; return v; }
  static Value Str(std::string x) { Value v; v.kind = string; v.s = std::move(x); return v; }
  static Value Lst(List x) { Value v; v.kind = list; v.l = share(std::move(x)); return v; }
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
// Nesting: of values (a namespace may hold itself) and of expressions in the source.
constexpr int kMaxDepth = 200;

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
    case Value::list: return "list";
    case Value::dict: return "dict";
    case Value::function: return "function";
  }
  return "?";
}

// A string's characters (UTF-8 sequences; a stray byte counts as one), as Python indexes str.
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

std::string real_repr(double d) {  // Python's repr of a float
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, d);
  std::string s(buf, r.ptr);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string repr(const Value& v, int depth = 0);

[[noreturn]] void too_deep() {
  throw Error(ErrorCategory::invalid_argument,
              str("chat template: values nested deeper than ", kMaxDepth,
                  " (a namespace that holds itself?)"));
}

// What {{ v }} prints (Python's str()).
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
    case Value::string: {
      std::string out = "'";
      for (char c : v.s) {
        if (c == '\'' || c == '\\') out += '\\';
        if (c == '\n') {
          out += "\\n";
          continue;
        }
        out += c;
      }
      return out + "'";
    }
    case Value::list: {
      std::string out = "[";
      for (std::size_t k = 0; k < v.l->size(); ++k)
        out += (k ? ", " : "") + repr((*v.l)[k], depth + 1);
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

bool equal(const Value& a, const Value& b, int depth = 0) {
  if (depth > kMaxDepth) too_deep();
  if (a.numeric() && b.numeric()) return a.as_real() == b.as_real();
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::undefined:
    case Value::none: return true;
    case Value::string: return a.s == b.s;
    case Value::list: {
      if (a.l->size() != b.l->size()) return false;
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

Value from_json(const ordered_json& j, int depth = 0) {
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

// Python's json.dumps (ensure_ascii off, ", " and ": " separators, or `indent`).
void dump_json(const Value& v, std::string& out, int indent, int depth) {
  if (depth > kMaxDepth) too_deep();
  const auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  switch (v.kind) {
    case Value::undefined:
    case Value::none: out += "null"; return;
    case Value::boolean: out += v.b ? "true" : "false"; return;
    case Value::integer: out += std::to_string(v.i); return;
    case Value::real: out += real_repr(v.d) == "inf" ? "Infinity" : real_repr(v.d); return;
    case Value::string:
      out += ordered_json(v.s).dump(-1, ' ', false, ordered_json::error_handler_t::replace);
      return;
    case Value::list: {
      if (v.l->empty()) { out += "[]"; return; }
      out += '[';
      for (std::size_t k = 0; k < v.l->size(); ++k) {
        if (k) out += indent < 0 ? ", " : ",";
        newline(depth + 1);
        dump_json((*v.l)[k], out, indent, depth + 1);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Value::dict: {
      if (v.m->empty()) { out += "{}"; return; }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : *v.m) {
        if (!first) out += indent < 0 ? ", " : ",";
        first = false;
        newline(depth + 1);
        out += ordered_json(k).dump(-1, ' ', false, ordered_json::error_handler_t::replace) + ": ";
        dump_json(x, out, indent, depth + 1);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Value::function: out += "null"; return;
  }
}

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

// ---- lexing ----

struct Token {
  enum Kind { name, string, integer, real, op, end } kind = end;
  std::string text;
  int line = 0;
};

struct Segment {  // raw text, or a tag's tokens
  enum Kind { text, output, statement } kind = text;
  std::string body;
  std::vector<Token> tokens;
  int line = 1;
};

std::vector<Token> lex_expression(const std::string& src, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  const auto is_name = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  while (i < src.size()) {
    const char c = src[i];
    if (c == '\n') ++line;
    if (std::isspace(static_cast<unsigned char>(c))) { ++i; continue; }
    Token t;
    t.line = line;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < src.size() && is_name(src[j])) ++j;
      t.kind = Token::name;
      t.text = src.substr(i, j - i);
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      while (j < src.size() && (std::isdigit(static_cast<unsigned char>(src[j])) || src[j] == '_'))
        ++j;
      t.kind = Token::integer;
      if (j + 1 < src.size() && src[j] == '.' &&
          std::isdigit(static_cast<unsigned char>(src[j + 1]))) {
        ++j;
        while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
        t.kind = Token::real;
      }
      if (j < src.size() && (src[j] == 'e' || src[j] == 'E')) {
        std::size_t k = j + 1;
        if (k < src.size() && (src[k] == '+' || src[k] == '-')) ++k;
        if (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) {
          while (k < src.size() && std::isdigit(static_cast<unsigned char>(src[k]))) ++k;
          j = k;
          t.kind = Token::real;
        }
      }
      t.text = src.substr(i, j - i);
      t.text.erase(std::remove(t.text.begin(), t.text.end(), '_'), t.text.end());
      i = j;
    } else if (c == '\'' || c == '"') {
      std::size_t j = i + 1;
      std::string s;
      while (j < src.size() && src[j] != c) {
        if (src[j] == '\n') ++line;
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[j + 1];
          switch (e) {
            case 'n': s += '\n'; break;
            case 't': s += '\t'; break;
            case 'r': s += '\r'; break;
            case 'b': s += '\b'; break;
            case 'f': s += '\f'; break;
            case 'v': s += '\v'; break;
            case '\\': s += '\\'; break;
            case '\'': s += '\''; break;
            case '"': s += '"'; break;
            default: s += '\\'; s += e;
          }
          j += 2;
          continue;
        }
        s += src[j++];
      }
      if (j >= src.size()) fail(t.line, "a string literal is not closed");
      t.kind = Token::string;
      t.text = std::move(s);
      i = j + 1;
    } else {
      static const char* const ops[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*", "/",
                                        "%",  "~",  "<",  ">",  "=",  ".",  ",", ":", "(", ")",
                                        "[",  "]",  "{",  "}",  "|"};
      bool found = false;
      for (const char* op : ops) {
        const std::size_t n = std::char_traits<char>::length(op);
        if (src.compare(i, n, op) == 0) {
          t.kind = Token::op;
          t.text = op;
          i += n;
          found = true;
          break;
        }
      }
      if (!found) fail(line, str("unexpected character '", std::string(1, c), "'"));
    }
    out.push_back(std::move(t));
  }
  Token end;
  end.line = line;
  out.push_back(end);
  return out;
}

// The end of a tag opened at `from` ("}}", "%}" or "#}"), skipping string literals.
std::size_t tag_end(const std::string& s, std::size_t from, const char* close, int line) {
  char quote = 0;
  for (std::size_t i = from; i + 1 < s.size(); ++i) {
    if (quote) {
      if (s[i] == '\\') ++i;
      else if (s[i] == quote) quote = 0;
    } else if (s[i] == '\'' || s[i] == '"') {
      quote = s[i];
    } else if (s[i] == close[0] && s[i + 1] == close[1]) {
      return i;
    }
  }
  fail(line, str("a tag is not closed with '", close, "'"));
}

std::vector<Segment> segment(std::string src) {
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline off
  std::vector<Segment> out;
  std::size_t i = 0;
  int line = 1;
  bool strip_next = false;   // a "-" closed the previous tag
  bool trim_newline = false;  // trim_blocks after a block or comment tag
  const auto count_lines = [&](std::size_t a, std::size_t b) {
    line += static_cast<int>(std::count(src.begin() + static_cast<std::ptrdiff_t>(a),
                                        src.begin() + static_cast<std::ptrdiff_t>(b), '\n'));
  };
  while (i <= src.size()) {
    std::size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' &&
           src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string text = src.substr(i, open == std::string::npos ? std::string::npos : open - i);
    const int text_line = line;
    count_lines(i, open == std::string::npos ? src.size() : open);
    if (trim_newline && !text.empty() && text[0] == '\n') text.erase(0, 1);
    if (strip_next) {
      const std::size_t k = text.find_first_not_of(" \t\r\n\f\v");
      text.erase(0, k == std::string::npos ? text.size() : k);
    }
    strip_next = trim_newline = false;
    if (open != std::string::npos) {
      const char kind = src[open + 1];
      const bool minus = open + 2 < src.size() && src[open + 2] == '-';
      if (minus) {
        const std::size_t k = text.find_last_not_of(" \t\r\n\f\v");
        text.erase(k == std::string::npos ? 0 : k + 1);
      } else if (kind == '%' || kind == '#') {
        // lstrip_blocks: spaces and tabs between the start of the tag's line and the tag go.
        std::size_t j = open;
        while (j > i && (src[j - 1] == ' ' || src[j - 1] == '\t')) --j;
        if (j == 0 || src[j - 1] == '\n') text.erase(text.size() - std::min(text.size(), open - j));
      }
    }
    if (!text.empty()) {
      Segment t;
      t.kind = Segment::text;
      t.body = std::move(text);
      t.line = text_line;
      out.push_back(std::move(t));
    }
    if (open == std::string::npos) break;
    const char kind = src[open + 1];
    const std::size_t inner = open + 2 + (src[open + 2] == '-' ? 1 : 0);
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    const std::size_t end = tag_end(src, inner, close, line);
    const bool close_minus = end > inner && src[end - 1] == '-';
    const std::string body = src.substr(inner, end - inner - (close_minus ? 1 : 0));
    Segment tag;
    tag.line = line;
    if (kind != '#') {
      tag.kind = kind == '{' ? Segment::output : Segment::statement;
      tag.tokens = lex_expression(body, line);
      out.push_back(std::move(tag));
    }
    count_lines(open, end + 2);
    strip_next = close_minus;
    trim_newline = kind != '{';
    i = end + 2;
  }
  return out;
}

// ---- expressions ----

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;
struct Expr {
  enum Kind { literal, name, attr, item, slice, call, filter, test, unary, binary, cond, list_lit,
              dict_lit } kind;
  int line = 0;
  Value value;                 // literal
  std::string text;            // name, attribute, filter or test name, operator
  std::vector<ExprPtr> args;   // operands, call and filter arguments, list items, dict pairs
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;        // test: "is not"
  int depth = 1;               // of the tree under it: evaluation recurses this deep
};

// Expression trees deeper than this are refused as they are built (1 + 1 + ... grows them
// without parentheses), so that evaluating or freeing one never exhausts the stack.
constexpr int kMaxTreeDepth = 500;

class Parser {
 public:
  Parser(const std::vector<Token>& toks) : t_(toks) {}
  const Token& peek(std::size_t k = 0) const { return t_[std::min(p_ + k, t_.size() - 1)]; }
  bool at_end() const { return peek().kind == Token::end; }
  bool is_op(const char* op, std::size_t k = 0) const {
    return peek(k).kind == Token::op && peek(k).text == op;
  }
  bool is_name(const char* n, std::size_t k = 0) const {
    return peek(k).kind == Token::name && peek(k).text == n;
  }
  Token next() { return t_[std::min(p_++, t_.size() - 1)]; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(peek().line, str("expected '", op, "', found '", peek().text, "'"));
    ++p_;
  }
  std::string expect_name() {
    if (peek().kind != Token::name)
      fail(peek().line, str("expected a name, found '", peek().text, "'"));
    return next().text;
  }
  void expect_end() {
    if (!at_end()) fail(peek().line, str("unexpected '", peek().text, "'"));
  }

  ExprPtr expression() {  // the conditional expression (a if c else b) and everything under it
    const DepthGuard guard(depth_, peek().line, "expressions");  // every nesting passes here
    ExprPtr e = or_expr();
    if (is_name("if")) {
      const int line = next().line;
      ExprPtr c = or_expr();
      ExprPtr otherwise;
      if (is_name("else")) {
        next();
        otherwise = expression();
      }
      return make(Expr::cond, line, {e, c, otherwise ? otherwise : literal(Value(), line)});
    }
    return e;
  }
  // A comma-separated list without brackets becomes a tuple (a list value).
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    std::vector<ExprPtr> items{first};
    while (is_op(",")) {
      next();
      if (at_end() || is_op(")")) break;
      items.push_back(expression());
    }
    return make(Expr::list_lit, first->line, std::move(items));
  }

 private:
  static ExprPtr make(Expr::Kind k, int line, std::vector<ExprPtr> args, std::string text = {}) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line;
    for (const ExprPtr& a : args)
      if (a) e->depth = std::max(e->depth, a->depth + 1);
    if (e->depth > kMaxTreeDepth)
      fail(line, str("an expression nested deeper than ", kMaxTreeDepth));
    e->args = std::move(args);
    e->text = std::move(text);
    return e;
  }
  static ExprPtr literal(Value v, int line) {
    auto e = make(Expr::literal, line, {});
    e->value = std::move(v);
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (is_name("or")) {
      const int line = next().line;  // before the operand: argument order is unspecified
      ExprPtr rhs = and_expr();
      e = make(Expr::binary, line, {e, rhs}, "or");
    }
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (is_name("and")) {
      const int line = next().line;  // before the operand: argument order is unspecified
      ExprPtr rhs = not_expr();
      e = make(Expr::binary, line, {e, rhs}, "and");
    }
    return e;
  }
  ExprPtr not_expr() {
    std::vector<int> lines;  // a run of "not", counted, not recursed
    while (is_name("not")) {
      lines.push_back(next().line);
      if (lines.size() > static_cast<std::size_t>(kMaxDepth))
        fail(lines.back(), str("more than ", kMaxDepth, " 'not' in a row"));
    }
    ExprPtr e = compare();
    for (auto l = lines.rbegin(); l != lines.rend(); ++l) e = make(Expr::unary, *l, {e}, "not");
    return e;
  }
  ExprPtr compare() {
    ExprPtr e = concat();
    while (true) {
      const int line = peek().line;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        const std::string op = next().text;
        e = make(Expr::binary, line, {e, concat()}, op);
      } else if (is_name("in")) {
        next();
        e = make(Expr::binary, line, {e, concat()}, "in");
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        e = make(Expr::unary, line, {make(Expr::binary, line, {e, concat()}, "in")}, "not");
      } else if (is_name("is")) {
        next();
        auto t = make(Expr::test, line, {e});
        if (is_name("not")) {
          next();
          t->negated = true;
        }
        // "none", "true", "false" are test names here, not literals.
        t->text = expect_name();
        if (is_op("(")) {
          call_arguments(*t);
        } else if (!at_end() && (peek().kind == Token::string || peek().kind == Token::integer ||
                                 peek().kind == Token::real)) {
          t->args.push_back(primary());  // "is divisibleby 3"
        }
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprPtr concat() {
    ExprPtr e = additive();
    while (is_op("~")) {
      const int line = next().line;
      ExprPtr rhs = additive();
      e = make(Expr::binary, line, {e, rhs}, "~");
    }
    return e;
  }
  ExprPtr additive() {
    ExprPtr e = multiplicative();
    while (is_op("+") || is_op("-")) {
      const Token op = next();
      e = make(Expr::binary, op.line, {e, multiplicative()}, op.text);
    }
    return e;
  }
  ExprPtr multiplicative() {
    ExprPtr e = power();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token op = next();
      e = make(Expr::binary, op.line, {e, power()}, op.text);
    }
    return e;
  }
  ExprPtr power() {
    ExprPtr e = unary();
    if (is_op("**")) {
      const int line = next().line;
      ExprPtr rhs = unary();
      e = make(Expr::binary, line, {e, rhs}, "**");
    }
    return e;
  }
  ExprPtr unary() {
    std::vector<Token> signs;  // a run of signs, counted, not recursed
    while (is_op("-") || is_op("+")) {
      signs.push_back(next());
      if (signs.size() > static_cast<std::size_t>(kMaxDepth))
        fail(signs.back().line, str("more than ", kMaxDepth, " signs in a row"));
    }
    ExprPtr e = postfix(primary());
    for (auto t = signs.rbegin(); t != signs.rend(); ++t)
      e = make(Expr::unary, t->line, {e}, t->text);
    return e;
  }
  void call_arguments(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      ExprPtr arg;
      if (peek().kind == Token::name && is_op("=", 1)) {
        const std::string key = next().text;
        next();
        arg = expression();
        e.kwargs.emplace_back(key, arg);
      } else {
        arg = expression();
        e.args.push_back(arg);
      }
      e.depth = std::max(e.depth, arg->depth + 1);
      if (e.depth > kMaxTreeDepth)
        fail(e.line, str("an expression nested deeper than ", kMaxTreeDepth));
      if (!is_op(",")) break;
      next();
    }
    expect_op(")");
  }
  ExprPtr postfix(ExprPtr e) {
    while (true) {
      const int line = peek().line;
      if (is_op(".")) {
        next();
        e = make(Expr::attr, line, {e}, expect_name());
      } else if (is_op("[")) {
        next();
        std::vector<ExprPtr> parts(3);
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[static_cast<std::size_t>(k)] = expression();
          if (!is_op(":")) break;
          next();
          is_slice = true;
        }
        expect_op("]");
        if (is_slice) {
          for (auto& p : parts)
            if (!p) p = literal(Value::None(), line);
          e = make(Expr::slice, line, {e, parts[0], parts[1], parts[2]});
        } else {
          if (!parts[0]) fail(line, "an empty subscript");
          e = make(Expr::item, line, {e, parts[0]});
        }
      } else if (is_op("(")) {
        auto c = make(Expr::call, line, {e});
        call_arguments(*c);
        e = c;
      } else if (is_op("|")) {
        next();
        auto f = make(Expr::filter, line, {e}, expect_name());
        if (is_op("(")) call_arguments(*f);
        e = f;
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token t = next();
    switch (t.kind) {
      case Token::string: {
        std::string s = t.text;
        while (peek().kind == Token::string) s += next().text;  // adjacent literals join
        return literal(Value::Str(std::move(s)), t.line);
      }
      case Token::integer: {
        std::int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
          fail(t.line, str("the integer ", t.text, " is out of range"));
        return literal(Value::Int(v), t.line);
      }
      case Token::real: {
        double v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc() || r.ptr != t.text.data() + t.text.size())
          fail(t.line, str("the number ", t.text, " is out of range"));
        return literal(Value::Real(v), t.line);
      }
      case Token::name:
        if (t.text == "true" || t.text == "True") return literal(Value::Bool(true), t.line);
        if (t.text == "false" || t.text == "False") return literal(Value::Bool(false), t.line);
        if (t.text == "none" || t.text == "None") return literal(Value::None(), t.line);
        return make(Expr::name, t.line, {}, t.text);
      case Token::op:
        if (t.text == "(") {
          if (is_op(")")) {
            next();
            return make(Expr::list_lit, t.line, {});
          }
          ExprPtr e = tuple_or_expression();
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          std::vector<ExprPtr> items;
          while (!is_op("]")) {
            items.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("]");
          return make(Expr::list_lit, t.line, std::move(items));
        }
        if (t.text == "{") {
          std::vector<ExprPtr> pairs;
          while (!is_op("}")) {
            pairs.push_back(expression());
            expect_op(":");
            pairs.push_back(expression());
            if (!is_op(",")) break;
            next();
          }
          expect_op("}");
          return make(Expr::dict_lit, t.line, std::move(pairs));
        }
        break;
      case Token::end: fail(t.line, "an expression ends early");
    }
    fail(t.line, str("unexpected '", t.text, "' in an expression"));
  }

  const std::vector<Token>& t_;
  std::size_t p_ = 0;
  int depth_ = 0;
};

// ---- statements ----

struct Node;
using Body = std::vector<std::shared_ptr<Node>>;
struct Node {
  enum Kind { text_node, output, if_chain, for_loop, set } kind;
  int line = 0;
  std::string text;                                // text
  ExprPtr expr;                                    // output, for's iterable, set's value
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif (null condition: else)
  std::vector<std::string> targets;                // for's loop variables; set: name [, attr]
  ExprPtr filter;                                  // for ... if filter
  Body body, else_body;                            // for
};

class TreeBuilder {
 public:
  explicit TreeBuilder(const std::vector<Segment>& segs) : s_(segs) {}
  Body parse_all() {
    std::string stop;
    Body b = parse_body({}, stop);
    return b;
  }

 private:
  // Parses nodes until a statement whose keyword is in `stops` (returned in `stop`).
  Body parse_body(const std::vector<std::string>& stops, std::string& stop) {
    // Blocks inside blocks: bounds the recursion of parsing and of rendering.
    const DepthGuard guard(depth_, i_ < s_.size() ? s_[i_].line : 0, "blocks");
    Body out;
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_];
      if (seg.kind == Segment::text) {
        auto n = std::make_shared<Node>();
        n->kind = Node::text_node;
        n->text = seg.body;
        out.push_back(n);
        ++i_;
        continue;
      }
      Parser p(seg.tokens);
      if (seg.kind == Segment::output) {
        auto n = std::make_shared<Node>();
        n->kind = Node::output;
        n->line = seg.line;
        n->expr = p.tuple_or_expression();
        p.expect_end();
        out.push_back(n);
        ++i_;
        continue;
      }
      if (p.at_end()) fail(seg.line, "an empty statement");
      const std::string keyword = p.peek().text;
      if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) {
        stop = keyword;
        return out;
      }
      ++i_;
      p.next();
      if (keyword == "if") {
        out.push_back(parse_if(p, seg.line));
      } else if (keyword == "for") {
        out.push_back(parse_for(p, seg.line));
      } else if (keyword == "set") {
        auto n = std::make_shared<Node>();
        n->kind = Node::set;
        n->line = seg.line;
        n->targets.push_back(p.expect_name());
        if (p.is_op(".")) {
          p.next();
          n->targets.push_back(p.expect_name());
        }
        if (!p.is_op("="))
          fail(seg.line, "block assignments ({% set x %}...{% endset %}) are not supported");
        p.next();
        n->expr = p.tuple_or_expression();
        p.expect_end();
        out.push_back(n);
      } else if (keyword == "generation" || keyword == "endgeneration") {
        // Hugging Face's marker for assistant tokens in training masks: renders nothing.
      } else {
        fail(seg.line, str("'{% ", keyword, " %}' is not supported (legal: if, for, set)"));
      }
    }
    if (!stops.empty())
      fail(s_.empty() ? 1 : s_.back().line, str("'{% ", stops.back(), " %}' is missing"));
    return out;
  }

  std::shared_ptr<Node> parse_if(Parser& p, int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::if_chain;
    n->line = line;
    ExprPtr cond = p.expression();
    p.expect_end();
    while (true) {
      std::string stop;
      Body body = parse_body({"elif", "else", "endif"}, stop);
      n->branches.emplace_back(cond, std::move(body));
      Parser q(s_[i_].tokens);
      q.next();
      ++i_;
      if (stop == "endif") {
        q.expect_end();
        return n;
      }
      if (stop == "else") {
        q.expect_end();
        Body last = parse_body({"endif"}, stop);
        n->branches.emplace_back(nullptr, std::move(last));
        Parser r(s_[i_].tokens);
        r.next();
        r.expect_end();
        ++i_;
        return n;
      }
      cond = q.expression();  // elif
      q.expect_end();
    }
  }

  std::shared_ptr<Node> parse_for(Parser& p, int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::for_loop;
    n->line = line;
    n->targets.push_back(p.expect_name());
    while (p.is_op(",")) {
      p.next();
      n->targets.push_back(p.expect_name());
    }
    if (!p.is_name("in")) fail(line, "expected 'in' in the for statement");
    p.next();
    n->expr = p.expression();
    if (p.is_name("if")) {
      p.next();
      n->filter = p.expression();
    }
    if (p.is_name("recursive")) fail(line, "recursive loops are not supported");
    p.expect_end();
    std::string stop;
    n->body = parse_body({"else", "endfor"}, stop);
    Parser q(s_[i_].tokens);
    q.next();
    q.expect_end();
    ++i_;
    if (stop == "else") {
      n->else_body = parse_body({"endfor"}, stop);
      Parser r(s_[i_].tokens);
      r.next();
      r.expect_end();
      ++i_;
    }
    return n;
  }

  const std::vector<Segment>& s_;
  std::size_t i_ = 0;
  int depth_ = 0;
};

// ---- rendering ----

class Renderer {
 public:
  explicit Renderer(const Value& context) {
    scopes_.push_back(std::make_shared<Dict>());
    for (const auto& [k, v] : *context.m) set(k, v);
    // Namespaces are the only mutable values, so the only way to a reference cycle
    // ({% set ns.self = ns %}): the renderer owns them, and values refer to them without owning.
    set_global("namespace", Value::Fn([this](const Args& args, const Kwargs& kwargs) {
                 namespaces_.push_back(std::make_unique<Dict>());
                 Dict* owned = namespaces_.back().get();
                 if (!args.empty() && args[0].kind == Value::dict) *owned = *args[0].m;
                 for (const auto& [k, v] : kwargs) owned->emplace_back(k, v);
                 Value ns;
                 ns.kind = Value::dict;
                 ns.m = std::shared_ptr<Dict>(owned, [](Dict*) {});
                 ns.is_namespace = true;
                 return ns;
               }));
    set_global("range", Value::Fn([](const Args& a, const Kwargs&) {
                 std::int64_t lo = 0, hi = 0, step = 1;
                 if (a.size() == 1) hi = a[0].i;
                 if (a.size() >= 2) { lo = a[0].i; hi = a[1].i; }
                 if (a.size() == 3) step = a[2].i;
                 if (a.empty() || a.size() > 3 || step == 0)
                   throw Error(ErrorCategory::invalid_argument,
                               "chat template: range() needs 1-3 integers, step not 0");
                 List l;
                 for (std::int64_t k = lo; step > 0 ? k < hi : k > hi; k += step) {
                   if (l.size() >= kMaxRange)
                     throw Error(ErrorCategory::invalid_argument,
                                 str("chat template: range() of more than ", kMaxRange, " items"));
                   l.push_back(Value::Int(k));
                 }
                 return Value::Lst(std::move(l));
               }));
    set_global("raise_exception", Value::Fn([](const Args& a, const Kwargs&) -> Value {
                 throw Error(ErrorCategory::invalid_argument,
                             str("chat template: ",
                                 a.empty() ? std::string("raise_exception") : to_str(a[0])));
               }));
  }

  void render(const Body& body, std::string& out) {
    for (const auto& n : body) {
      if (out.size() > kMaxOutput)
        fail(n->line, str("the rendering exceeds ", kMaxOutput, " bytes"));
      switch (n->kind) {
        case Node::text_node: out += n->text; break;
        case Node::output: out += to_str(eval(*n->expr)); break;
        case Node::if_chain:
          for (const auto& [cond, b] : n->branches) {
            if (!cond || truthy(eval(*cond))) {
              render(b, out);
              break;
            }
          }
          break;
        case Node::set: {
          Value v = eval(*n->expr);
          if (n->targets.size() == 1) {
            set(n->targets[0], std::move(v));
          } else {
            Value ns = lookup(n->targets[0]);
            if (ns.kind != Value::dict || !ns.is_namespace)
              fail(n->line, str("'", n->targets[0], "' is not a namespace (set ", n->targets[0],
                                ".", n->targets[1], ")"));
            assign(*ns.m, n->targets[1], std::move(v));
          }
          break;
        }
        case Node::for_loop: render_for(*n, out); break;
      }
    }
  }

 private:
  static void assign(Dict& d, const std::string& key, Value v) {
    for (auto& [k, x] : d)
      if (k == key) {
        x = std::move(v);
        return;
      }
    d.emplace_back(key, std::move(v));
  }
  void set(const std::string& name, Value v) { assign(*scopes_.back(), name, std::move(v)); }
  void set_global(const std::string& name, Value v) {
    for (const auto& [k, x] : *scopes_.front())
      if (k == name) return;  // a context variable of that name wins
    assign(*scopes_.front(), name, std::move(v));
  }
  Value lookup(const std::string& name) const {
    for (auto s = scopes_.rbegin(); s != scopes_.rend(); ++s)
      for (const auto& [k, v] : **s)
        if (k == name) return v;
    return Value();
  }

  void render_for(const Node& n, std::string& out) {
    const Value seq = eval(*n.expr);
    List items;
    if (seq.kind == Value::list) {
      items = *seq.l;
    } else if (seq.kind == Value::dict) {
      for (const auto& [k, v] : *seq.m) items.push_back(Value::Str(k));
    } else if (seq.kind == Value::string) {
      items = characters(seq.s);
    } else if (seq.kind != Value::undefined && seq.kind != Value::none) {
      fail(n.line, str("cannot loop over a ", kind_name(seq)));
    }
    scopes_.push_back(std::make_shared<Dict>());
    const auto bind = [&](const Value& item) {
      if (n.targets.size() == 1) {
        set(n.targets[0], item);
        return;
      }
      if (item.kind != Value::list || item.l->size() != n.targets.size())
        fail(n.line,
             str("cannot unpack a ", kind_name(item), " into ", n.targets.size(), " names"));
      for (std::size_t k = 0; k < n.targets.size(); ++k) set(n.targets[k], (*item.l)[k]);
    };
    if (n.filter) {
      List kept;
      for (const Value& item : items) {
        bind(item);
        if (truthy(eval(*n.filter))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    for (std::size_t k = 0; k < items.size(); ++k) {
      if (++iterations_ > kMaxIterations)
        fail(n.line, str("more than ", kMaxIterations, " loop iterations in one rendering"));
      bind(items[k]);
      const auto len = static_cast<std::int64_t>(items.size()), at = static_cast<std::int64_t>(k);
      Dict loop{{"index", Value::Int(at + 1)},
                {"index0", Value::Int(at)},
                {"revindex", Value::Int(len - at)},
                {"revindex0", Value::Int(len - at - 1)},
                {"first", Value::Bool(k == 0)},
                {"last", Value::Bool(k + 1 == items.size())},
                {"length", Value::Int(len)},
                {"previtem", k > 0 ? items[k - 1] : Value()},
                {"nextitem", k + 1 < items.size() ? items[k + 1] : Value()}};
      set("loop", Value::Dct(std::move(loop)));
      render(n.body, out);
    }
    scopes_.pop_back();
    if (items.empty()) render(n.else_body, out);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::literal: return e.value;
      case Expr::name: return lookup(e.text);
      case Expr::list_lit: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return Value::Lst(std::move(l));
      }
      case Expr::dict_lit: {
        Dict d;
        for (std::size_t k = 0; k + 1 < e.args.size(); k += 2) {
          const Value key = eval(*e.args[k]);
          if (key.kind != Value::string) fail(e.line, "dict keys must be strings");
          assign(d, key.s, eval(*e.args[k + 1]));
        }
        return Value::Dct(std::move(d));
      }
      case Expr::attr: return attribute(eval(*e.args[0]), e.text, e.line);
      case Expr::item: return item(eval(*e.args[0]), eval(*e.args[1]), e.line);
      case Expr::slice: return slice(eval(*e.args[0]), eval(*e.args[1]), eval(*e.args[2]),
                                     eval(*e.args[3]), e.line);
      case Expr::call: {
        const Value f = eval(*e.args[0]);
        if (f.kind != Value::function) fail(e.line, str("a ", kind_name(f), " is not callable"));
        Args args;
        for (std::size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
        Kwargs kwargs;
        for (const auto& [k, v] : e.kwargs) kwargs.emplace_back(k, eval(*v));
        return (*f.f)(args, kwargs);
      }
      case Expr::filter: return filter(e);
      case Expr::test: {
        const bool r = test(e);
        return Value::Bool(e.negated ? !r : r);
      }
      case Expr::unary: {
        const Value v = eval(*e.args[0]);
        if (e.text == "not") return Value::Bool(!truthy(v));
        if (!v.numeric()) fail(e.line, str("unary ", e.text, " on a ", kind_name(v)));
        if (e.text == "+") return v;
        if (v.kind == Value::real) return Value::Real(-v.d);
        std::int64_t r = 0;
        if (__builtin_sub_overflow(std::int64_t{0},
                                   v.kind == Value::boolean ? std::int64_t{v.b} : v.i, &r))
          fail(e.line, "integer overflow");
        return Value::Int(r);
      }
      case Expr::cond: return truthy(eval(*e.args[1])) ? eval(*e.args[0]) : eval(*e.args[2]);
      case Expr::binary: return binary(e);
    }
    fail(e.line, "an unknown expression");
  }

  Value binary(const Expr& e) {
    const std::string& op = e.text;
    if (op == "and") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? eval(*e.args[1]) : a;
    }
    if (op == "or") {
      Value a = eval(*e.args[0]);
      return truthy(a) ? a : eval(*e.args[1]);
    }
    const Value a = eval(*e.args[0]), b = eval(*e.args[1]);
    if (op == "==") return Value::Bool(equal(a, b));
    if (op == "!=") return Value::Bool(!equal(a, b));
    if (op == "~") return Value::Str(to_str(a) + to_str(b));
    if (op == "in") {
      if (b.kind == Value::string) {
        if (a.kind != Value::string) fail(e.line, "'in <string>' needs a string on the left");
        return Value::Bool(b.s.find(a.s) != std::string::npos);
      }
      if (b.kind == Value::list) {
        for (const Value& x : *b.l)
          if (equal(a, x)) return Value::Bool(true);
        return Value::Bool(false);
      }
      if (b.kind == Value::dict) return Value::Bool(a.kind == Value::string && b.find(a.s));
      if (b.kind == Value::undefined || b.kind == Value::none) return Value::Bool(false);
      fail(e.line, str("'in' a ", kind_name(b)));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.numeric() && b.numeric()) {
        c = a.as_real() < b.as_real() ? -1 : a.as_real() > b.as_real() ? 1 : 0;
      } else if (a.kind == Value::string && b.kind == Value::string) {
        c = a.s.compare(b.s);
      } else {
        fail(e.line, str("cannot compare a ", kind_name(a), " with a ", kind_name(b)));
      }
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.kind == Value::string && b.kind == Value::string) return Value::Str(a.s + b.s);
      if (a.kind == Value::list && b.kind == Value::list) {
        List l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return Value::Lst(std::move(l));
      }
    }
    if (op == "*" && a.kind == Value::string && b.kind == Value::integer) {
      if (b.i > 0 &&
          a.s.size() * static_cast<std::size_t>(std::min<std::int64_t>(b.i, kMaxOutput)) >
              kMaxOutput)
        fail(e.line, str("a string repeated past ", kMaxOutput, " bytes"));
      std::string s;
      for (std::int64_t k = 0; k < b.i; ++k) s += a.s;
      return Value::Str(std::move(s));
    }
    if (!a.numeric() || !b.numeric())
      fail(e.line, str("'", op, "' between a ", kind_name(a), " and a ", kind_name(b)));
    const bool ints = a.kind != Value::real && b.kind != Value::real;
    const std::int64_t x = a.kind == Value::boolean ? a.b : a.i,
                       y = b.kind == Value::boolean ? b.b : b.i;
    std::int64_t r = 0;
    const auto checked = [&](bool overflow) {
      if (overflow) fail(e.line, str("integer overflow in '", op, "'"));
      return Value::Int(r);
    };
    if (op == "+")
      return ints ? checked(__builtin_add_overflow(x, y, &r))
                  : Value::Real(a.as_real() + b.as_real());
    if (op == "-")
      return ints ? checked(__builtin_sub_overflow(x, y, &r))
                  : Value::Real(a.as_real() - b.as_real());
    if (op == "*")
      return ints ? checked(__builtin_mul_overflow(x, y, &r))
                  : Value::Real(a.as_real() * b.as_real());
    if (op == "/") {
      if (b.as_real() == 0) fail(e.line, "division by zero");
      return Value::Real(a.as_real() / b.as_real());
    }
    if (op == "//" || op == "%") {
      if (b.as_real() == 0) fail(e.line, "division by zero");
      if (ints) {
        if (x == INT64_MIN && y == -1) fail(e.line, "integer overflow");
        std::int64_t q = x / y, rem = x % y;
        if (rem != 0 && ((rem < 0) != (y < 0))) { --q; rem += y; }  // Python floors
        return Value::Int(op == "//" ? q : rem);
      }
      const double q = std::floor(a.as_real() / b.as_real());
      return Value::Real(op == "//" ? q : a.as_real() - q * b.as_real());
    }
    if (op == "**") {
      if (ints && y >= 0) {
        if (x == 0 || x == 1) return Value::Int(y == 0 ? 1 : x);
        if (x == -1) return Value::Int(y % 2 ? -1 : 1);
        std::int64_t p = 1;  // |x| >= 2 overflows within 63 steps
        for (std::int64_t k = 0; k < y; ++k)
          if (__builtin_mul_overflow(p, x, &p)) fail(e.line, "integer overflow in '**'");
        return Value::Int(p);
      }
      return Value::Real(std::pow(a.as_real(), b.as_real()));
    }
    fail(e.line, str("unknown operator '", op, "'"));
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Value::dict) {
      if (key.kind != Value::string) return Value();
      const Value* v = obj.find(key.s);
      return v ? *v : Value();
    }
    if ((obj.kind == Value::list || obj.kind == Value::string) && key.kind == Value::integer) {
      const List chars = obj.kind == Value::string ? characters(obj.s) : List();
      const List& seq = obj.kind == Value::list ? *obj.l : chars;
      const auto n = static_cast<std::int64_t>(seq.size());
      const std::int64_t k = key.i < 0 ? key.i + n : key.i;
      if (k < 0 || k >= n) return Value();
      return seq[static_cast<std::size_t>(k)];
    }
    if (obj.kind == Value::undefined || obj.kind == Value::none)
      fail(line, str("cannot index a ", kind_name(obj), " (with ", repr(key), ")"));
    if (key.kind == Value::string) return attribute(obj, key.s, line);
    return Value();
  }

  Value slice(const Value& obj, const Value& a, const Value& b, const Value& c, int line) {
    const std::int64_t step = c.kind == Value::integer ? c.i : 1;
    if (step == 0) fail(line, "slice step 0");
    List src;
    if (obj.kind == Value::list) {
      src = *obj.l;
    } else if (obj.kind == Value::string) {
      src = characters(obj.s);
    } else {
      fail(line, str("cannot slice a ", kind_name(obj)));
    }
    const auto n = static_cast<std::int64_t>(src.size());
    const auto clamp = [&](const Value& v, std::int64_t fallback) {
      if (v.kind != Value::integer) return fallback;
      std::int64_t k = v.i < 0 ? v.i + n : v.i;
      return step > 0 ? std::clamp<std::int64_t>(k, 0, n) : std::clamp<std::int64_t>(k, -1, n - 1);
    };
    const std::int64_t lo = clamp(a, step > 0 ? 0 : n - 1), hi = clamp(b, step > 0 ? n : -1);
    List out;
    for (std::int64_t k = lo; step > 0 ? k < hi : k > hi; k += step)
      out.push_back(src[static_cast<std::size_t>(k)]);
    if (obj.kind == Value::string) {
      std::string s;
      for (const Value& v : out) s += v.s;
      return Value::Str(std::move(s));
    }
    return Value::Lst(std::move(out));
  }

  // obj.name: a dict's key, or a method of a string or dict (bound), or undefined.
  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Value::dict) {
      if (const Value* v = obj.find(name)) return *v;
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        const Value self = obj;
        return Value::Fn([self, name](const Args& a, const Kwargs&) {
          if (name == "get") {
            const Value* v = a.empty() || a[0].kind != Value::string ? nullptr : self.find(a[0].s);
            return v ? *v : (a.size() > 1 ? a[1] : Value::None());
          }
          List l;
          for (const auto& [k, v] : *self.m) {
            if (name == "items") l.push_back(Value::Lst({Value::Str(k), v}));
            if (name == "keys") l.push_back(Value::Str(k));
            if (name == "values") l.push_back(v);
          }
          return Value::Lst(std::move(l));
        });
      }
      return Value();
    }
    if (obj.kind == Value::string) {
      const std::string s = obj.s;
      static const char* const methods[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title",
                                            "capitalize", "startswith", "endswith", "split",
                                            "replace", "find", "count"};
      if (std::find_if(std::begin(methods), std::end(methods),
                       [&](const char* m) { return name == m; }) == std::end(methods))
        fail(line, str("strings have no method '", name, "' here"));
      return Value::Fn([s, name, line](const Args& a, const Kwargs&) {
        return string_method(s, name, a, line);
      });
    }
    if (obj.kind == Value::undefined || obj.kind == Value::none) {
      if (obj.kind == Value::none) fail(line, str("none has no attribute '", name, "'"));
      return Value();
    }
    return Value();
  }

  static Value string_method(const std::string& s, const std::string& name, const Args& a,
                             int line) {
    const std::string ws = " \t\n\r\f\v";
    const std::string chars = !a.empty() && a[0].kind == Value::string ? a[0].s : ws;
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      std::size_t b = 0, e = s.size();
      if (name != "rstrip") while (b < e && chars.find(s[b]) != std::string::npos) ++b;
      if (name != "lstrip") while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
      return Value::Str(s.substr(b, e - b));
    }
    if (name == "upper" || name == "lower") {
      std::string r = s;
      for (char& c : r)
        c = static_cast<char>(name == "upper" ? std::toupper(static_cast<unsigned char>(c))
                                              : std::tolower(static_cast<unsigned char>(c)));
      return Value::Str(r);
    }
    if (name == "capitalize" || name == "title") {
      std::string r = s;
      bool start = true;
      for (std::size_t k = 0; k < r.size(); ++k) {
        const auto c = static_cast<unsigned char>(r[k]);
        if (name == "capitalize")
          r[k] = static_cast<char>(k == 0 ? std::toupper(c) : std::tolower(c));
        else {
          r[k] = static_cast<char>(start ? std::toupper(c) : std::tolower(c));
          start = !std::isalpha(c);
        }
      }
      return Value::Str(r);
    }
    if (name == "startswith" || name == "endswith") {
      if (a.empty() || a[0].kind != Value::string) fail(line, str(name, "() needs a string"));
      const std::string& p = a[0].s;
      const bool r = p.size() <= s.size() &&
                     (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                           : s.compare(s.size() - p.size(), p.size(), p) == 0);
      return Value::Bool(r);
    }
    if (name == "split") {
      List out;
      if (a.empty() || a[0].kind != Value::string) {  // on runs of whitespace
        std::size_t k = 0;
        while (k < s.size()) {
          while (k < s.size() && ws.find(s[k]) != std::string::npos) ++k;
          std::size_t e = k;
          while (e < s.size() && ws.find(s[e]) == std::string::npos) ++e;
          if (e > k) out.push_back(Value::Str(s.substr(k, e - k)));
          k = e;
        }
      } else {
        const std::string& sep = a[0].s;
        if (sep.empty()) fail(line, "split() with an empty separator");
        std::size_t k = 0;
        while (true) {
          const std::size_t e = s.find(sep, k);
          out.push_back(
              Value::Str(s.substr(k, e == std::string::npos ? std::string::npos : e - k)));
          if (e == std::string::npos) break;
          k = e + sep.size();
        }
      }
      return Value::Lst(std::move(out));
    }
    if (name == "replace") {
      if (a.size() < 2 || a[0].kind != Value::string || a[1].kind != Value::string ||
          a[0].s.empty())
        fail(line, "replace() needs two strings, the first not empty");
      std::string r;
      std::size_t k = 0;
      while (true) {
        const std::size_t e = s.find(a[0].s, k);
        r += s.substr(k, e == std::string::npos ? std::string::npos : e - k);
        if (e == std::string::npos) break;
        r += a[1].s;
        k = e + a[0].s.size();
      }
      return Value::Str(r);
    }
    if (name == "find" || name == "count") {
      if (a.empty() || a[0].kind != Value::string) fail(line, str(name, "() needs a string"));
      if (name == "find") {
        const std::size_t e = s.find(a[0].s);
        return Value::Int(e == std::string::npos ? -1 : static_cast<std::int64_t>(e));
      }
      std::int64_t n = 0;
      if (!a[0].s.empty())
        for (std::size_t k = s.find(a[0].s); k != std::string::npos;
             k = s.find(a[0].s, k + a[0].s.size()))
          ++n;
      return Value::Int(n);
    }
    fail(line, str("strings have no method '", name, "'"));
  }

  bool test(const Expr& e) {
    const std::string& t = e.text;
    if (t == "defined") return eval(*e.args[0]).kind != Value::undefined;
    if (t == "undefined") return eval(*e.args[0]).kind == Value::undefined;
    const Value v = eval(*e.args[0]);
    if (t == "none") return v.kind == Value::none;
    if (t == "string") return v.kind == Value::string;
    if (t == "number") return v.kind == Value::integer || v.kind == Value::real;
    if (t == "integer") return v.kind == Value::integer;
    if (t == "float") return v.kind == Value::real;
    if (t == "boolean") return v.kind == Value::boolean;
    if (t == "true") return v.kind == Value::boolean && v.b;
    if (t == "false") return v.kind == Value::boolean && !v.b;
    if (t == "mapping") return v.kind == Value::dict;
    if (t == "sequence") return v.kind == Value::list || v.kind == Value::string;
    if (t == "iterable")
      return v.kind == Value::list || v.kind == Value::string || v.kind == Value::dict;
    if (t == "callable") return v.kind == Value::function;
    if (t == "odd" || t == "even") {
      if (v.kind != Value::integer) fail(e.line, str("'is ", t, "' on a ", kind_name(v)));
      return (v.i % 2 != 0) == (t == "odd");
    }
    if (t == "eq" || t == "equalto" || t == "ne" || t == "sameas") {
      if (e.args.size() < 2) fail(e.line, str("'is ", t, "' needs a value"));
      const bool same = equal(v, eval(*e.args[1]));
      return t == "ne" ? !same : same;
    }
    fail(e.line, str("the test 'is ", t, "' is not supported"));
  }

  Value filter(const Expr& e) {
    const std::string& f = e.text;
    const Value v = eval(*e.args[0]);
    Args a;
    for (std::size_t k = 1; k < e.args.size(); ++k) a.push_back(eval(*e.args[k]));
    Kwargs kwargs;
    for (const auto& [k, x] : e.kwargs) kwargs.emplace_back(k, eval(*x));
    const auto kwarg = [&](const char* key) -> const Value* {
      for (const auto& [k, x] : kwargs)
        if (k == key) return &x;
      return nullptr;
    };
    if (f == "length" || f == "count") {
      if (v.kind == Value::string) {
        std::int64_t n = 0;
        for (unsigned char c : v.s) n += (c & 0xC0) != 0x80;  // characters, not bytes
        return Value::Int(n);
      }
      if (v.kind == Value::list) return Value::Int(static_cast<std::int64_t>(v.l->size()));
      if (v.kind == Value::dict) return Value::Int(static_cast<std::int64_t>(v.m->size()));
      fail(e.line, str("length of a ", kind_name(v)));
    }
    if (f == "trim") return string_method(to_str(v), "strip", a, e.line);
    if (f == "upper" || f == "lower" || f == "capitalize" || f == "title")
      return string_method(to_str(v), f, {}, e.line);
    if (f == "replace") return string_method(to_str(v), "replace", a, e.line);
    if (f == "string") return Value::Str(to_str(v));
    if (f == "safe" || f == "e" || f == "escape") {
      if (f != "safe")
        fail(e.line, "the 'escape' filter is not supported (chat templates render unescaped)");
      return v;
    }
    if (f == "int") {
      if (v.kind == Value::real) {
        if (!(std::fabs(v.d) < 9.2e18)) fail(e.line, "int() of a float out of range");
        return Value::Int(static_cast<std::int64_t>(v.d));
      }
      if (v.kind == Value::string) {
        try {
          return Value::Int(std::stoll(v.s));
        } catch (const std::exception&) {
          return Value::Int(0);
        }
      }
      return Value::Int(v.kind == Value::integer ? v.i : v.kind == Value::boolean ? v.b : 0);
    }
    if (f == "float") return Value::Real(v.numeric() ? v.as_real() : 0.0);
    if (f == "tojson") {
      const Value* indent = kwarg("indent");
      if (!indent && !a.empty()) indent = &a[0];
      std::string out;
      dump_json(v, out, indent && indent->kind == Value::integer ? static_cast<int>(indent->i) : -1,
                0);
      return Value::Str(out);
    }
    if (f == "default" || f == "d") {
      const bool boolean =
          (a.size() > 1 && truthy(a[1])) || (kwarg("boolean") && truthy(*kwarg("boolean")));
      const bool use_default = v.kind == Value::undefined || (boolean && !truthy(v));
      return use_default ? (a.empty() ? Value::Str("") : a[0]) : v;
    }
    if (f == "items") return attribute(v, "items", e.line).kind == Value::function
                                 ? (*attribute(v, "items", e.line).f)({}, {})
                                 : Value::Lst({});
    List items;
    if (v.kind == Value::list) items = *v.l;
    else if (v.kind == Value::dict) for (const auto& [k, x] : *v.m) items.push_back(Value::Str(k));
    else if (v.kind == Value::string) items = characters(v.s);
    else if (v.kind != Value::undefined && v.kind != Value::none)
      fail(e.line, str("'|", f, "' on a ", kind_name(v)));
    if (f == "list") return Value::Lst(items);
    if (f == "first") return items.empty() ? Value() : items.front();
    if (f == "last") return items.empty() ? Value() : items.back();
    if (f == "reverse") {
      std::reverse(items.begin(), items.end());
      if (v.kind == Value::string) {
        std::string s;
        for (const Value& x : items) s += x.s;
        return Value::Str(s);
      }
      return Value::Lst(items);
    }
    if (f == "join") {
      const std::string sep = !a.empty() ? to_str(a[0]) : "";
      const Value* attr = kwarg("attribute");
      std::string out;
      for (std::size_t k = 0; k < items.size(); ++k)
        out += (k ? sep : "") + to_str(attr ? item(items[k], *attr, e.line) : items[k]);
      return Value::Str(out);
    }
    if (f == "map") {
      const Value* attr = kwarg("attribute");
      List out;
      for (const Value& x : items) {
        if (attr) out.push_back(item(x, *attr, e.line));
        else if (!a.empty() && a[0].kind == Value::string) {
          Expr call;
          call.kind = Expr::filter;
          call.line = e.line;
          call.text = a[0].s;
          auto lit = std::make_shared<Expr>();
          lit->kind = Expr::literal;
          lit->value = x;
          call.args.push_back(lit);
          out.push_back(filter(call));
        } else fail(e.line, "map() needs attribute= or a filter name");
      }
      return Value::Lst(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr" || f == "select" || f == "reject") {
      const bool attr_form = f == "selectattr" || f == "rejectattr";
      const bool keep = f == "selectattr" || f == "select";
      std::size_t at = 0;
      Value key;
      if (attr_form) {
        if (a.empty()) fail(e.line, str(f, "() needs an attribute name"));
        key = a[at++];
      }
      List out;
      for (const Value& x : items) {
        const Value subject = attr_form ? item(x, key, e.line) : x;
        bool r = truthy(subject);
        if (at < a.size()) {
          Expr t;
          t.kind = Expr::test;
          t.line = e.line;
          t.text = to_str(a[at]);
          auto lit = std::make_shared<Expr>();
          lit->kind = Expr::literal;
          lit->value = subject;
          t.args.push_back(lit);
          for (std::size_t k = at + 1; k < a.size(); ++k) {
            auto arg = std::make_shared<Expr>();
            arg->kind = Expr::literal;
            arg->value = a[k];
            t.args.push_back(arg);
          }
          r = test(t);
        }
        if (r == keep) out.push_back(x);
      }
      return Value::Lst(std::move(out));
    }
    if (f == "unique") {
      List out;
      for (const Value& x : items)
        if (std::none_of(out.begin(), out.end(), [&](const Value& y) { return equal(x, y); }))
          out.push_back(x);
      return Value::Lst(std::move(out));
    }
    fail(e.line, str("the filter '|", f, "' is not supported"));
  }

  std::vector<std::unique_ptr<Dict>> namespaces_;  // first: destroyed after the scopes
  std::vector<std::shared_ptr<Dict>> scopes_;
  std::size_t iterations_ = 0;
};

}  // namespace

struct ChatTemplate::Impl {
  Body body;
};

ChatTemplate::ChatTemplate(const std::string& source) : impl_(std::make_unique<Impl>()) {
  const std::vector<Segment> segs = segment(source);
  impl_->body = TreeBuilder(segs).parse_all();
}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

std::string ChatTemplate::render(const std::string& context_json) const {
  ordered_json j;
  try {
    j = ordered_json::parse(context_json);
  } catch (const ordered_json::exception& e) {
    throw Error(ErrorCategory::invalid_argument,
                str("chat template context is not valid JSON: ", e.what()));
  }
  DCP_ARG_CHECK(j.is_object(), "chat template context must be a JSON object");
  Renderer r(from_json(j));
  std::string out;
  r.render(impl_->body, out);
  return out;
}

std::string apply_chat_template(const Tokenizer& tokenizer, const std::string& context_json,
                                bool add_generation_prompt) {
  DCP_ARG_CHECK(tokenizer.chat_template().has_value(),
                "the tokenizer has no chat_template (tokenizer_config.json)");
  nlohmann::ordered_json context;  // keys keep their order: templates iterate dicts
  try {
    context = nlohmann::ordered_json::parse(context_json);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorCategory::invalid_argument, str("chat messages are not JSON: ", e.what()));
  }
  if (context.is_array()) context = nlohmann::ordered_json{{"messages", context}};
  DCP_ARG_CHECK(context.is_object() && context.contains("messages") &&
                    context["messages"].is_array(),
                "chat input must be a list of messages or an object with 'messages'");
  // As apply_chat_template passes them: the special tokens' text and the generation flag.
  context["bos_token"] = tokenizer.bos_token();
  context["eos_token"] = tokenizer.eos_token();
  if (!context.contains("add_generation_prompt"))
    context["add_generation_prompt"] = add_generation_prompt;
  return ChatTemplate(*tokenizer.chat_template()).render(context.dump());
}

}  // namespace dcp
