// JSON Schema's string formats as regexes of their texts, for the schema compiler: each a subset
// of the format (bounded parts, no leap seconds), its texts all ASCII, from min_chars to max_chars
// characters long (so that lengths beside a format can be checked against it).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dcp {

struct StringFormat {
  std::string regex;
  int min_chars, max_chars;
};

// The formats a schema may name, for messages: those string_format knows, and password (any
// string), which the schema compiler reads as no format.
inline constexpr std::string_view kStringFormats =
    "date, time, date-time, duration, uuid, uuid1, uuid3-uuid8, ipv4, ipv6, ipvanyaddress, "
    "hostname, email, uri, password";

// nullopt for a format it does not know.
std::optional<StringFormat> string_format(std::string_view name);

}  // namespace dcp
