#include "render.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <limits>
#include <memory>
#include <optional>
#include <utility>

#include "python_str.h"

namespace dcp::jinja {
namespace {

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
                 if (a.size() >= 2) {
                   lo = a[0].i;
                   hi = a[1].i;
                 }
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
    // transformers' strftime_now(format): the local time now, as datetime.now().strftime gives it.
    set_global("strftime_now", Value::Fn([](const Args& a, const Kwargs&) -> Value {
                 if (a.size() != 1 || a[0].kind != Value::string)
                   throw Error(ErrorCategory::invalid_argument,
                               "chat template: strftime_now() needs one format string");
                 const std::time_t now = std::time(nullptr);
                 std::tm local{};
                 localtime_r(&now, &local);
                 // strftime reports 0 both for a buffer too small and for an empty result.
                 for (std::size_t size = 256; size <= kMaxOutput; size *= 4) {
                   std::string out(size, '\0');
                   const std::size_t n =
                       std::strftime(out.data(), out.size(), a[0].s.c_str(), &local);
                   if (n > 0 || size >= 64 * a[0].s.size() + 256) {
                     out.resize(n);
                     return Value::Str(out);
                   }
                 }
                 throw Error(
                     ErrorCategory::invalid_argument,
                     str("chat template: strftime_now() writes more than ", kMaxOutput, " bytes"));
               }));
    set_global("raise_exception", Value::Fn([](const Args& a, const Kwargs&) -> Value {
                 throw Error(ErrorCategory::invalid_argument,
                             str("chat template: ",
                                 a.empty() ? std::string("raise_exception") : to_str(a[0])));
               }));
  }

  void render(const Body& body, std::string& out) {
    const Nesting nesting(*this, body.empty() ? 0 : body.front()->line);
    for (const auto& n : body) {
      if (jump_ != Jump::none) return;  // a break or continue skips the rest of its loop body
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
          Value v;
          if (n->expr) {
            v = eval(*n->expr);
          } else {  // {% set x %}...{% endset %}
            std::string text;
            render(n->body, text);
            v = Value::Str(std::move(text));
          }
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
        case Node::macro: define_macro(n); break;
        case Node::call_block: out += to_str(call_with_caller(*n)); break;
        case Node::loop_break: jump_ = Jump::stop_loop; return;
        case Node::loop_continue: jump_ = Jump::next_item; return;
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
    bool completed = false;
    // loop.changed's last values, owned here: a value cannot own it (loop.changed(loop) would
    // make a cycle).
    const std::size_t changed_state = last_changed_.size();
    last_changed_.emplace_back();
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
                {"nextitem", k + 1 < items.size() ? items[k + 1] : Value()},
                {"depth", Value::Int(1)},  // no recursive loops
                {"depth0", Value::Int(0)},
                {"cycle", Value::Fn([k, line = n.line](const Args& a, const Kwargs&) {
                   if (a.empty()) fail(line, "loop.cycle() needs values to cycle through");
                   return a[k % a.size()];
                 })},
                {"changed", Value::Fn([this, changed_state](const Args& a, const Kwargs&) {
                   std::optional<List>& last = last_changed_[changed_state];
                   if (last && last->size() == a.size() &&
                       std::equal(a.begin(), a.end(), last->begin(),
                                  [](const Value& x, const Value& y) { return equal(x, y); }))
                     return Value::Bool(false);
                   last = a;
                   return Value::Bool(true);
                 })}};
      set("loop", Value::Dct(std::move(loop)));
      render(n.body, out);
      const Jump jump = std::exchange(jump_, Jump::none);
      if (jump == Jump::stop_loop) break;
      // Jinja runs the else block when no iteration reached the end of its body (a break or
      // continue in every iteration counts as none), not only when there were no items.
      if (jump == Jump::none) completed = true;
    }
    scopes_.pop_back();
    if (!completed) render(n.else_body, out);
  }

  // {% macro %}: a function of the scopes it is defined in (a macro inside a loop sees the loop's
  // variables), held by weak references, since the macro is itself stored in one of them.
  void define_macro(const std::shared_ptr<Node>& n) {
    std::vector<std::weak_ptr<Dict>> closure(scopes_.begin(), scopes_.end());
    set(n->text, Value::Fn([this, n, closure](const Args& args, const Kwargs& kwargs) {
          return call_macro(*n, closure, args, kwargs);
        }));
  }

  // {% call m(...) %}body{% endcall %}: m(...) with `caller`, the body as a macro of the scopes
  // here (it sees the variables where the block is, as a macro defined here would).
  Value call_with_caller(const Node& n) {
    const Expr& e = *n.expr;
    const Value f = eval(*e.args[0]);
    if (f.kind != Value::function) fail(e.line, str("a ", kind_name(f), " is not callable"));
    Args args;
    for (std::size_t k = 1; k < e.args.size(); ++k) args.push_back(eval(*e.args[k]));
    Kwargs kwargs;
    for (const auto& [k, v] : e.kwargs) {
      if (k == "caller") fail(e.line, "{% call %} passes its own 'caller'");
      kwargs.emplace_back(k, eval(*v));
    }
    std::vector<std::weak_ptr<Dict>> closure(scopes_.begin(), scopes_.end());
    const std::shared_ptr<Node> body = n.caller_macro;
    kwargs.emplace_back("caller", Value::Fn([this, body, closure](const Args& a, const Kwargs& k) {
                          return call_macro(*body, closure, a, k, true);
                        }));
    return (*f.f)(args, kwargs);
  }

  // `block_body`: a call block's body, which sees the loop around the block.
  Value call_macro(const Node& n, const std::vector<std::weak_ptr<Dict>>& closure, const Args& args,
                   const Kwargs& kwargs, bool block_body = false) {
    if (++macro_calls_ > kMaxMacroCalls)
      fail(n.line, str("more than ", kMaxMacroCalls, " macro calls in one rendering"));
    std::vector<std::shared_ptr<Dict>> scopes;
    for (const auto& weak : closure) {
      scopes.push_back(weak.lock());
      if (!scopes.back())
        fail(n.line, str("the macro '", n.text, "' is called after the loop it is defined in"));
    }
    scopes.push_back(std::make_shared<Dict>());
    // The body runs in the macro's own scopes; the caller's come back however it ends.
    struct Swap {
      std::vector<std::shared_ptr<Dict>>& a;
      std::vector<std::shared_ptr<Dict>>& b;
      ~Swap() { a.swap(b); }
    } restore{scopes_, scopes};
    scopes_.swap(scopes);
    const std::size_t params = n.targets.size();
    if (args.size() > params && !n.varargs)
      fail(n.line,
           str("the macro '", n.text, "' takes at most ", params, " arguments, not ", args.size()));
    if (!block_body) set("loop", Value());  // a caller's loop is not the macro's
    if (n.caller) set("caller", Value());   // undefined unless a call block passes one
    std::vector<bool> bound(params, false);
    for (std::size_t k = 0; k < params && k < args.size(); ++k) {
      set(n.targets[k], args[k]);
      bound[k] = true;
    }
    Dict extra;
    for (const auto& [key, v] : kwargs) {
      const auto at = std::find(n.targets.begin(), n.targets.end(), key);
      if (key == "caller" && at == n.targets.end()) {  // from a call block
        if (!n.caller)
          fail(n.line, str("the macro '", n.text,
                           "' is called by {% call %} but never calls "
                           "caller()"));
        set("caller", v);
        continue;
      }
      if (at == n.targets.end()) {
        if (!n.kwargs) fail(n.line, str("the macro '", n.text, "' has no parameter '", key, "'"));
        assign(extra, key, v);
        continue;
      }
      const auto k = static_cast<std::size_t>(at - n.targets.begin());
      if (bound[k])
        fail(n.line, str("the macro '", n.text, "' gets '", key, "' twice (by position too)"));
      set(key, v);
      bound[k] = true;
    }
    // Defaults are evaluated at the call, seeing the parameters before them; a parameter left
    // without one is undefined (never the caller's variable of that name).
    for (std::size_t k = 0; k < params; ++k)
      if (!bound[k]) set(n.targets[k], n.defaults[k] ? eval(*n.defaults[k]) : Value());
    if (n.varargs)
      set("varargs",
          Value::Tup(args.size() > params
                         ? List(args.begin() + static_cast<std::ptrdiff_t>(params), args.end())
                         : List()));
    if (n.kwargs) set("kwargs", Value::Dct(std::move(extra)));
    std::string out;
    render(n.body, out);
    return Value::Str(std::move(out));
  }

  Value eval(const Expr& e) {
    const Nesting nesting(*this, e.line);
    switch (e.kind) {
      case Expr::literal: return e.value;
      case Expr::name: return lookup(e.text);
      case Expr::list_lit: {
        List l;
        for (const auto& a : e.args) l.push_back(eval(*a));
        return e.text == "tuple" ? Value::Tup(std::move(l)) : Value::Lst(std::move(l));
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
      case Expr::slice:
        return slice(eval(*e.args[0]), eval(*e.args[1]), eval(*e.args[2]), eval(*e.args[3]),
                     e.line);
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
      if (b.kind == Value::dict) {  // a key lookup: Python refuses an unhashable key
        if (a.kind == Value::dict || (a.kind == Value::list && !a.is_tuple))
          fail(e.line, str("'in' a dict of a ", kind_name(a), " (not hashable)"));
        return Value::Bool(a.kind == Value::string && b.find(a.s));
      }
      if (b.kind == Value::undefined) return Value::Bool(false);  // Jinja's: empty
      fail(e.line, str("'in' a ", kind_name(b)));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int c = 0;
      if (a.numeric() && b.numeric()) {
        c = a.as_real() < b.as_real() ? -1 : a.as_real() > b.as_real() ? 1 : 0;
      } else if (a.kind == Value::string && b.kind == Value::string) {
        c = a.s.compare(b.s);
      } else if (a.kind == Value::list && b.kind == Value::list && a.is_tuple == b.is_tuple) {
        const std::string what = str("'", e.text, "'");  // lists compare item by item
        c = ordered_less(a, b, what, e.line) ? -1 : ordered_less(b, a, what, e.line) ? 1 : 0;
      } else {
        fail(e.line, str("cannot compare a ", kind_name(a), " with a ", kind_name(b)));
      }
      return Value::Bool(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
    }
    if (op == "+") {
      if (a.kind == Value::string && b.kind == Value::string) return Value::Str(a.s + b.s);
      if (a.kind == Value::list && b.kind == Value::list && a.is_tuple == b.is_tuple) {
        List l = *a.l;
        l.insert(l.end(), b.l->begin(), b.l->end());
        return a.is_tuple ? Value::Tup(std::move(l)) : Value::Lst(std::move(l));
      }
    }
    // Python's repetition: a string, list or tuple times an integer (or a boolean), either side.
    const auto count = [](const Value& x) -> std::optional<std::int64_t> {
      if (x.kind == Value::integer) return x.i;
      if (x.kind == Value::boolean) return x.b ? 1 : 0;
      return std::nullopt;
    };
    const auto sequence = [](const Value& x) {
      return x.kind == Value::string || x.kind == Value::list;
    };
    if (op == "*" && ((sequence(a) && count(b)) || (sequence(b) && count(a)))) {
      const bool left = sequence(a);
      const Value& seq = left ? a : b;
      const std::int64_t times = *count(left ? b : a);
      const std::size_t unit = seq.kind == Value::string ? seq.s.size() : seq.l->size();
      // Bytes of a string, items of a list (each a value, far larger than a byte).
      const std::size_t bound = seq.kind == Value::string ? kMaxOutput : kMaxRange;
      if (unit == 0 || times <= 0)
        return seq.kind == Value::string ? Value::Str("")
               : seq.is_tuple            ? Value::Tup({})
                                         : Value::Lst({});
      if (unit * static_cast<std::size_t>(std::min<std::int64_t>(times, kMaxOutput)) > bound)
        fail(e.line, str("a ", kind_name(seq), " repeated past ", bound,
                         seq.kind == Value::string ? " bytes" : " items"));
      if (seq.kind == Value::string) {
        std::string s;
        for (std::int64_t k = 0; k < times; ++k) s += seq.s;
        return Value::Str(std::move(s));
      }
      List l;
      for (std::int64_t k = 0; k < times; ++k) l.insert(l.end(), seq.l->begin(), seq.l->end());
      return seq.is_tuple ? Value::Tup(std::move(l)) : Value::Lst(std::move(l));
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
        if (rem != 0 && ((rem < 0) != (y < 0))) {
          --q;
          rem += y;
        }  // Python floors
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
      // Python's float power: no division by zero, no complex numbers, no overflow to inf.
      const double base = a.as_real(), power = b.as_real();
      if (base == 0 && power < 0) fail(e.line, "0 raised to a negative power");
      if (base < 0 && std::isfinite(power) && std::floor(power) != power)
        fail(e.line, "a negative number raised to a fractional power (a complex number)");
      const double result = std::pow(base, power);
      if (std::isinf(result) && std::isfinite(base) && std::isfinite(power))
        fail(e.line, "'**' past the largest float");
      return Value::Real(result);
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
    // As Python's Jinja: none has no items (undefined), an undefined value cannot be indexed.
    if (obj.kind == Value::none) return Value();
    if (obj.kind == Value::undefined)
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
    } else {  // Jinja slices with Python's own subscript (not its getitem), which raises
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
    return obj.is_tuple ? Value::Tup(std::move(out)) : Value::Lst(std::move(out));
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
            if (name == "items") l.push_back(Value::Tup({Value::Str(k), v}));
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
      static const char* const methods[] = {
          "strip",      "lstrip",   "rstrip", "upper",  "lower",     "title",        "capitalize",
          "startswith", "endswith", "split",  "rsplit", "join",      "removeprefix", "removesuffix",
          "replace",    "find",     "rfind",  "count",  "splitlines"};
      // Python's other str methods: refused by name rather than run approximately; any other
      // attribute is undefined, as Jinja reads a missing one.
      static const char* const others[] = {
          "casefold",     "center",   "encode",    "expandtabs",  "format",    "format_map",
          "index",        "isalnum",  "isalpha",   "isascii",     "isdecimal", "isdigit",
          "isidentifier", "islower",  "isnumeric", "isprintable", "isspace",   "istitle",
          "isupper",      "ljust",    "maketrans", "partition",   "rindex",    "rjust",
          "rpartition",   "swapcase", "translate", "zfill"};
      const auto among = [&](const auto& list) {
        return std::find_if(std::begin(list), std::end(list),
                            [&](const char* m) { return name == m; }) != std::end(list);
      };
      if (among(others)) fail(line, str("strings have no method '", name, "' here"));
      if (!among(methods)) return Value();
      return Value::Fn([s, name, line](const Args& a, const Kwargs& kwargs) {
        return string_method(s, name, method_arguments(name, a, kwargs, line), line);
      });
    }
    if (obj.kind == Value::list && (name == "count" || name == "index")) {
      const Value self = obj;
      return Value::Fn([self, name, line](const Args& a, const Kwargs& kwargs) {
        if (a.size() != 1 || !kwargs.empty()) fail(line, str(name, "() takes one value here"));
        std::int64_t n = 0;
        for (std::size_t k = 0; k < self.l->size(); ++k) {
          if (!equal((*self.l)[k], a[0])) continue;
          if (name == "index") return Value::Int(static_cast<std::int64_t>(k));
          ++n;
        }
        if (name == "index") fail(line, str("index(): ", repr(a[0]), " is not in the list"));
        return Value::Int(n);
      });
    }
    return Value();  // none's attributes, as Python's Jinja reads them, and an undefined's
  }

  // A string method's arguments by position, keywords placed by their names; what the method does
  // not take is refused rather than ignored (start and end offsets among them).
  static Args method_arguments(const std::string& name, const Args& a, const Kwargs& kwargs,
                               int line) {
    static const std::vector<std::pair<std::string, std::vector<std::string>>> params = {
        {"strip", {"chars"}},
        {"lstrip", {"chars"}},
        {"rstrip", {"chars"}},
        {"split", {"sep", "maxsplit"}},
        {"rsplit", {"sep", "maxsplit"}},
        {"join", {"iterable"}},
        {"removeprefix", {"prefix"}},
        {"removesuffix", {"suffix"}},
        {"rfind", {"sub"}},
        {"splitlines", {"keepends"}},
        {"replace", {"old", "new", "count"}},
        {"startswith", {"prefix"}},
        {"endswith", {"suffix"}},
        {"find", {"sub"}},
        {"count", {"sub"}}};
    std::vector<std::string> names;
    for (const auto& [method, list] : params)
      if (method == name) names = list;
    Args out = placed(name + "()", a, kwargs, names, line);
    // The arguments not given are absent, not undefined, as string_method reads them.
    while (!out.empty() && out.back().kind == Value::undefined) out.pop_back();
    return out;
  }

  static List keys_of(const Dict& d) {
    List keys;
    for (const auto& [k, x] : d) keys.push_back(Value::Str(k));
    return keys;
  }

  static Value string_method(const std::string& s, const std::string& name, const Args& a,
                             int line) {
    const auto given = [&](std::size_t k) {
      return k < a.size() && a[k].kind != Value::undefined && a[k].kind != Value::none;
    };
    // Python's count and maxsplit: a negative one means all.
    const auto limit = [&](std::size_t k, const char* what) -> std::int64_t {
      if (!given(k)) return -1;
      if (a[k].kind != Value::integer) fail(line, str(name, "(): ", what, " must be an integer"));
      return a[k].i;
    };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      std::optional<std::string> chars;
      if (given(0)) {
        if (a[0].kind != Value::string) fail(line, str(name, "() needs a string or None"));
        chars = a[0].s;
      }
      return Value::Str(py_strip(s, chars, name != "rstrip", name != "lstrip"));
    }
    if (name == "upper") return Value::Str(py_upper(s));
    if (name == "lower") return Value::Str(py_lower(s));
    if (name == "title") return Value::Str(py_title(s));
    if (name == "capitalize") return Value::Str(py_capitalize(s));
    if (name == "startswith" || name == "endswith") {
      // A string, or a tuple of them (any matches).
      List options = a.empty() ? List() : a[0].kind == Value::list ? *a[0].l : List{a[0]};
      if (a.empty()) fail(line, str(name, "() needs a string"));
      bool r = false;
      for (const Value& o : options) {
        if (o.kind != Value::string) fail(line, str(name, "() needs strings"));
        const std::string& p = o.s;
        r = r || (p.size() <= s.size() &&
                  (name == "startswith" ? s.compare(0, p.size(), p) == 0
                                        : s.compare(s.size() - p.size(), p.size(), p) == 0));
      }
      return Value::Bool(r);
    }
    if (name == "split") {
      std::int64_t splits = limit(1, "maxsplit");
      List out;
      if (!given(0)) {
        for (std::string& word : py_split_whitespace(s, splits))
          out.push_back(Value::Str(std::move(word)));
      } else {
        if (a[0].kind != Value::string) fail(line, "split() needs a string separator");
        const std::string& sep = a[0].s;
        if (sep.empty()) fail(line, "split() with an empty separator");
        std::size_t k = 0;
        while (true) {
          const std::size_t e = splits-- == 0 ? std::string::npos : s.find(sep, k);
          out.push_back(
              Value::Str(s.substr(k, e == std::string::npos ? std::string::npos : e - k)));
          if (e == std::string::npos) break;
          k = e + sep.size();
        }
      }
      return Value::Lst(std::move(out));
    }
    if (name == "rsplit") {
      std::int64_t splits = limit(1, "maxsplit");
      List out;
      if (!given(0)) {
        for (std::string& word : py_rsplit_whitespace(s, splits))
          out.push_back(Value::Str(std::move(word)));
        return Value::Lst(std::move(out));
      }
      if (a[0].kind != Value::string) fail(line, "rsplit() needs a string separator");
      const std::string& sep = a[0].s;
      if (sep.empty()) fail(line, "rsplit() with an empty separator");
      std::size_t end = s.size();  // the pieces lie before `end`
      while (true) {
        const std::size_t at =
            splits-- == 0 || end < sep.size() ? std::string::npos : s.rfind(sep, end - sep.size());
        if (at == std::string::npos) {
          out.push_back(Value::Str(s.substr(0, end)));
          break;
        }
        out.push_back(Value::Str(s.substr(at + sep.size(), end - at - sep.size())));
        end = at;
      }
      std::reverse(out.begin(), out.end());
      return Value::Lst(std::move(out));
    }
    if (name == "join") {  // sep.join(iterable): strings only, as Python takes them
      if (a.empty()) fail(line, "join() needs an iterable of strings");
      const List parts = a[0].kind == Value::list     ? *a[0].l
                         : a[0].kind == Value::string ? characters(a[0].s)
                         : a[0].kind == Value::dict   ? keys_of(*a[0].m)
                                                      : List{};
      if (a[0].kind != Value::list && a[0].kind != Value::string && a[0].kind != Value::dict)
        fail(line, str("join() of a ", kind_name(a[0])));
      std::string out;
      for (std::size_t k = 0; k < parts.size(); ++k) {
        if (parts[k].kind != Value::string)
          fail(line, str("join(): item ", k, " is a ", kind_name(parts[k]), ", not a string"));
        out += (k ? s : "") + parts[k].s;
      }
      return Value::Str(out);
    }
    if (name == "removeprefix" || name == "removesuffix") {
      if (a.empty() || a[0].kind != Value::string) fail(line, str(name, "() needs a string"));
      const std::string& p = a[0].s;
      if (p.size() > s.size()) return Value::Str(s);
      if (name == "removeprefix")
        return Value::Str(s.compare(0, p.size(), p) == 0 ? s.substr(p.size()) : s);
      return Value::Str(
          s.compare(s.size() - p.size(), p.size(), p) == 0 ? s.substr(0, s.size() - p.size()) : s);
    }
    if (name == "splitlines") {
      List out;
      for (std::string& l : py_splitlines(s, !a.empty() && truthy(a[0])))
        out.push_back(Value::Str(std::move(l)));
      return Value::Lst(std::move(out));
    }
    if (name == "replace") {
      if (a.size() < 2 || a[0].kind != Value::string || a[1].kind != Value::string ||
          a[0].s.empty())
        fail(line, "replace() needs two strings, the first not empty");
      std::int64_t times = limit(2, "count");
      std::string r;
      std::size_t k = 0;
      while (true) {
        const std::size_t e = times-- == 0 ? std::string::npos : s.find(a[0].s, k);
        r += s.substr(k, e == std::string::npos ? std::string::npos : e - k);
        if (e == std::string::npos) break;
        r += a[1].s;
        k = e + a[0].s.size();
      }
      return Value::Str(r);
    }
    if (name == "find" || name == "rfind" || name == "count") {
      if (a.empty() || a[0].kind != Value::string) fail(line, str(name, "() needs a string"));
      if (name != "count") {  // a character index, as Python's str counts
        const std::size_t e = name == "find" ? s.find(a[0].s) : s.rfind(a[0].s);
        if (e == std::string::npos) return Value::Int(-1);
        return Value::Int(static_cast<std::int64_t>(characters(s.substr(0, e)).size()));
      }
      if (a[0].s.empty())  // between every two characters and at both ends
        return Value::Int(static_cast<std::int64_t>(characters(s).size()) + 1);
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
    if (t == "number") return v.numeric();  // Python's Number: bool is one
    if (t == "integer") return v.kind == Value::integer;
    if (t == "float") return v.kind == Value::real;
    if (t == "boolean") return v.kind == Value::boolean;
    if (t == "true") return v.kind == Value::boolean && v.b;
    if (t == "false") return v.kind == Value::boolean && !v.b;
    if (t == "mapping") return v.kind == Value::dict;
    // As Jinja tests them: a sequence has a length and items (a dict too); an undefined value is
    // an empty sequence and may be called (to fail).
    const bool container =
        v.kind == Value::list || v.kind == Value::string || v.kind == Value::dict;
    if (t == "sequence" || t == "iterable") return container || v.kind == Value::undefined;
    if (t == "callable") return v.kind == Value::function || v.kind == Value::undefined;
    if (t == "odd" || t == "even") {  // Python's value % 2 == 1 (or 0), floats and booleans too
      if (!v.numeric()) fail(e.line, str("'is ", t, "' on a ", kind_name(v)));
      double r = v.kind == Value::real
                     ? std::fmod(v.d, 2.0)
                     : static_cast<double>(v.kind == Value::boolean ? v.b : v.i % 2);
      if (r < 0) r += 2;
      return r == (t == "odd" ? 1.0 : 0.0);
    }
    if (t == "eq" || t == "equalto" || t == "ne" || t == "sameas") {
      if (e.args.size() < 2) fail(e.line, str("'is ", t, "' needs a value"));
      const bool same = equal(v, eval(*e.args[1]));
      return t == "ne" ? !same : same;
    }
    if (t == "lt" || t == "lessthan" || t == "le" || t == "gt" || t == "greaterthan" || t == "ge") {
      if (e.args.size() < 2) fail(e.line, str("'is ", t, "' needs a value"));
      const Value w = eval(*e.args[1]);
      const bool less = ordered_less(v, w, "'is " + t + "'", e.line);
      const bool more = ordered_less(w, v, "'is " + t + "'", e.line);
      if (t == "lt" || t == "lessthan") return less;
      if (t == "gt" || t == "greaterthan") return more;
      return t == "le" ? !more : !less;
    }
    if (t == "divisibleby") {
      if (e.args.size() < 2) fail(e.line, "'is divisibleby' needs a number");
      const Value w = eval(*e.args[1]);
      if (!v.numeric() || !w.numeric()) fail(e.line, "'is divisibleby' works on numbers");
      if (w.as_real() == 0) fail(e.line, "'is divisibleby' 0");
      if (v.kind != Value::real && w.kind != Value::real) {
        const std::int64_t x = v.kind == Value::boolean ? v.b : v.i;
        const std::int64_t y = w.kind == Value::boolean ? w.b : w.i;
        return y == -1 || x % y == 0;
      }
      return std::fmod(v.as_real(), w.as_real()) == 0;
    }
    if (t == "in") {
      if (e.args.size() < 2) fail(e.line, "'is in' needs a sequence");
      const Value seq = eval(*e.args[1]);
      if (seq.kind == Value::list)
        return std::any_of(seq.l->begin(), seq.l->end(),
                           [&](const Value& x) { return equal(v, x); });
      if (seq.kind == Value::string) {
        if (v.kind != Value::string) fail(e.line, str("'is in' a string of a ", kind_name(v)));
        return seq.s.find(v.s) != std::string::npos;
      }
      if (seq.kind == Value::dict) return v.kind == Value::string && seq.find(v.s);
      fail(e.line, str("'is in' a ", kind_name(seq)));
    }
    fail(e.line, str("the test 'is ", t, "' is not supported"));
  }

  // Jinja's dictsort(d, case_sensitive=False, by='key', reverse=False): (key, value) pairs.
  Value dictsort(const Value& v, const Args& a, const Kwargs& kwargs, int line) {
    if (v.kind != Value::dict) fail(line, str("'|dictsort' on a ", kind_name(v)));
    const Args p = placed("'|dictsort'", a, kwargs, {"case_sensitive", "by", "reverse"}, line);
    if (given_value(p[1]) && !(p[1].kind == Value::string && (p[1].s == "key" || p[1].s == "value")))
      fail(line, "'|dictsort': by must be 'key' or 'value'");
    const bool by_value = given_value(p[1]) && p[1].s == "value";
    List pairs;
    std::vector<Value> keys;
    for (const auto& [k, x] : *v.m) {
      pairs.push_back(Value::Tup({Value::Str(k), x}));
      keys.push_back(order_key(by_value ? x : Value::Str(k), Value(), truthy(p[0]), false, line));
    }
    return Value::Lst(sorted_by(pairs, keys, truthy(p[2]), "'|dictsort'", line));
  }

  // `items` in the order of their `keys`, stable, reversed or not, as Python's sorted.
  static List sorted_by(const List& items, const std::vector<Value>& keys, bool reverse,
                        const std::string& what, int line) {
    std::vector<std::size_t> order(items.size());
    for (std::size_t k = 0; k < order.size(); ++k) order[k] = k;
    std::stable_sort(order.begin(), order.end(), [&](std::size_t x, std::size_t y) {
      return reverse ? ordered_less(keys[y], keys[x], what, line)
                     : ordered_less(keys[x], keys[y], what, line);
    });
    List out;
    for (std::size_t k : order) out.push_back(items[k]);
    return out;
  }

  // Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False),
  // which calls json.dumps with them.
  static JsonStyle json_style(const Args& a, const Kwargs& kwargs, int line) {
    static const char* const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    if (a.size() > std::size(names)) fail(line, "tojson() takes at most 4 arguments");
    std::vector<std::pair<std::string, Value>> given;
    for (std::size_t k = 0; k < a.size(); ++k) given.emplace_back(names[k], a[k]);
    for (const auto& [key, x] : kwargs) {
      if (std::find(std::begin(names), std::end(names), key) == std::end(names))
        fail(line, str("tojson() has no argument '", key,
                       "' (legal: ensure_ascii, indent, separators, sort_keys)"));
      given.emplace_back(key, x);
    }
    JsonStyle style;
    for (const auto& [key, x] : given) {
      if (key == "ensure_ascii") {
        style.ensure_ascii = truthy(x);
      } else if (key == "sort_keys") {
        style.sort_keys = truthy(x);
      } else if (key == "indent") {
        if (x.kind == Value::integer) {
          if (x.i > static_cast<std::int64_t>(kMaxOutput))
            fail(line, str("tojson(): an indent past ", kMaxOutput, " spaces"));
          style.indent = std::string(static_cast<std::size_t>(std::max<std::int64_t>(x.i, 0)), ' ');
        } else if (x.kind == Value::string)
          style.indent = x.s;
        else if (x.kind != Value::none && x.kind != Value::undefined)
          fail(line,
               str("tojson(): indent must be an integer, a string or none, not a ", kind_name(x)));
      } else if (x.kind != Value::none && x.kind != Value::undefined) {  // separators
        if (x.kind != Value::list || x.l->size() != 2 || (*x.l)[0].kind != Value::string ||
            (*x.l)[1].kind != Value::string)
          fail(line, "tojson(): separators must be two strings (item, key)");
        style.item_separator = (*x.l)[0].s;
        style.key_separator = (*x.l)[1].s;
        continue;
      }
      if (key == "indent" && style.indent && !kwarg_given(given, "separators"))
        style.item_separator = ",";  // json.dumps' default with an indent
    }
    return style;
  }
  static bool kwarg_given(const std::vector<std::pair<std::string, Value>>& given,
                          const char* key) {
    for (const auto& [k, x] : given)
      if (k == key && x.kind != Value::none && x.kind != Value::undefined) return true;
    return false;
  }

  // A filter's or method's arguments by position, keywords placed by their names (undefined: not
  // given); an argument it does not take is refused by name. `what` names it in errors.
  static Args placed(const std::string& what, const Args& a, const Kwargs& kwargs,
                     const std::vector<std::string>& names, int line) {
    if (a.size() > names.size())
      fail(line, str(what, " takes at most ", names.size(), " arguments here, not ", a.size()));
    Args out = a;
    out.resize(names.size());
    for (const auto& [key, x] : kwargs) {
      const auto at = std::find(names.begin(), names.end(), key);
      if (at == names.end()) {
        std::string legal;
        for (const std::string& n : names) legal += (legal.empty() ? "" : ", ") + n;
        fail(line, str(what, " has no argument '", key, "' (legal: ", legal, ")"));
      }
      const auto k = static_cast<std::size_t>(at - names.begin());
      if (k < a.size()) fail(line, str(what, " gets '", key, "' twice"));
      out[k] = x;
    }
    return out;
  }
  static bool given_value(const Value& v) {
    return v.kind != Value::undefined && v.kind != Value::none;
  }

  // Jinja's attribute getter: "a.b.0" reads x['a']['b'][0] (a part of digits is an index).
  Value attribute_path(const Value& x, const Value& attribute, int line) {
    if (attribute.kind == Value::integer) return item(x, attribute, line);
    if (attribute.kind != Value::string)
      fail(line, str("attribute= must be a string or an integer, not a ", kind_name(attribute)));
    Value v = x;
    std::size_t start = 0;
    while (true) {
      const std::size_t dot = attribute.s.find('.', start);
      const std::string part =
          attribute.s.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
      const bool digits =
          !part.empty() && part.size() < 19 &&
          std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      v = item(v, digits ? Value::Int(std::stoll(part)) : Value::Str(part), line);
      if (dot == std::string::npos) return v;
      start = dot + 1;
    }
  }
  // The key sort, unique, min and max compare: the item, or its attribute (several, comma
  // separated, for sort), strings lowered unless case-sensitive.
  Value order_key(const Value& x, const Value& attribute, bool case_sensitive, bool several,
                  int line) {
    const auto one = [&](const Value& path) {
      Value k = given_value(path) ? attribute_path(x, path, line) : x;
      if (k.kind == Value::string && !case_sensitive) k = Value::Str(py_lower(k.s));
      return k;
    };
    if (!several || attribute.kind != Value::string || attribute.s.find(',') == std::string::npos)
      return one(attribute);
    List keys;
    std::size_t start = 0;
    while (true) {
      const std::size_t comma = attribute.s.find(',', start);
      keys.push_back(one(Value::Str(attribute.s.substr(
          start, comma == std::string::npos ? std::string::npos : comma - start))));
      if (comma == std::string::npos) return Value::Lst(std::move(keys));
      start = comma + 1;
    }
  }
  // Python's < on what chat templates sort: numbers, strings, and lists of them.
  // `what` names the filter or test in an error.
  static bool ordered_less(const Value& x, const Value& y, const std::string& what, int line) {
    if (x.numeric() && y.numeric()) return x.as_real() < y.as_real();
    if (x.kind == Value::string && y.kind == Value::string) return x.s < y.s;
    if (x.kind == Value::list && y.kind == Value::list && x.is_tuple == y.is_tuple) {
      for (std::size_t k = 0; k < x.l->size() && k < y.l->size(); ++k)
        if (!equal((*x.l)[k], (*y.l)[k])) return ordered_less((*x.l)[k], (*y.l)[k], what, line);
      return x.l->size() < y.l->size();
    }
    fail(line, str(what, " cannot order a ", kind_name(x), " and a ", kind_name(y)));
  }

  // Python's int(text) for Jinja's |int: digits with single underscores between them, a sign,
  // surrounding whitespace.
  static std::optional<std::int64_t> python_int(const std::string& text) {
    const std::string t = py_strip(text, std::nullopt, true, true);
    std::size_t k = t.empty() || (t[0] != '+' && t[0] != '-') ? 0 : 1;
    std::string digits;
    for (; k < t.size(); ++k) {
      if (t[k] == '_' && !digits.empty() && k + 1 < t.size() && t[k + 1] != '_') continue;
      if (t[k] < '0' || t[k] > '9') return std::nullopt;
      digits += t[k];
    }
    if (digits.empty()) return std::nullopt;
    errno = 0;
    const long long v = std::strtoll(((t[0] == '-' ? "-" : "") + digits).c_str(), nullptr, 10);
    if (errno == ERANGE) return std::nullopt;
    return v;
  }
  // Python's float(text): a decimal with optional exponent, "inf", "infinity" or "nan" in any
  // case, underscores between digits, a sign, surrounding whitespace.
  static std::optional<double> python_float(const std::string& text) {
    const std::string lowered = py_lower(py_strip(text, std::nullopt, true, true));
    std::size_t k = lowered.empty() || (lowered[0] != '+' && lowered[0] != '-') ? 0 : 1;
    const std::string word = lowered.substr(k);
    if (word == "inf" || word == "infinity" || word == "nan") {
      const double v = word == "nan" ? std::nan("") : HUGE_VAL;
      return lowered[0] == '-' ? -v : v;
    }
    std::string plain = lowered.substr(0, k);
    bool digit_before = false, any_digit = false, dot = false, exponent = false;
    for (; k < lowered.size(); ++k) {
      const char c = lowered[k];
      const bool digit = c >= '0' && c <= '9';
      if (c == '_') {
        if (!digit_before || k + 1 >= lowered.size() || lowered[k + 1] < '0' ||
            lowered[k + 1] > '9')
          return std::nullopt;
        continue;
      }
      if (digit) {
        any_digit = true;
      } else if (c == '.' && !dot && !exponent) {
        dot = true;
      } else if (c == 'e' && any_digit && !exponent) {
        exponent = true;
        any_digit = false;
        plain += c;
        if (k + 1 < lowered.size() && (lowered[k + 1] == '+' || lowered[k + 1] == '-'))
          plain += lowered[++k];
        digit_before = false;
        continue;
      } else {
        return std::nullopt;
      }
      digit_before = digit;
      plain += c;
    }
    if (!any_digit) return std::nullopt;
    return std::strtod(plain.c_str(), nullptr);
  }

  // Jinja's round(value, precision=0, method='common'): Python's round (the nearest decimal,
  // ties to even on the exact binary value), or math.ceil / math.floor at that precision.
  static Value round_filter(const Value& v, const Args& p, int line) {
    if (!v.numeric()) fail(line, str("'|round' of a ", kind_name(v)));
    std::int64_t precision = 0;
    if (given_value(p[0])) {
      if (p[0].kind != Value::integer) fail(line, "'|round': precision must be an integer");
      precision = p[0].i;
    }
    if (precision < 0 || precision > 22)
      fail(line, str("'|round': precision ", precision, " is not supported here (legal: 0-22)"));
    const std::string method = given_value(p[1]) ? to_str(p[1]) : "common";
    if (method != "common" && method != "ceil" && method != "floor")
      fail(line, str("'|round': method '", method, "' (legal: common, ceil, floor)"));
    if (method == "common" && v.kind != Value::real)
      return Value::Int(v.kind == Value::boolean ? v.b : v.i);
    const double x = v.as_real();
    if (std::isnan(x) || std::isinf(x)) {
      if (method != "common") fail(line, "'|round': ceil or floor of a float that is not finite");
      return Value::Real(x);
    }
    const double scale = std::pow(10.0, static_cast<double>(precision));  // exact up to 10^22
    if (method == "ceil") return Value::Real(std::ceil(x * scale) / scale);
    if (method == "floor") return Value::Real(std::floor(x * scale) / scale);
    // glibc's printf rounds the exact binary value to `precision` decimals, ties to even, as
    // Python's round does.
    char buffer[400];
    std::snprintf(buffer, sizeof buffer, "%.*f", static_cast<int>(precision), x);
    return Value::Real(std::strtod(buffer, nullptr));
  }

  // Jinja's indent(width=4, first=False, blank=False): every line after the first indented
  // (`width` spaces, or a string), blank lines only with `blank`, the first with `first`.
  static Value indent_filter(const std::string& s, const Args& p, int line) {
    std::string indention(4, ' ');
    if (p[0].kind == Value::string) {
      indention = p[0].s;
    } else if (given_value(p[0])) {
      if (p[0].kind != Value::integer || p[0].i < 0 || p[0].i > 1000)
        fail(line, "'|indent': width must be a string or an integer 0-1000");
      indention = std::string(static_cast<std::size_t>(p[0].i), ' ');
    }
    const std::vector<std::string> lines = py_splitlines(s + "\n", false);
    std::string out;
    for (std::size_t k = 0; k < lines.size(); ++k) {
      if (k > 0) out += "\n";
      if (k > 0 && (truthy(p[2]) || !lines[k].empty())) out += indention;
      out += lines[k];
    }
    if (truthy(p[1])) out = indention + out;
    return Value::Str(out);
  }

  Value filter(const Expr& e) {
    const std::string& f = e.text;
    const std::string label = str("'|", f, "'");  // names the filter in errors
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
      if (v.kind == Value::undefined) return Value::Int(0);  // Jinja's: empty
      fail(e.line, str("length of a ", kind_name(v)));
    }
    if (f == "trim") return string_method(to_str(v), "strip", a, e.line);
    if (f == "upper" || f == "lower" || f == "capitalize")
      return string_method(to_str(v), f, {}, e.line);
    if (f == "title") return Value::Str(jinja_title(to_str(v)));
    if (f == "replace") return string_method(to_str(v), "replace", a, e.line);
    if (f == "string") return Value::Str(to_str(v));
    if (f == "safe" || f == "e" || f == "escape") {
      if (f != "safe")
        fail(e.line, "the 'escape' filter is not supported (chat templates render unescaped)");
      return v;
    }
    if ((f == "int" || f == "float") && v.kind == Value::undefined)  // Jinja's Undefined raises
      fail(e.line, str("'|", f, "' of an undefined value"));
    if (f == "int") {  // int(x), else int(float(x)), else the default (0)
      const Args p = placed(label, a, kwargs, {"default", "base"}, e.line);
      if (given_value(p[1]) && !(p[1].kind == Value::integer && p[1].i == 10))
        fail(e.line, "'|int' reads base 10 only here");
      const Value fallback = p[0].kind == Value::undefined ? Value::Int(0) : p[0];
      const auto truncated = [&](double d) {
        if (std::isnan(d)) return fallback;  // Python's ValueError, which Jinja catches
        if (std::isinf(d)) fail(e.line, "'|int' of an infinite float");  // its OverflowError
        if (!(std::fabs(d) < 9.2e18)) fail(e.line, "'|int' of a number past 64 bits");
        return Value::Int(static_cast<std::int64_t>(d));
      };
      if (v.kind == Value::integer) return v;
      if (v.kind == Value::boolean) return Value::Int(v.b);
      if (v.kind == Value::real) return truncated(v.d);
      if (v.kind == Value::string) {
        if (const auto i = python_int(v.s)) return Value::Int(*i);
        if (const auto d = python_float(v.s)) return truncated(*d);
      }
      return fallback;
    }
    if (f == "float") {  // float(x), else the default (0.0)
      const Args p = placed(label, a, kwargs, {"default"}, e.line);
      if (v.numeric()) return Value::Real(v.as_real());
      if (v.kind == Value::string)
        if (const auto d = python_float(v.s)) return Value::Real(*d);
      return p[0].kind == Value::undefined ? Value::Real(0.0) : p[0];
    }
    if (f == "abs") {
      if (v.kind == Value::boolean) return Value::Int(v.b);
      if (v.kind == Value::real) return Value::Real(std::fabs(v.d));
      if (v.kind != Value::integer) fail(e.line, str("'|abs' of a ", kind_name(v)));
      if (v.i == std::numeric_limits<std::int64_t>::min())
        fail(e.line, "'|abs' of a number past 64 bits");
      return Value::Int(v.i < 0 ? -v.i : v.i);
    }
    if (f == "round")
      return round_filter(v, placed(label, a, kwargs, {"precision", "method"}, e.line), e.line);
    if (f == "indent") {  // Jinja appends a newline to the value itself: a string only
      if (v.kind != Value::string) fail(e.line, str("'|indent' of a ", kind_name(v)));
      return indent_filter(v.s, placed(label, a, kwargs, {"width", "first", "blank"}, e.line), e.line);
    }
    if (f == "tojson") {
      std::string out;
      dump_json(v, out, json_style(a, kwargs, e.line));
      return Value::Str(out);
    }
    if (f == "default" || f == "d") {
      const bool boolean =
          (a.size() > 1 && truthy(a[1])) || (kwarg("boolean") && truthy(*kwarg("boolean")));
      const bool use_default = v.kind == Value::undefined || (boolean && !truthy(v));
      return use_default ? (a.empty() ? Value::Str("") : a[0]) : v;
    }
    if (f == "dictsort") return dictsort(v, a, kwargs, e.line);
    if (f == "items") {  // a mapping's pairs; an undefined value has none
      if (v.kind == Value::undefined) return Value::Lst({});
      if (v.kind != Value::dict)
        fail(e.line, str("'|items' of a ", kind_name(v), ", not a mapping"));
      return (*attribute(v, "items", e.line).f)({}, {});
    }
    // Jinja's map, select and reject give nothing for a falsy value (none, 0, false, "")
    // before iterating it.
    if ((f == "map" || f == "select" || f == "reject" || f == "selectattr" || f == "rejectattr") &&
        !truthy(v))
      return Value::Lst({});
    List items;
    if (v.kind == Value::list)
      items = *v.l;
    else if (v.kind == Value::dict)
      for (const auto& [k, x] : *v.m) items.push_back(Value::Str(k));
    else if (v.kind == Value::string)
      items = characters(v.s);
    else if (v.kind != Value::undefined)  // an undefined value iterates as empty, none does not
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
        if (attr)
          out.push_back(item(x, *attr, e.line));
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
        } else
          fail(e.line, "map() needs attribute= or a filter name");
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
    if (f == "unique" || f == "min" || f == "max" || f == "sort") {
      const Args p = f == "sort"
                         ? placed(label, a, kwargs, {"reverse", "case_sensitive", "attribute"}, e.line)
                         : placed(label, a, kwargs, {"case_sensitive", "attribute"}, e.line);
      const std::size_t at = f == "sort" ? 1 : 0;  // where case_sensitive is
      const bool case_sensitive = truthy(p[at]);
      std::vector<Value> keys;
      for (const Value& x : items)
        keys.push_back(order_key(x, p[at + 1], case_sensitive, f == "sort", e.line));
      if (f == "unique") {  // the first item of each key, keys as a Python set holds them
        List out;
        std::vector<Value> seen;
        for (std::size_t k = 0; k < items.size(); ++k) {
          if ((keys[k].kind == Value::list && !keys[k].is_tuple) || keys[k].kind == Value::dict)
            fail(e.line, str("'|unique' of a ", kind_name(keys[k]), " (not hashable)"));
          if (std::none_of(seen.begin(), seen.end(),
                           [&](const Value& y) { return equal(keys[k], y); })) {
            seen.push_back(keys[k]);
            out.push_back(items[k]);
          }
        }
        return Value::Lst(std::move(out));
      }
      if (f == "sort") return Value::Lst(sorted_by(items, keys, truthy(p[0]), label, e.line));
      if (items.empty()) return Value();  // Jinja's undefined: no item to aggregate
      std::size_t best = 0;  // the first of the least (or greatest) keys, as Python's min and max
      for (std::size_t k = 1; k < items.size(); ++k)
        if (f == "min" ? ordered_less(keys[k], keys[best], label, e.line)
                       : ordered_less(keys[best], keys[k], label, e.line))
          best = k;
      return items[best];
    }
    if (f == "sum") {  // Python's sum: integers stay integers until a float joins
      const Args p = placed(label, a, kwargs, {"attribute", "start"}, e.line);
      Value total = p[1].kind == Value::undefined ? Value::Int(0) : p[1];
      for (const Value& x : items) {
        const Value term = given_value(p[0]) ? attribute_path(x, p[0], e.line) : x;
        if (!term.numeric() || !total.numeric())
          fail(e.line,
               str("'|sum' adds numbers, not a ", kind_name(term.numeric() ? total : term)));
        if (term.kind == Value::real || total.kind == Value::real) {
          total = Value::Real(total.as_real() + term.as_real());
        } else {
          std::int64_t r = 0;
          const std::int64_t x1 = total.kind == Value::boolean ? total.b : total.i;
          const std::int64_t x2 = term.kind == Value::boolean ? term.b : term.i;
          if (__builtin_add_overflow(x1, x2, &r)) fail(e.line, "'|sum' past 64 bits");
          total = Value::Int(r);
        }
      }
      return total;
    }
    fail(e.line, str("the filter '|", f, "' is not supported"));
  }

  // Counts a level of the rendering's recursion (a block, an expression, a macro call) for its
  // lifetime: the parser bounds how deep a template nests, a macro calling itself does not.
  struct Nesting {
    Renderer& r;
    Nesting(Renderer& renderer, int line) : r(renderer) {
      if (++r.nesting_ > kMaxNesting)
        fail(line, str("the rendering nests deeper than ", kMaxNesting,
                       " blocks, expressions and macro calls"));
    }
    ~Nesting() { --r.nesting_; }
    Nesting(const Nesting&) = delete;
    Nesting& operator=(const Nesting&) = delete;
  };
  static constexpr int kMaxNesting = 1000;  // above what the parser lets a template nest

  enum class Jump { none, stop_loop, next_item };  // a {% break %} or {% continue %} pending

  std::vector<std::unique_ptr<Dict>> namespaces_;  // first: destroyed after the scopes
  std::vector<std::optional<List>> last_changed_;  // each loop's loop.changed() values
  std::vector<std::shared_ptr<Dict>> scopes_;
  std::size_t iterations_ = 0, macro_calls_ = 0;
  int nesting_ = 0;
  Jump jump_ = Jump::none;
};

}  // namespace

std::string render(const Body& body, const Value& context) {
  Renderer r(context);
  std::string out;
  r.render(body, out);
  return out;
}

}  // namespace dcp::jinja
