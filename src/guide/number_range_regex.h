// Regular expressions of the JSON numbers within bounds, for JSON Schema's minimum, maximum,
// exclusiveMinimum and exclusiveMaximum: a schema's integer or number with bounds is guided to a
// text whose value lies within them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dcp {

struct WholeBound {
  std::int64_t value = 0;
  bool exclusive = false;
};

// The largest bound magnitude these regexes take (every whole number up to it is a double).
inline constexpr std::int64_t kMaxWholeBound = std::int64_t{1} << 53;

// Decimal texts of the integers within [lo, hi] (either side open when absent; each bound
// inclusive unless `exclusive`), as JSON writes them: no leading zeros, no "-0". Empty when no
// integer lies within. Bounds' magnitudes are at most kMaxWholeBound.
std::string integer_range_regex(std::optional<WholeBound> lo, std::optional<WholeBound> hi);

// The same for JSON numbers, whose bounds are whole numbers: an integer part and an optional
// fraction, without an exponent (a number with an exponent is a JSON number too; the regex keeps
// to the texts whose value it can bound digit by digit), and no "-0".
std::string decimal_range_regex(std::optional<WholeBound> lo, std::optional<WholeBound> hi);

}  // namespace dcp
