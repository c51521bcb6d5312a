#include "string_formats.h"

#include "number_range_regex.h"

namespace dcp {

std::optional<StringFormat> string_format(std::string_view name) {
  // Every piece below is ASCII, so a character is a byte and lengths are counted by hand.
  // RFC 3339's full-date: each month's days, February's 29th in leap years only; years 0001 to
  // 9999, those Python's date type (which Pydantic validates into) holds.
  const std::string leap_year =
      "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:[02468][48]|[2468]0|[13579][26])00)";
  const std::string year = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])";
  const std::string date = "(?:" + year +
                           "-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|"
                           "(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)|" +
                           leap_year + "-02-29)";
  // Fractions of a second to nanoseconds.
  const std::string time =
      "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,9})?(?:Z|[+-](?:[01][0-9]|2[0-3]):"
      "[0-5][0-9])?";
  if (name == "date") return StringFormat{date, 10, 10};
  if (name == "time") return StringFormat{time, 8, 8 + 10 + 6};
  if (name == "date-time") return StringFormat{date + "T" + time, 19, 19 + 10 + 6};
  if (name == "duration") {
    // RFC 3339 Appendix A's duration (Pydantic's timedelta) in weeks, or in days then hours,
    // minutes and seconds: up to 6 digits of weeks, 8 of days and 9 of the others, within the
    // 999999999 days Python's timedelta holds. Years and months, whose lengths vary, are not
    // written.
    const std::string n = "[0-9]{1,9}";
    const std::string second = n + "S", minute = n + "M(?:" + second + ")?";
    const std::string clock = "T(?:" + n + "H(?:" + minute + ")?|" + minute + "|" + second + ")";
    return StringFormat{"P(?:[0-9]{1,8}D(?:" + clock + ")?|" + clock + "|[0-9]{1,6}W)", 3,
                        1 + 9 + 1 + 3 * 10};
  }
  if (name == "uuid")
    return StringFormat{
        "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}", 36, 36};
  // Pydantic's UUID1 ... UUID8: that version, in RFC 4122's variant (Python's UUID.version is
  // None in any other).
  if (name.size() == 5 && name.starts_with("uuid") && name[4] >= '1' && name[4] <= '8' &&
      name[4] != '2')
    return StringFormat{"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-" + std::string(1, name[4]) +
                            "[0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}",
                        36, 36};
  const std::string octet = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])";
  const std::string ipv4 = octet + "(?:\\." + octet + "){3}";
  if (name == "ipv4") return StringFormat{ipv4, 7, 15};
  // RFC 4291 2.2's text forms: eight groups of 1-4 hex digits, or `::` for one or more groups of
  // zeros (a groups before it, b after, a + b <= 7), the last two groups written as an IPv4
  // address or not. Zone indices (`%eth0`) are not written.
  const std::string hextet = "[0-9a-fA-F]{1,4}";
  std::string ipv6 = "(?:" + hextet + ":){7}" + hextet + "|(?:" + hextet + ":){6}" + ipv4;
  for (int a = 0; a <= 7; ++a) {
    const std::string before = a == 0 ? ":" : "(?:" + hextet + ":){" + std::to_string(a) + "}";
    ipv6 += "|" + before + ":";
    if (a < 7) ipv6 += "|" + before + "(?::" + hextet + "){1," + std::to_string(7 - a) + "}";
    if (a <= 5)
      ipv6 += "|" + before + ":(?:" + hextet + ":){0," + std::to_string(5 - a) + "}" + ipv4;
  }
  if (name == "ipv6") return StringFormat{ipv6, 2, 6 * 5 + 15};
  if (name == "ipvanyaddress") return StringFormat{ipv4 + "|" + ipv6, 2, 6 * 5 + 15};
  // RFC 1123 labels, at most four of at most 62 characters: never past 253 in all.
  const std::string label = "[A-Za-z0-9](?:[A-Za-z0-9-]{0,60}[A-Za-z0-9])?";
  const std::string host = label + "(?:\\." + label + "){0,3}";
  if (name == "hostname") return StringFormat{host, 1, 4 * 62 + 3};
  if (name == "email") {
    // RFC 5321's dot-atom local part (at most four atoms of 15: under its 64) at a host name of
    // two or three labels: never past the 254 an address may hold.
    const std::string atom = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]{1,15}";
    return StringFormat{atom + "(?:\\." + atom + "){0,3}@" + label + "(?:\\." + label + "){1,2}", 5,
                        (4 * 15 + 3) + 1 + (3 * 62 + 2)};
  }
  if (name == "uri") {
    // RFC 3986's scheme://authority/path?query#fragment with a host name (or address) and
    // bounded parts: a path and a query of up to 255 characters or percent escapes each, a
    // fragment of up to 64; never past the 2083 Pydantic's HttpUrl allows.
    const std::string unit = "(?:[A-Za-z0-9._~!$&'()*+,;=:@/-]|%[0-9A-Fa-f]{2})";
    const std::string query_unit = "(?:[A-Za-z0-9._~!$&'()*+,;=:@/?-]|%[0-9A-Fa-f]{2})";
    const std::string port = integer_range_regex(WholeBound{0}, WholeBound{65535});
    return StringFormat{
        "[A-Za-z][A-Za-z0-9+.-]{0,15}://" + host + "(?::" + port + ")?(?:/" + unit +
            "{0,255})?(?:\\?" + query_unit + "{0,255})?(?:#" + query_unit + "{0,64})?",
        5, 16 + 3 + (4 * 62 + 3) + 6 + (1 + 3 * 255) + (1 + 3 * 255) + (1 + 3 * 64)};
  }
  return std::nullopt;
}

}  // namespace dcp
