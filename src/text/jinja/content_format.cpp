#include "content_format.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace dcp::jinja {
namespace {

// Every node of the tree (bodies of ifs, loops, macros and call blocks included), in source order.
void each_node(const Body& body, const std::function<void(const Node&)>& visit) {
  for (const auto& n : body) {
    visit(*n);
    for (const auto& [cond, b] : n->branches) each_node(b, visit);
    each_node(n->body, visit);
    each_node(n->else_body, visit);
    if (n->caller_macro) each_node({n->caller_macro}, visit);
  }
}

// Every expression of the tree and every expression inside one.
void each_expr(const Expr* e, const std::function<void(const Expr&)>& visit) {
  if (!e) return;
  visit(*e);
  for (const auto& a : e->args) each_expr(a.get(), visit);
  for (const auto& [key, a] : e->kwargs) each_expr(a.get(), visit);
}
void each_expr(const Body& body, const std::function<void(const Expr&)>& visit) {
  each_node(body, [&](const Node& n) {
    each_expr(n.expr.get(), visit);
    for (const auto& [cond, b] : n.branches) each_expr(cond.get(), visit);
    each_expr(n.filter.get(), visit);
    for (const auto& d : n.defaults) each_expr(d.get(), visit);
  });
}

bool is_string_literal(const Expr* e) {
  return e && e->kind == Expr::literal && e->value.kind == Value::string;
}

// `name`, or an element of it (`name['key']` / `name.key` when `key` is given), seen through
// filters, tests and slices: `messages[1:] | reverse` reads `messages`.
bool reads(const Expr* e, const std::string& name, const char* key = nullptr) {
  if (!e) return false;
  if (e->kind == Expr::filter || e->kind == Expr::test || e->kind == Expr::slice)
    return !e->args.empty() && reads(e->args[0].get(), name, key);
  const auto is_name = [&](const Expr* x) { return x && x->kind == Expr::name && x->text == name; };
  if (!key) return is_name(e);
  if (e->kind == Expr::attr) return is_name(e->args[0].get()) && e->text == key;
  if (e->kind == Expr::item) {
    const Expr* k = e->args[1].get();
    return is_name(e->args[0].get()) && is_string_literal(k) && k->value.s == key;
  }
  return false;
}

bool reads_any(const Expr* e, const std::vector<std::string>& names, const char* key = nullptr) {
  return std::any_of(names.begin(), names.end(),
                     [&](const std::string& name) { return reads(e, name, key); });
}

}  // namespace

bool loops_over_message_content(const Body& body) {
  // Variables holding the messages: `messages`, and those set from it (`{% set rest =
  // messages[1:] %}`), transitively.
  std::vector<std::string> lists{"messages"};
  for (std::size_t k = 0; k < lists.size(); ++k) {
    each_node(body, [&](const Node& n) {
      if (n.kind == Node::set && n.targets.size() == 1 && reads(n.expr.get(), lists[k]) &&
          std::find(lists.begin(), lists.end(), n.targets[0]) == lists.end())
        lists.push_back(n.targets[0]);
    });
  }
  // Variables holding one message: those of loops over such lists.
  std::vector<std::string> messages;
  each_node(body, [&](const Node& n) {
    if (n.kind == Node::for_loop && n.targets.size() == 1 && reads_any(n.expr.get(), lists))
      messages.push_back(n.targets[0]);
  });
  bool found = false;
  each_node(body, [&](const Node& n) {
    if (n.kind == Node::for_loop &&
        (reads_any(n.expr.get(), messages, "content") || reads(n.expr.get(), "content")))
      found = true;
  });
  return found;
}

bool reads_tool_arguments_as_mapping(const Body& body) {
  // Variables holding arguments (`{% set args = call.arguments %}`), transitively.
  std::vector<std::string> aliases;
  const std::function<bool(const Expr*)> is_arguments = [&](const Expr* e) {
    if (!e) return false;
    if ((e->kind == Expr::attr && e->text == "arguments") ||
        (e->kind == Expr::item && is_string_literal(e->args[1].get()) &&
         e->args[1]->value.s == "arguments"))
      return true;
    if (e->kind == Expr::filter && (e->text == "default" || e->text == "d"))
      return is_arguments(e->args[0].get());
    return e->kind == Expr::name &&
           std::find(aliases.begin(), aliases.end(), e->text) != aliases.end();
  };
  // ...and macro parameters a call passes them to (`render_args(call.arguments)`).
  std::vector<const Node*> macros;
  each_node(body, [&](const Node& n) {
    if (n.kind == Node::macro) macros.push_back(&n);
  });
  const auto alias = [&](const std::string& name) {
    if (std::find(aliases.begin(), aliases.end(), name) == aliases.end()) aliases.push_back(name);
  };
  for (std::size_t before = 0;; before = aliases.size()) {
    each_node(body, [&](const Node& n) {
      if (n.kind == Node::set && n.targets.size() == 1 && is_arguments(n.expr.get()))
        alias(n.targets[0]);
    });
    each_expr(body, [&](const Expr& e) {
      if (e.kind != Expr::call || e.args[0]->kind != Expr::name) return;
      for (const Node* m : macros) {
        if (m->text != e.args[0]->text) continue;
        for (std::size_t k = 1; k < e.args.size() && k - 1 < m->targets.size(); ++k)
          if (is_arguments(e.args[k].get())) alias(m->targets[k - 1]);
        for (const auto& [key, value] : e.kwargs)
          if (is_arguments(value.get()) &&
              std::find(m->targets.begin(), m->targets.end(), key) != m->targets.end())
            alias(key);
      }
    });
    if (aliases.size() == before) break;
  }
  bool as_mapping = false, type_tested = false;
  each_expr(body, [&](const Expr& e) {
    const Expr* operand = e.args.empty() ? nullptr : e.args[0].get();
    if (e.kind == Expr::test && (e.text == "string" || e.text == "mapping") &&
        is_arguments(operand))
      type_tested = true;
    if (e.kind == Expr::filter &&
        (e.text == "items" || e.text == "dictsort" || e.text == "tojson") && is_arguments(operand))
      as_mapping = true;
    if (e.kind == Expr::call && operand && operand->kind == Expr::attr &&
        (operand->text == "items" || operand->text == "keys" || operand->text == "values" ||
         operand->text == "get") &&
        is_arguments(operand->args[0].get()))
      as_mapping = true;
    if (e.kind == Expr::item && is_arguments(operand) && is_string_literal(e.args[1].get()))
      as_mapping = true;
  });
  each_node(body, [&](const Node& n) {
    if (n.kind == Node::for_loop && is_arguments(n.expr.get())) as_mapping = true;
  });
  return as_mapping && !type_tested;
}

}  // namespace dcp::jinja
