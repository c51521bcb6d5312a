// A chat template's syntax: source -> segments (text and tags, Jinja's whitespace rules applied)
// -> a tree of nodes (text, output, if, for, set, macro, call) holding expression trees.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "value.h"

namespace dcp::jinja {

struct Expr;
using ExprPtr = std::shared_ptr<Expr>;
struct Expr {
  // clang-format off
  enum Kind { literal, name, attr, item, slice, call, filter, test, unary, binary, cond, list_lit,
              dict_lit };
  // clang-format on
  Kind kind;
  int line = 0;
  Value value;                // literal
  std::string text;           // name, attribute, filter or test name, operator
  std::vector<ExprPtr> args;  // operands, call and filter arguments, list items, dict pairs
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // test: "is not"
  int depth = 1;         // of the tree under it: evaluation recurses this deep
};

struct Node;
using Body = std::vector<std::shared_ptr<Node>>;
struct Node {
  // clang-format off
  enum Kind { text_node, output, if_chain, for_loop, set, macro, call_block, loop_break,
              loop_continue } kind;
  // clang-format on
  int line = 0;
  std::string text;                                // text; macro: its name
  ExprPtr expr;  // output, for's iterable, set's value (null: a block set, its text the body's)
  std::vector<std::pair<ExprPtr, Body>> branches;  // if/elif (null condition: else)
  std::vector<std::string> targets;  // for's loop variables; set: name [, attr]; macro: parameters
  std::vector<ExprPtr> defaults;     // macro: each parameter's default (null: none)
  bool varargs = false, kwargs = false;  // macro: its body reads `varargs` / `kwargs`
  bool caller = false;                   // macro: its body reads `caller` (a call block's body)
  ExprPtr filter;                        // for ... if filter
  Body body, else_body;                  // for; macro and block set: body
  // call_block: `expr` calls a macro with `caller`, a macro of the block's parameters and body.
  std::shared_ptr<Node> caller_macro;
};

// Parses a template; throws dcp::Error (invalid_argument) naming the line of a syntax error or
// of a construct the interpreter does not run.
Body parse(const std::string& source);

}  // namespace dcp::jinja
