#include "syntax.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "dcp/tokenizer.h"

namespace dcp::jinja {
namespace {

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
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
      continue;
    }
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
            case 'a': s += '\a'; break;
            case 'x':
            case 'u':
            case 'U': {  // Python's \xHH, \uHHHH and \UHHHHHHHH
              const std::size_t digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
              std::uint32_t cp = 0;
              const auto r = std::from_chars(
                  src.data() + j + 2, src.data() + std::min(src.size(), j + 2 + digits), cp, 16);
              if (r.ec != std::errc() || r.ptr != src.data() + j + 2 + digits)
                fail(line, str("'\\", std::string(1, e), "' needs ", digits, " hex digits"));
              if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
                fail(line, "a string literal's escape is not a Unicode scalar value");
              append_utf8(s, static_cast<char32_t>(cp));
              j += 2 + digits;
              continue;
            }
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
      static const char* const ops[] = {"==", "!=", "<=", ">=", "//", "**", "+", "-", "*",
                                        "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                        "(",  ")",  "[",  "]",  "{",  "}",  "|"};
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

// The end of a tag opened at `from` ("}}", "%}" or "#}"), skipping string literals and, as
// Jinja's lexer does, brackets still open ({{ {'a': {}} }} ends at the last "}}").
std::size_t tag_end(const std::string& s, std::size_t from, const char* close, int line) {
  const bool comment = close[0] == '#';
  char quote = 0;
  int open = 0;
  for (std::size_t i = from; i + 1 < s.size(); ++i) {
    if (comment) {
      if (s[i] == close[0] && s[i + 1] == close[1]) return i;
    } else if (quote) {
      if (s[i] == '\\')
        ++i;
      else if (s[i] == quote)
        quote = 0;
    } else if (s[i] == '\'' || s[i] == '"') {
      quote = s[i];
    } else if (open == 0 && s[i] == close[0] && s[i + 1] == close[1]) {
      return i;
    } else if (s[i] == '(' || s[i] == '[' || s[i] == '{') {
      ++open;
    } else if ((s[i] == ')' || s[i] == ']' || s[i] == '}') && open > 0) {
      --open;
    }
  }
  fail(line, str("a tag is not closed with '", close, "'"));
}

std::vector<Segment> segment(std::string src) {
  if (!src.empty() && src.back() == '\n') src.pop_back();  // keep_trailing_newline off
  std::vector<Segment> out;
  std::size_t i = 0;
  int line = 1;
  bool strip_next = false;    // a "-" closed the previous tag
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
  // An expression without the conditional form at its top, as a for loop's iterable: the `if` of
  // `{% for x in xs if x %}` filters the items.
  ExprPtr expression_without_condition() {
    const DepthGuard guard(depth_, peek().line, "expressions");
    return or_expr();
  }
  // A comma-separated list without brackets becomes a tuple.
  ExprPtr tuple_or_expression() {
    ExprPtr first = expression();
    if (!is_op(",")) return first;
    std::vector<ExprPtr> items{first};
    while (is_op(",")) {
      next();
      if (at_end() || is_op(")")) break;
      items.push_back(expression());
    }
    return make(Expr::list_lit, first->line, std::move(items), "tuple");
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
                                 peek().kind == Token::real || is_op("[") || is_op("{") ||
                                 (peek().kind == Token::name && !is_name("else") &&
                                  !is_name("or") && !is_name("and")))) {
          // As Jinja: one argument without parentheses ("is divisibleby 3", "is in [1, 2]",
          // "is sameas none"), with what follows it (an attribute, a subscript).
          if (is_name("is")) fail(line, "tests cannot be chained with 'is'");
          t->args.push_back(postfix(primary(), false));
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
  ExprPtr power() {  // left to right, as Jinja's: 2 ** 3 ** 2 is 64
    ExprPtr e = unary();
    while (is_op("**")) {
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
    if (signs.empty()) return postfix(primary());
    // As Jinja parses it: a sign binds tighter than a filter (-3|abs is 3), looser than an
    // attribute, a subscript or a call.
    ExprPtr e = postfix(primary(), false);
    for (auto t = signs.rbegin(); t != signs.rend(); ++t)
      e = make(Expr::unary, t->line, {e}, t->text);
    return postfix(e);
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
  ExprPtr postfix(ExprPtr e, bool filters = true) {
    bool filtered = false;  // Jinja reads no attribute or subscript after a filter
    while (true) {
      const int line = peek().line;
      if (filtered && (is_op(".") || is_op("[")))
        fail(line, str("'", peek().text,
                       "' after a filter (Jinja reads none there; put the "
                       "filtered value in parentheses)"));
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
      } else if (is_op("|") && filters) {
        next();
        std::string name = expect_name();
        while (is_op(".")) {  // as Jinja reads |a.b: one (dotted) filter name
          next();
          name += '.';
          name += expect_name();
        }
        auto f = make(Expr::filter, line, {e}, name);
        filtered = true;
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
            return make(Expr::list_lit, t.line, {}, "tuple");
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
        if (p.is_op("=")) {
          p.next();
          n->expr = p.tuple_or_expression();
          p.expect_end();
        } else {  // {% set x %}...{% endset %}: the body's text
          if (!p.at_end())
            fail(seg.line, "a block assignment takes no filter here: {% set x %}...{% endset %}");
          std::string endset;
          n->body = parse_body({"endset"}, endset);
          Parser q(s_[i_].tokens);
          q.next();
          q.expect_end();
          out.push_back(n);
          ++i_;
          continue;
        }
        out.push_back(n);
      } else if (keyword == "macro") {
        out.push_back(parse_macro(p, seg.line));
      } else if (keyword == "call") {
        out.push_back(parse_call(p, seg.line));
      } else if (keyword == "break" || keyword == "continue") {
        // Hugging Face renders with Jinja's loop controls on.
        p.expect_end();
        if (loops_ == 0) fail(seg.line, str("'{% ", keyword, " %}' outside a loop"));
        auto n = std::make_shared<Node>();
        n->kind = keyword == "break" ? Node::loop_break : Node::loop_continue;
        n->line = seg.line;
        out.push_back(n);
      } else if (keyword == "generation" || keyword == "endgeneration") {
        // Hugging Face's marker for assistant tokens in training masks: renders nothing.
      } else {
        fail(seg.line,
             str("'{% ", keyword,
                 " %}' is not supported (legal: if, for, set, macro, call, break, continue)"));
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
    n->expr = p.expression_without_condition();
    if (p.is_name("if")) {
      p.next();
      n->filter = p.expression();
    }
    if (p.is_name("recursive")) fail(line, "recursive loops are not supported");
    p.expect_end();
    std::string stop;
    ++loops_;
    n->body = parse_body({"else", "endfor"}, stop);
    --loops_;  // a break in the else block ends an enclosing loop, as in Jinja
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

  // {% call [(a, b=default, ...)] macro(...) %}...{% endcall %}: the macro called with `caller`,
  // a macro of those parameters whose body is the block's, run where the block is.
  std::shared_ptr<Node> parse_call(Parser& p, int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::call_block;
    n->line = line;
    auto c = std::make_shared<Node>();
    c->kind = Node::macro;
    c->line = line;
    c->text = "caller";
    if (p.is_op("(")) parse_parameters(p, *c);
    n->expr = p.expression();
    if (n->expr->kind != Expr::call) fail(line, "{% call %} must call a macro: {% call m(...) %}");
    p.expect_end();
    parse_macro_body(*c, "endcall");
    n->caller_macro = c;
    return n;
  }

  // {% macro name(a, b=default, ...) %}...{% endmacro %}
  std::shared_ptr<Node> parse_macro(Parser& p, int line) {
    auto n = std::make_shared<Node>();
    n->kind = Node::macro;
    n->line = line;
    n->text = p.expect_name();
    parse_parameters(p, *n);
    p.expect_end();
    parse_macro_body(*n, "endmacro");
    return n;
  }

  // "(a, b=default, ...)" into the macro's targets and defaults.
  void parse_parameters(Parser& p, Node& macro) {
    Node* n = &macro;
    const int line = macro.line;
    p.expect_op("(");
    while (!p.is_op(")")) {
      std::string name = p.expect_name();
      if (std::find(n->targets.begin(), n->targets.end(), name) != n->targets.end())
        fail(line, str("the macro '", n->text, "' names its parameter '", name, "' twice"));
      ExprPtr fallback;
      if (p.is_op("=")) {
        p.next();
        fallback = p.expression();
      } else if (!n->defaults.empty() && n->defaults.back()) {
        fail(line, str("the macro '", n->text, "': parameter '", name,
                       "' without a default follows one with a default"));
      }
      n->targets.push_back(std::move(name));
      n->defaults.push_back(std::move(fallback));
      if (!p.is_op(",")) break;
      p.next();
    }
    p.expect_op(")");
  }

  // The body up to `stop` (endmacro, endcall), and what it reads of the implicit arguments.
  void parse_macro_body(Node& n, const char* stop_keyword) {
    const int enclosing_loops = loops_;
    loops_ = 0;  // a loop around the definition is not around the body
    std::string stop;
    n.body = parse_body({stop_keyword}, stop);
    loops_ = enclosing_loops;
    Parser q(s_[i_].tokens);
    q.next();
    q.expect_end();
    ++i_;
    // As Jinja: a macro takes extra arguments (and a caller) only if its body reads them.
    n.varargs = reads_name(n.body, "varargs");
    n.kwargs = reads_name(n.body, "kwargs");
    n.caller = reads_name(n.body, "caller");
  }

  static bool reads_name(const Expr* e, const std::string& name) {
    if (!e) return false;
    if (e->kind == Expr::name && e->text == name) return true;
    for (const ExprPtr& a : e->args)
      if (reads_name(a.get(), name)) return true;
    for (const auto& [key, a] : e->kwargs)
      if (reads_name(a.get(), name)) return true;
    return false;
  }
  static bool reads_name(const Body& body, const std::string& name) {
    for (const auto& n : body) {
      bool found = reads_name(n->expr.get(), name) || reads_name(n->filter.get(), name) ||
                   reads_name(n->body, name) || reads_name(n->else_body, name);
      for (const auto& [cond, b] : n->branches)
        found = found || reads_name(cond.get(), name) || reads_name(b, name);
      for (const ExprPtr& d : n->defaults) found = found || reads_name(d.get(), name);
      if (found) return true;
    }
    return false;
  }

  const std::vector<Segment>& s_;
  std::size_t i_ = 0;
  int depth_ = 0;
  int loops_ = 0;  // for bodies around the statement being parsed (a break needs one)
};

}  // namespace

Body parse(const std::string& source) {
  return TreeBuilder(segment(source)).parse_all();
}

}  // namespace dcp::jinja
