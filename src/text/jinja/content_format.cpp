#include "content_format.h"

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

namespace dcp::jinja {
namespace {

// Every node of the tree (bodies of ifs, loops and macros included), in source order.
void each_node(const Body& body, const std::function<void(const Node&)>& visit) {
  for (const auto& n : body) {
    visit(*n);
    for (const auto& [cond, b] : n->branches) each_node(b, visit);
    each_node(n->body, visit);
    each_node(n->else_body, visit);
  }
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
    return is_name(e->args[0].get()) && k->kind == Expr::literal &&
           k->value.kind == Value::string && k->value.s == key;
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

}  // namespace dcp::jinja
