// Renders a parsed chat template against a context of values.
#pragma once

#include <string>

#include "syntax.h"
#include "value.h"

namespace dcp::jinja {

// `context` is a dict (the template's variables). Throws dcp::Error (invalid_argument) on a
// runtime error, raise_exception() included, naming the line.
std::string render(const Body& body, const Value& context);

}  // namespace dcp::jinja
