// Ranges of numbers as regexes, digit by digit: a range of texts of one length is a common prefix,
// then the first differing digit (its low end's rest at least as large, its high end's rest at
// most as large, anything between), and a range of whole numbers is one such range per length.
#include "number_range_regex.h"

#include <algorithm>
#include <vector>

#include "dcp/error.h"

namespace dcp {
namespace number_range {  // named: a unity build shares one file's anonymous namespace

std::string alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(?:";
  for (std::size_t i = 0; i < alts.size(); ++i) out += (i ? "|" : "") + alts[i];
  return out + ")";
}

std::string digit_class(char lo, char hi) {
  return lo == hi ? std::string(1, lo) : std::string("[") + lo + "-" + hi + "]";
}

std::string any_digits(std::size_t n) {
  return n == 0 ? "" : n == 1 ? "[0-9]" : str("[0-9]{", n, "}");
}

// Digit strings of lo's length from lo to hi (lo <= hi as numbers, leading zeros kept).
std::string same_length(const std::string& lo, const std::string& hi) {
  if (lo == hi) return lo;
  std::size_t i = 0;
  while (lo[i] == hi[i]) ++i;
  const std::size_t rest = lo.size() - i - 1;
  const std::string lo_rest = lo.substr(i + 1), hi_rest = hi.substr(i + 1);
  const std::string zeros(rest, '0'), nines(rest, '9');
  std::string out = lo.substr(0, i);
  if (lo_rest == zeros && hi_rest == nines)
    return out + digit_class(lo[i], hi[i]) + any_digits(rest);
  std::vector<std::string> alts{lo[i] + same_length(lo_rest, nines)};
  if (lo[i] + 1 <= hi[i] - 1)
    alts.push_back(digit_class(static_cast<char>(lo[i] + 1), static_cast<char>(hi[i] - 1)) +
                   any_digits(rest));
  alts.push_back(hi[i] + same_length(zeros, hi_rest));
  return out + alternatives(alts);
}

std::int64_t power_of_ten(std::size_t n) {
  std::int64_t p = 1;
  while (n-- > 0) p *= 10;
  return p;
}

// Whole numbers from a to b (0 <= a <= b; b absent: no end), without leading zeros.
std::string naturals(std::int64_t a, std::optional<std::int64_t> b) {
  const std::size_t from = std::to_string(a).size();
  const std::size_t to = b ? std::to_string(*b).size() : from;
  std::vector<std::string> alts;
  for (std::size_t d = from; d <= to; ++d) {
    const std::int64_t lo = std::max(a, d == 1 ? 0 : power_of_ten(d - 1));
    const std::int64_t hi = b ? std::min(*b, power_of_ten(d) - 1) : power_of_ten(d) - 1;
    alts.push_back(same_length(std::to_string(lo), std::to_string(hi)));
  }
  if (!b) alts.push_back(str("[1-9][0-9]{", from, ",}"));  // the longer ones
  return alternatives(alts);
}

// Magnitudes m >= 0 written as an integer part and an optional fraction (or the integer part
// alone when `whole`), with lo (<)= m (<)= hi; empty when none is.
std::string magnitudes(WholeBound lo, std::optional<WholeBound> hi, bool whole) {
  if (whole) {  // bounds made inclusive
    const std::int64_t a = lo.exclusive ? lo.value + 1 : lo.value;
    std::optional<std::int64_t> b;
    if (hi) b = hi->exclusive ? hi->value - 1 : hi->value;
    if (b && *b < a) return "";
    return naturals(a, b);
  }
  const std::string fraction = "(?:\\.[0-9]+)?", zero_fraction = "(?:\\.0+)?";
  const std::int64_t a = lo.value;
  if (hi && (hi->value < a || (hi->value == a && (lo.exclusive || hi->exclusive)))) return "";
  if (hi && hi->value == a) return std::to_string(a) + zero_fraction;
  std::vector<std::string> alts;
  // The integer part a: above a only when the bound excludes a itself.
  alts.push_back(std::to_string(a) + (lo.exclusive ? "\\.[0-9]*[1-9][0-9]*" : fraction));
  // Integer parts strictly between: any fraction.
  if (!hi || a + 1 <= hi->value - 1)
    alts.push_back(naturals(a + 1, hi ? std::optional(hi->value - 1) : std::nullopt) + fraction);
  // The integer part hi: hi itself only.
  if (hi && !hi->exclusive) alts.push_back(std::to_string(hi->value) + zero_fraction);
  return alternatives(alts);
}

std::string signed_range(std::optional<WholeBound> lo, std::optional<WholeBound> hi, bool whole) {
  std::vector<std::string> alts;
  // Values >= 0, written without a sign.
  if (!hi || hi->value > 0 || (hi->value == 0 && !hi->exclusive)) {
    const WholeBound from = lo && lo->value >= 0 ? *lo : WholeBound{0, false};
    const std::string m = magnitudes(from, hi, whole);
    if (!m.empty()) alts.push_back(m);
  }
  // Values < 0: a minus sign, then their magnitude, which is above 0 (no "-0").
  if (!lo || lo->value < 0) {
    const WholeBound from =
        hi && hi->value < 0 ? WholeBound{-hi->value, hi->exclusive} : WholeBound{0, true};
    std::optional<WholeBound> to;
    if (lo) to = WholeBound{-lo->value, lo->exclusive};
    const std::string m = magnitudes(from, to, whole);
    if (!m.empty()) alts.push_back("-" + m);  // m has no top-level '|': alternatives() groups
  }
  return alts.empty() ? "" : alternatives(alts);
}

}  // namespace number_range

std::string integer_range_regex(std::optional<WholeBound> lo, std::optional<WholeBound> hi) {
  return number_range::signed_range(lo, hi, true);
}

std::string decimal_range_regex(std::optional<WholeBound> lo, std::optional<WholeBound> hi) {
  return number_range::signed_range(lo, hi, false);
}

}  // namespace dcp
