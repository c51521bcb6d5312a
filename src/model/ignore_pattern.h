// compressed-tensors' `ignore` entries of the form "re:PATTERN": whether a module's name matches
// PATTERN from its start, as Python's re.match reads it.
#pragma once

#include <string>

namespace dcp {

// PCRE2 (whose syntax Python's re shares more of than ECMAScript's), compiled once per pattern
// for the process, with the work of one match bounded: a pattern that backtracks without end
// (`(a+)+$`) is refused rather than left to run. Throws dcp::Error (unsupported) naming the entry
// when the pattern does not compile or a match passes that bound.
bool ignore_pattern_matches(const std::string& pattern, const std::string& module);

}  // namespace dcp
