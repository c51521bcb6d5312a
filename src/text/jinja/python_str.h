// Case changes and whitespace as Python's str methods see them, on UTF-8 text: full Unicode case
// mappings (ß upper is SS), the final-sigma rule of lower, titlecase letters (ǅ), and Unicode
// whitespace (U+00A0, U+3000, ...). Chat templates render with Python's Jinja, so `|upper` or
// `.split()` on a message in any script must give Python's text. Bytes that are not UTF-8 pass
// through unchanged.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace dcp::jinja {

std::string py_upper(std::string_view s);       // str.upper()
std::string py_lower(std::string_view s);       // str.lower()
std::string py_title(std::string_view s);       // str.title()
std::string py_capitalize(std::string_view s);  // str.capitalize()
// Jinja's `title` filter, which is not str.title(): each word (a run after '-', '(', '{', '[',
// '<' or whitespace) gets its first character upper-cased and the rest lower-cased, so "it's"
// becomes "It's" (str.title() gives "It'S").
std::string jinja_title(std::string_view s);
// str.strip(chars), lstrip (right false) or rstrip (left false): the characters of `chars` (code
// points, not bytes), or whitespace when there is no `chars`.
std::string py_strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                     bool right);
// str.split() without a separator: on runs of whitespace, at most `maxsplit` times (negative: no
// limit), the rest kept whole past that (its trailing whitespace too) without its leading run.
std::vector<std::string> py_split_whitespace(std::string_view s, std::int64_t maxsplit);
// str.rsplit() without a separator: the same from the right end.
std::vector<std::string> py_rsplit_whitespace(std::string_view s, std::int64_t maxsplit);
// str.splitlines(keepends): at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028 and U+2029.
std::vector<std::string> py_splitlines(std::string_view s, bool keepends);
// repr(s): quoted with ' (or " when only ' occurs), backslash escapes for the quote, \\, \t,
// \n, \r, and every character str.isprintable() refuses (\xNN, \uNNNN, \UNNNNNNNN).
std::string py_repr(std::string_view s);

}  // namespace dcp::jinja
