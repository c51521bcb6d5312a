// Each schema node becomes a regex fragment for its JSON text (outlines' approach, written anew):
// objects write their properties in the schema's order, each optional one present or not.
#include "dcp/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "dcp/error.h"
#include "dcp/regex_dfa.h"
#include "number_range_regex.h"
#include "string_formats.h"

namespace dcp {
namespace {

using Json = nlohmann::ordered_json;

// Between tokens at most one space, as json.dumps writes: a model that favours blank space cannot
// spend its tokens on it.
const std::string kWs = " ?";
// One character of a JSON string: any but a quote, a backslash or a control character; or an
// escape, a surrogate only in a pair (strict parsers refuse one alone, and a pair is one
// character to minLength and maxLength).
const std::string kChar =
    "(?:[^\"\\\\\\x00-\\x1F]|\\\\[\"\\\\/"
    "bfnrt]|\\\\u(?:[0-9a-cA-CeEfF][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2}|"
    "[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}))";
const std::string kInteger = "-?(?:0|[1-9][0-9]*)";
const std::string kNumber = kInteger + "(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?";

// The keywords that constrain a value which the compiler honours (others are refused).
const std::set<std::string, std::less<>> kKeywords = {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "patternProperties",
    "items",
    "prefixItems",
    "uniqueItems",
    "minItems",
    "maxItems",
    "enum",
    "const",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "anyOf",
    "oneOf",
    "allOf",
    "$ref",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
};

// OpenAPI's 'discriminator' names the property that tells a oneOf's schemas apart, which the
// schemas' own 'const's already enforce; readOnly, writeOnly and deprecated (which Pydantic writes
// for computed fields, SecretStr and deprecated fields) are meta-data, as 2020-12 has them.
const std::set<std::string, std::less<>> kAnnotations = {
    "title", "description", "default",       "examples", "$schema",   "$id",        "$comment",
    "$defs", "definitions", "discriminator", "readOnly", "writeOnly", "deprecated",
};

// `text` as a regex literal.
std::string literal(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto b = static_cast<unsigned char>(c);
    if (b < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", b);
      out += hex;
    } else {
      if (std::strchr("\\.^$|?*+()[]{}", c)) out += '\\';
      out += c;
    }
  }
  return out;
}

std::string group(const std::vector<std::string>& alternatives) {
  std::string out = "(?:";
  for (std::size_t i = 0; i < alternatives.size(); ++i) out += (i ? "|" : "") + alternatives[i];
  return out + ")";
}

// {lo,hi} with hi < 0 meaning unbounded.
std::string repeat(int lo, int hi) {
  return hi < 0 ? str("{", lo, ",}") : str("{", lo, ",", hi, "}");
}

// A JSON string, its characters unconstrained.
const std::string kAnyString = "\"" + kChar + "*\"";

// `element` listed between brackets, comma-separated, `lo` to `hi` times (hi < 0: unbounded).
std::string listed(const std::string& open, const std::string& element, int lo, int hi,
                   const std::string& close) {
  std::string elements;
  if (hi != 0) {
    const std::string more = "(?:" + kWs + "," + kWs + element + ")";
    elements = element + more + repeat(std::max(lo - 1, 0), hi < 0 ? -1 : hi - 1);
    if (lo == 0) elements = "(?:" + elements + ")?";
  }
  return open + kWs + elements + kWs + close;
}

// Any JSON value whose arrays and objects nest at most `levels` deep (a regex cannot count
// brackets without a bound).
std::string any_value(int levels) {
  const std::string scalar = kAnyString + "|" + kNumber + "|true|false|null";
  if (levels == 0) return "(?:" + scalar + ")";
  const std::string inner = any_value(levels - 1);
  return "(?:" + scalar + "|" + listed("\\[", inner, 0, -1, "\\]") + "|" +
         listed("\\{", kAnyString + kWs + ":" + kWs + inner, 0, -1, "\\}") + ")";
}

// The fewest and most characters of a pattern's matches (most -1: unbounded), counted as the
// UTF-8 bytes that begin one along the automaton's paths: 0-1 breadth-first for the fewest,
// the longest path of the state graph (which a cycle makes unbounded) for the most.
std::pair<std::int64_t, std::int64_t> pattern_span(const RegexDfa& dfa) {
  const auto n = static_cast<std::size_t>(dfa.states());
  const auto begins_character = [](int b) { return (b & 0xC0) != 0x80; };
  std::vector<std::int64_t> fewest(n, -1);
  std::deque<std::pair<std::int32_t, std::int64_t>> todo{{dfa.start(), 0}};
  std::int64_t min_chars = -1;
  while (!todo.empty()) {
    const auto [st, d] = todo.front();
    todo.pop_front();
    if (fewest[static_cast<std::size_t>(st)] >= 0) continue;
    fewest[static_cast<std::size_t>(st)] = d;
    if (dfa.accepting(st) && (min_chars < 0 || d < min_chars)) min_chars = d;
    for (int b = 0; b < 256; ++b) {
      const std::int32_t t = dfa.next(st, static_cast<std::uint8_t>(b));
      if (t == RegexDfa::kDead || fewest[static_cast<std::size_t>(t)] >= 0) continue;
      if (begins_character(b))
        todo.emplace_back(t, d + 1);
      else
        todo.emplace_front(t, d);
    }
  }
  // Kahn's order over the edges; states left over lie on a cycle.
  std::vector<std::vector<std::pair<std::int32_t, int>>> out(n);
  std::vector<int> into(n, 0);
  for (std::size_t st = 0; st < n; ++st) {
    for (int b = 0; b < 256; ++b) {
      const std::int32_t t = dfa.next(static_cast<std::int32_t>(st), static_cast<std::uint8_t>(b));
      if (t == RegexDfa::kDead) continue;
      out[st].emplace_back(t, begins_character(b) ? 1 : 0);
      ++into[static_cast<std::size_t>(t)];
    }
  }
  std::vector<std::int64_t> most(n, 0);
  std::vector<std::int32_t> ready;
  for (std::size_t st = 0; st < n; ++st)
    if (into[st] == 0) ready.push_back(static_cast<std::int32_t>(st));
  std::size_t ordered = 0;
  std::int64_t max_chars = 0;
  while (!ready.empty()) {
    const auto st = static_cast<std::size_t>(ready.back());
    ready.pop_back();
    ++ordered;
    if (dfa.accepting(static_cast<std::int32_t>(st))) max_chars = std::max(max_chars, most[st]);
    for (const auto& [t, w] : out[st]) {
      most[static_cast<std::size_t>(t)] = std::max(most[static_cast<std::size_t>(t)], most[st] + w);
      if (--into[static_cast<std::size_t>(t)] == 0) ready.push_back(t);
    }
  }
  return {min_chars, ordered < n ? -1 : max_chars};
}

// A regex of no text (a class with no character): what a reference below the recursion bound
// stands for; the automaton drops every path through it.
const std::string kNoValue = "[^\\x00-\\x{10FFFF}]";

class Compiler {
 public:
  // The root counts as a level of itself ('$ref': '#').
  Compiler(const Json& root, std::string_view field)
      : root_(root), field_(field), expanding_{"#"} {}

  // The regex of the values `s` admits. Every regex compiled is counted against
  // kMaxSchemaRegexBytes: copies multiply (a $ref in a list is written twice, recursion
  // repeats a definition), so a few hundred bytes of schema could otherwise ask for gigabytes.
  std::string value(const Json& s, const std::string& where) {
    std::string out = value_of(s, where);
    written_ += out.size();
    if (written_ > kMaxSchemaRegexBytes)
      fail(where,
           str("the schema is too large (its regex passes ", kMaxSchemaRegexBytes, " bytes)"));
    return out;
  }

  // Whether a recursive $ref was cut at kMaxRecursion levels.
  bool cut_recursion() const noexcept { return cut_recursion_; }

 private:
  std::string value_of(const Json& s, const std::string& where) {
    // Schemas are compiled by recursion: bound it, so that a deep one cannot overflow the stack.
    struct Nesting {
      int& depth;
      ~Nesting() { --depth; }
    } nesting{++depth_};
    if (depth_ > kMaxSchemaNesting)
      fail(where, str("the schema nests more than ", kMaxSchemaNesting, " levels"));
    if (s.is_boolean()) {
      if (s.get<bool>()) return any_value(kFreeFormNesting);
      fail(where, "the schema false admits no value");
    }
    if (!s.is_object()) fail(where, "a schema must be an object, true or false");
    for (const auto& [key, v] : s.items()) {
      if (!kKeywords.count(key) && !kAnnotations.count(key))
        fail(where, "'" + key + "' is not supported");
    }
    // `keyword` with annotations at most (and 'type' where `typed`).
    const auto only = [&](std::string_view keyword, bool typed = false) {
      for (const auto& [key, v] : s.items()) {
        if (key != keyword && !kAnnotations.count(key) && !(typed && key == "type"))
          fail(where, "'" + std::string(keyword) + "' with '" + key + "' is not supported");
      }
    };
    if (s.contains("$ref")) {
      only("$ref");
      return reference(s["$ref"], where);
    }
    if (s.contains("const")) {
      only("const", true);
      if (!of_type(s, s["const"], where))
        fail(where, "'const' " + s["const"].dump() + " is not of its 'type'");
      return literal(s["const"].dump());
    }
    if (s.contains("enum")) {
      only("enum", true);
      const Json& e = s["enum"];
      if (!e.is_array() || e.empty()) fail(where, "'enum' must be a non-empty list");
      std::vector<std::string> alts;
      for (const Json& v : e) {
        if (of_type(s, v, where)) alts.push_back(literal(v.dump()));  // both must hold
      }
      if (alts.empty()) fail(where, "no value of 'enum' is of its 'type'");
      return group(alts);
    }
    if (s.contains("allOf")) {  // one schema, as Pydantic wraps a described $ref
      only("allOf");
      const Json& a = s["allOf"];
      if (!a.is_array() || a.size() != 1) fail(where, "'allOf' is supported with one schema only");
      return value(a[0], where + "/allOf/0");
    }
    if (s.contains("oneOf")) {  // exactly one: written as anyOf where no value can satisfy two
      only("oneOf");
      const Json& a = s["oneOf"];
      if (!a.is_array() || a.empty()) fail(where, "'oneOf' must be a non-empty list");
      for (std::size_t j = 1; j < a.size(); ++j) {
        for (std::size_t i = 0; i < j; ++i) {
          if (!exclusive(a[i], a[j]))
            fail(where, str("'oneOf' schemas ", i, " and ", j,
                            " may both hold for one value (supported: schemas of different "
                            "types, or objects whose 'const' of a common required property "
                            "differs)"));
        }
      }
      std::vector<std::string> alts;
      for (std::size_t i = 0; i < a.size(); ++i)
        alts.push_back(value(a[i], str(where, "/oneOf/", i)));
      return group(alts);
    }
    if (s.contains("anyOf")) {
      only("anyOf");
      const Json& a = s["anyOf"];
      if (!a.is_array() || a.empty()) fail(where, "'anyOf' must be a non-empty list");
      std::vector<std::string> alts;
      for (std::size_t i = 0; i < a.size(); ++i)
        alts.push_back(value(a[i], where + "/anyOf/" + std::to_string(i)));
      return group(alts);
    }
    std::vector<std::string> types;
    if (!s.contains("type")) {
      const auto has = [&](std::initializer_list<const char*> keys) {
        return std::any_of(keys.begin(), keys.end(), [&](const char* k) { return s.contains(k); });
      };
      // Keywords that hold of one type only: a value of that type satisfies them (msgspec writes
      // a dict's propertyNames as {"pattern": ...}).
      if (has({"properties", "additionalProperties", "minProperties", "maxProperties",
               "propertyNames", "patternProperties"})) {
        types = {"object"};
      } else if (has({"items", "prefixItems", "minItems", "maxItems"})) {
        types = {"array"};
      } else if (has({"pattern", "format", "minLength", "maxLength"})) {
        types = {"string"};
      } else if (std::all_of(s.items().begin(), s.items().end(),
                             [](const auto& kv) { return kAnnotations.count(kv.key()) > 0; })) {
        return any_value(kFreeFormNesting);  // {} or annotations only: any value
      } else {
        fail(where, "a schema needs 'type' (or 'enum', 'const', 'anyOf', '$ref')");
      }
    } else if (s["type"].is_string()) {
      types = {s["type"].get<std::string>()};
    } else if (s["type"].is_array() && !s["type"].empty()) {
      for (const Json& t : s["type"]) {
        if (!t.is_string()) fail(where, "'type' must be a string or a list of strings");
        types.push_back(t.get<std::string>());
      }
    } else {
      fail(where, "'type' must be a string or a list of strings");
    }
    std::vector<std::string> alts;
    for (const std::string& t : types) alts.push_back(typed(s, t, where));
    return alts.size() == 1 ? alts[0] : group(alts);
  }

  [[noreturn]] void fail(const std::string& where, const std::string& why) const {
    throw Error(ErrorCategory::invalid_argument,
                str("'", field_, "': the schema at '", where, "': ", why));
  }

  // A non-negative integer keyword, at most `most` (no bound when `most` < 0).
  std::int64_t whole(const Json& s, const char* key, const std::string& where,
                     std::int64_t fallback, std::int64_t most) const {
    if (!s.contains(key)) return fallback;
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<std::int64_t>() < 0 ||
        (most >= 0 && v.get<std::int64_t>() > most))
      fail(where, most < 0 ? str("'", key, "' must be a non-negative integer")
                           : str("'", key, "' must be an integer in [0, ", most, "]"));
    return v.get<std::int64_t>();
  }

  // A count a regex repeats by (minItems, maxLength, ...).
  int count(const Json& s, const char* key, const std::string& where, int fallback) const {
    return static_cast<int>(whole(s, key, where, fallback, RegexDfa::kMaxRepeat));
  }

  // Keywords that belong to other types are refused rather than ignored.
  void allow(const Json& s, const std::string& t, const std::string& where,
             std::initializer_list<const char*> keys) {
    for (const auto& item : s.items()) {
      const std::string& key = item.key();  // a name a lambda may capture (clang 14)
      if (key == "type" || kAnnotations.count(key)) continue;
      if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return key == k; }))
        fail(where, "'" + key + "' does not apply to type '" + t + "'");
    }
  }

  std::string typed(const Json& s, const std::string& t, const std::string& where) {
    if (t == "string") {
      allow(s, t, where, {"minLength", "maxLength", "pattern", "format"});
      return "\"" + string_body(s, where) + "\"";
    }
    if (t == "integer" || t == "number") {
      allow(s, t, where,
            {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"});
      return number(s, t == "integer", where);
    }
    if (t == "boolean") {
      allow(s, t, where, {});
      return "(?:true|false)";
    }
    if (t == "null") {
      allow(s, t, where, {});
      return "null";
    }
    if (t == "array") {
      allow(s, t, where, {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"});
      int lo = count(s, "minItems", where, 0), hi = count(s, "maxItems", where, -1);
      if (hi >= 0 && hi < lo) fail(where, "'maxItems' is below 'minItems'");
      const bool no_items = s.contains("items") && s["items"] == false;
      if (s.contains("uniqueItems")) {  // nothing to keep apart in at most one item
        if (!s["uniqueItems"].is_boolean()) fail(where, "'uniqueItems' must be true or false");
        if (s["uniqueItems"] == true && (hi < 0 || hi > 1) &&
            !(no_items && !s.contains("prefixItems")))
          return distinct(s, lo, hi, where);
      }
      if (s.contains("prefixItems")) return tuple(s, lo, hi, where);
      if (no_items) {
        if (lo > 0) fail(where, "'minItems' asks for items, which 'items' false forbids");
        hi = 0;
      }
      // Without 'items' the array is a value left free: its items nest one level less.
      const std::string item = !s.contains("items")  ? any_value(kFreeFormNesting - 1)
                               : s["items"] == false ? ""
                                                     : value(s["items"], where + "/items");
      return listed("\\[", item, lo, hi, "\\]");
    }
    if (t == "object") {
      allow(s, t, where,
            {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
             "propertyNames", "patternProperties"});
      if (!s.contains("properties")) return map(s, where);
      if (!s["properties"].is_object()) fail(where, "'properties' must be an object");
      if (s.contains("propertyNames") || s.contains("patternProperties"))
        fail(where,
             "'propertyNames' and 'patternProperties' are supported without 'properties' only");
      if (s.contains("minProperties") || s.contains("maxProperties"))
        fail(where, "'minProperties' and 'maxProperties' are supported without 'properties' only");
      std::set<std::string> required;
      if (s.contains("required")) {
        if (!s["required"].is_array()) fail(where, "'required' must be a list of names");
        for (const Json& n : s["required"]) {
          if (!n.is_string() || !s["properties"].contains(n.get<std::string>()))
            fail(where, "'required' names " + n.dump() + ", which 'properties' does not hold");
          required.insert(n.get<std::string>());
        }
      }
      std::vector<std::string> props;
      std::vector<bool> needed;
      for (const auto& [name, sub] : s["properties"].items()) {
        props.push_back(literal(Json(name).dump()) + kWs + ":" + kWs +
                        value(sub, where + "/properties/" + name));
        needed.push_back(required.count(name) > 0);
      }
      // after(i): properties i.. once one was written (each then follows a comma);
      // first(i): properties i.. when none was written yet.
      const std::size_t n = props.size();
      std::vector<std::string> after(n + 1);
      for (std::size_t i = n; i-- > 0;) {
        const std::string c = kWs + "," + kWs + props[i];
        after[i] = (needed[i] ? c : "(?:" + c + ")?") + after[i + 1];
      }
      std::string first;
      for (std::size_t i = n; i-- > 0;)
        first = needed[i]
                    ? props[i] + after[i + 1]
                    : "(?:" + props[i] + after[i + 1] + (first.empty() ? ")?" : "|" + first + ")");
      return "\\{" + kWs + first + kWs + "\\}";
    }
    fail(where, "type '" + t + "' is not a JSON Schema type");
  }

  // An array of distinct items ('uniqueItems', Pydantic's set[X]) where a regex can keep them
  // apart: items from a list of values (an enum, a const), each written at most once, in the
  // list's order. Elsewhere (a set of strings, of numbers) it would need to remember every item.
  std::string distinct(const Json& s, int lo, int hi, const std::string& where) {
    const Json* items =
        s.contains("items") && !s.contains("prefixItems") ? resolved(s["items"]) : nullptr;
    std::vector<std::string> values;
    if (items && items->is_object() && (items->contains("enum") || items->contains("const"))) {
      value(s["items"], where + "/items");  // refuses what the items' schema would
      const Json listed =
          items->contains("const") ? Json::array({(*items)["const"]}) : (*items)["enum"];
      std::vector<Json> kept;
      for (const Json& v : listed) {
        if (v.is_structured())
          fail(where, "'uniqueItems' is supported for items of scalar values only");
        // 1 and 1.0 are one value to uniqueness: each is written once.
        if (of_type(*items, v, where) && std::find(kept.begin(), kept.end(), v) == kept.end()) {
          kept.push_back(v);
          values.push_back(literal(v.dump()));
        }
      }
    }
    if (values.empty())
      fail(where,
           "'uniqueItems' is supported for items listed by 'enum' or 'const', or at most one "
           "item, only (a regex cannot remember which items it wrote)");
    const int n = static_cast<int>(values.size());
    if (lo > n) fail(where, str("'minItems' asks for more than the ", n, " distinct items"));
    if (lo > 1 || (hi >= 0 && hi < n))
      fail(where,
           "'uniqueItems' is supported with 'minItems' of 0 or 1 and no 'maxItems' below "
           "the number of values only");
    // after[i]: any of values i.. in order, each after a comma.
    std::vector<std::string> after(values.size() + 1);
    for (std::size_t i = values.size(); i-- > 0;)
      after[i] = "(?:" + kWs + "," + kWs + values[i] + ")?" + after[i + 1];
    std::vector<std::string> firsts;
    for (std::size_t i = 0; i < values.size(); ++i) firsts.push_back(values[i] + after[i + 1]);
    std::string items_regex = group(firsts);
    if (lo == 0) items_regex = "(?:" + items_regex + ")?";
    return "\\[" + kWs + items_regex + kWs + "\\]";
  }

  // An array of 'prefixItems' (Pydantic's tuples): the i-th item under the i-th schema, then
  // items under 'items' (false or absent: no more, unless 'minItems' asks for more, which are
  // then left free), lo to hi items in all.
  std::string tuple(const Json& s, int lo, int hi, const std::string& where) {
    const Json& prefix = s["prefixItems"];
    if (!prefix.is_array() || prefix.empty())
      fail(where, "'prefixItems' must be a non-empty list of schemas");
    std::vector<std::string> first;
    for (std::size_t i = 0; i < prefix.size(); ++i)
      first.push_back(value(prefix[i], str(where, "/prefixItems/", i)));
    const int listed_count = static_cast<int>(first.size());
    std::string rest;
    if (s.contains("items") && s["items"] != false) {
      rest = value(s["items"], where + "/items");
    } else if (lo > listed_count) {
      if (s.contains("items"))
        fail(where,
             "'minItems' asks for more items than 'prefixItems' lists, which 'items' "
             "false forbids");
      rest = any_value(kFreeFormNesting);
    }
    const int cap = hi >= 0 ? hi : rest.empty() ? listed_count : -1;  // -1: unbounded
    // after[i]: what follows once i items are written.
    std::string after;
    if (!rest.empty() && (cap < 0 || cap > listed_count))
      after = "(?:" + kWs + "," + kWs + rest + ")" +
              repeat(std::max(lo - listed_count, 0), cap < 0 ? -1 : cap - listed_count);
    for (int i = std::min(listed_count, cap < 0 ? listed_count : cap) - 1; i >= 1; --i) {
      const std::string c = kWs + "," + kWs + first[static_cast<std::size_t>(i)] + after;
      after = i >= lo ? "(?:" + c + ")?" : c;
    }
    std::string items = cap == 0 ? "" : first[0] + after;
    if (lo == 0 && !items.empty()) items = "(?:" + items + ")?";
    return "\\[" + kWs + items + kWs + "\\]";
  }

  // An object without 'properties' (a map): names under 'propertyNames' (Pydantic's dict keyed by
  // an enum), each value under 'additionalProperties' (absent or true: a value left free, one
  // level less deep); or names matching the one pattern of 'patternProperties' (Pydantic's dict
  // keyed by a constr), each value under its schema, no other name being written. minProperties to
  // maxProperties of them.
  std::string map(const Json& s, const std::string& where) {
    const int lo = count(s, "minProperties", where, 0);
    int hi = count(s, "maxProperties", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "'maxProperties' is below 'minProperties'");
    // A regex cannot keep names apart: a repeated name would count once when parsed.
    if (lo > 1) fail(where, "'minProperties' above 1 is not supported (names may repeat)");
    if (s.contains("required")) fail(where, "'required' needs 'properties'");
    if (s.contains("patternProperties")) {
      if (s.contains("propertyNames"))
        fail(where, "'propertyNames' and 'patternProperties' are not supported together");
      const Json& patterned = s["patternProperties"];
      if (!patterned.is_object() || patterned.size() != 1)
        fail(where, "'patternProperties' is supported with one pattern only");
      const std::string pattern = patterned.items().begin().key();
      const std::string name =
          value(Json{{"type", "string"}, {"pattern", pattern}}, where + "/patternProperties");
      const std::string member =
          value(patterned.items().begin().value(), where + "/patternProperties/" + pattern);
      return listed("\\{", name + kWs + ":" + kWs + member, lo, hi, "\\}");
    }
    const std::string name = s.contains("propertyNames")
                                 ? names(s["propertyNames"], where + "/propertyNames")
                                 : kAnyString;
    std::string member;
    if (!s.contains("additionalProperties") || s["additionalProperties"] == true) {
      member = any_value(kFreeFormNesting - 1);
    } else if (s["additionalProperties"] == false) {
      if (lo > 0)
        fail(where,
             "'minProperties' asks for properties, which 'additionalProperties' false "
             "forbids");
      hi = 0;
    } else {
      member = value(s["additionalProperties"], where + "/additionalProperties");
    }
    return listed("\\{", name + kWs + ":" + kWs + member, lo, hi, "\\}");
  }

  // A map's names under 'propertyNames': a schema all of whose values are strings.
  std::string names(const Json& n, const std::string& where) {
    if (n == true ||
        (n.is_object() && std::all_of(n.items().begin(), n.items().end(), [](const auto& kv) {
           return kAnnotations.count(kv.key()) > 0;
         })))
      return kAnyString;
    std::string r = value(n, where);
    // A JSON string is the one value that begins with a quote.
    const std::shared_ptr<const RegexDfa> dfa = shared_regex(r, field_);
    for (int b = 0; b < 256; ++b)
      if (b != '"' && dfa->next(dfa->start(), static_cast<std::uint8_t>(b)) != RegexDfa::kDead)
        fail(where, "'propertyNames' admits values other than strings, which no name is");
    return r;
  }

  // The schema `s` stands for, through $refs and allOf of one; nullptr when it names none.
  const Json* resolved(const Json& s) const {
    const Json* at = &s;
    for (int hop = 0; hop < kMaxSchemaNesting && at->is_object(); ++hop) {
      if (at->contains("$ref") && (*at)["$ref"].is_string()) {
        at = target((*at)["$ref"].get<std::string>());
        if (!at) return nullptr;
      } else if (at->contains("allOf") && (*at)["allOf"].is_array() && (*at)["allOf"].size() == 1) {
        at = &(*at)["allOf"][0];
      } else {
        break;
      }
    }
    return at;
  }

  // The JSON types a schema's values may have, as bits (whole numbers apart from others), read
  // from 'type', 'const' and 'enum'; all bits where the schema does not say.
  static unsigned kinds(const Json& s) {
    constexpr unsigned kAll = 0x7F;
    const auto kind_of_value = [](const Json& v) -> unsigned {
      if (v.is_null()) return 1;
      if (v.is_boolean()) return 2;
      if (v.is_number_integer() ||
          (v.is_number_float() && v.get<double>() == std::floor(v.get<double>())))
        return 4;
      if (v.is_number()) return 8;
      if (v.is_string()) return 16;
      return v.is_array() ? 32 : 64;
    };
    const auto kind_of_type = [](const Json& t) -> unsigned {
      const std::string n = t.is_string() ? t.get<std::string>() : "";
      return n == "null"      ? 1
             : n == "boolean" ? 2
             : n == "integer" ? 4
             : n == "number"  ? 4 | 8
             : n == "string"  ? 16
             : n == "array"   ? 32
             : n == "object"  ? 64
                              : kAll;
    };
    if (!s.is_object()) return kAll;
    unsigned k = kAll;
    if (s.contains("type")) {
      unsigned t = 0;
      if (s["type"].is_array()) {
        for (const Json& x : s["type"]) t |= kind_of_type(x);
      } else {
        t = kind_of_type(s["type"]);
      }
      k &= t;
    }
    if (s.contains("const")) k &= kind_of_value(s["const"]);
    if (s.contains("enum") && s["enum"].is_array()) {
      unsigned e = 0;
      for (const Json& v : s["enum"]) e |= kind_of_value(v);
      k &= e;
    }
    return k;
  }

  // The one value a schema allows ('const', or an 'enum' of one), if it says so.
  static const Json* only_value(const Json& s) {
    if (!s.is_object()) return nullptr;
    if (s.contains("const")) return &s["const"];
    if (s.contains("enum") && s["enum"].is_array() && s["enum"].size() == 1) return &s["enum"][0];
    return nullptr;
  }

  // Whether no value can satisfy both schemas under JSON Schema's own reading (not only among the
  // texts written here): their types differ, their single values differ, or both are objects
  // requiring a property whose single allowed value differs (Pydantic's discriminated unions).
  bool exclusive(const Json& a_in, const Json& b_in) const {
    const Json* a = resolved(a_in);
    const Json* b = resolved(b_in);
    if (!a || !b) return false;
    if ((kinds(*a) & kinds(*b)) == 0) return true;
    const Json *va = only_value(*a), *vb = only_value(*b);
    if (va && vb && *va != *vb) return true;
    const auto object = [](const Json& s) {
      return kinds(s) == 64 && s.contains("properties") && s["properties"].is_object() &&
             s.contains("required") && s["required"].is_array();
    };
    if (!object(*a) || !object(*b)) return false;
    const auto required = [](const Json& s, const Json& name) {
      return std::find(s["required"].begin(), s["required"].end(), name) != s["required"].end();
    };
    for (const auto& [name, pa] : (*a)["properties"].items()) {
      const Json key(name);
      if (!required(*a, key) || !required(*b, key) || !(*b)["properties"].contains(name)) continue;
      const Json* ra = resolved(pa);
      const Json* rb = resolved((*b)["properties"][name]);
      const Json* ca = ra ? only_value(*ra) : nullptr;
      const Json* cb = rb ? only_value(*rb) : nullptr;
      if (ca && cb && *ca != *cb) return true;
    }
    return false;
  }

  // Whether `v` is of the schema's 'type' (any value when it has none), as JSON Schema reads
  // types: an integer is a number whose fraction is zero.
  bool of_type(const Json& s, const Json& v, const std::string& where) const {
    if (!s.contains("type")) return true;
    std::vector<std::string> types;
    if (s["type"].is_string()) types = {s["type"].get<std::string>()};
    if (s["type"].is_array()) {
      for (const Json& t : s["type"]) {
        if (t.is_string()) types.push_back(t.get<std::string>());
      }
    }
    if (types.empty()) fail(where, "'type' must be a string or a list of strings");
    return std::any_of(types.begin(), types.end(), [&](const std::string& t) {
      if (t == "integer")
        return v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                         v.get<double>() == std::floor(v.get<double>()));
      if (t == "number") return v.is_number();
      if (t == "string") return v.is_string();
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "array") return v.is_array();
      if (t == "object") return v.is_object();
      fail(where, "type '" + t + "' is not a JSON Schema type");
    });
  }

  // An integer or a number, within its bounds when it has any, and a multiple of `multipleOf`.
  std::string number(const Json& s, bool integer, const std::string& where) const {
    // A multiple of a whole number is whole: such a number is read as an integer (bounds round
    // inward), its multiples kept by a multiple group. A fractional multipleOf is refused.
    std::int64_t multiple = 1;
    if (s.contains("multipleOf")) {
      const Json& m = s["multipleOf"];
      if (!m.is_number() || !(m.get<double>() > 0))
        fail(where, "'multipleOf' must be a number above 0");
      const double x = m.get<double>();
      if (x != std::floor(x) || x > RegexDfa::kMaxMultiple)
        fail(where, str("'multipleOf' ", m.dump(), " is not supported (a whole number from 1 to ",
                        RegexDfa::kMaxMultiple, ")"));
      multiple = static_cast<std::int64_t>(x);
      integer = true;
    }
    const std::string r = bounded_number(s, integer, where);
    if (multiple == 1) return r;
    const std::string group = str("(?multiple{", multiple, "}:", r, ")");
    try {
      shared_regex(group, field_);  // compiled once: the whole schema's compile is another
    } catch (const RegexError& e) {
      if (e.kind() == RegexError::Kind::no_text)
        fail(where, str("no multiple of ", multiple, " lies within its bounds"));
      fail(where,
           str("the multiples of ", multiple, " within its bounds are too large an automaton"));
    }
    return group;
  }

  std::string bounded_number(const Json& s, bool integer, const std::string& where) const {
    std::optional<WholeBound> lo, hi;
    // A bound as a whole number: an integer's bounds round inward (x >= 0.5 is x >= 1 among
    // integers); a number's must be whole. The tighter of two bounds on one side holds.
    const auto read = [&](const char* key, bool lower, bool exclusive) {
      if (!s.contains(key)) return;
      const Json& v = s[key];
      if (!v.is_number())
        fail(where, str("'", key, "' must be a number (draft 4's true/false form is not read)"));
      const double x = v.get<double>();
      if (!std::isfinite(x) || std::fabs(x) > static_cast<double>(kMaxWholeBound))
        fail(where, str("'", key, "' must be within +-2^53"));
      WholeBound b;
      if (v.is_number_integer()) {
        b = {v.get<std::int64_t>(), exclusive};
      } else if (x == std::floor(x)) {
        b = {static_cast<std::int64_t>(x), exclusive};
      } else if (integer) {
        b = {static_cast<std::int64_t>(lower ? std::ceil(x) : std::floor(x)), false};
      } else {
        fail(where, str("'", key, "' ", v.dump(),
                        " is not a whole number, which a bound of type 'number' must be"));
      }
      std::optional<WholeBound>& side = lower ? lo : hi;
      const bool tighter = !side || (lower ? b.value > side->value : b.value < side->value) ||
                           (b.value == side->value && b.exclusive);
      if (tighter) side = b;
    };
    read("minimum", true, false);
    read("exclusiveMinimum", true, true);
    read("maximum", false, false);
    read("exclusiveMaximum", false, true);
    if (!lo && !hi) return integer ? kInteger : kNumber;
    const std::string r = integer ? integer_range_regex(lo, hi) : decimal_range_regex(lo, hi);
    if (r.empty())
      fail(where, str("no ", integer ? "integer" : "number", " lies within its bounds"));
    return r;
  }

  // Lengths beside a format or a pattern (Pydantic's HttpUrl is a uri of 1 to 2083 characters,
  // `constr(pattern=..., max_length=...)` a pattern bounded twice): where they hold every text
  // it writes, nothing; where they cut some, a length group of its texts that have those
  // lengths, which must exist and stay within the automaton's bounds.
  std::optional<std::string> length_cut(const Json& s, const std::string& where,
                                        const std::string& what, const std::string& regex,
                                        std::int64_t min_chars, std::int64_t max_chars) const {
    // Bounds, not repeat counts: any size (max_chars < 0: the texts are unbounded).
    const std::int64_t lo = whole(s, "minLength", where, 0, -1);
    const std::int64_t hi = whole(s, "maxLength", where, -1, -1);
    if (hi >= 0 && hi < lo) fail(where, "'maxLength' is below 'minLength'");
    if (lo <= min_chars && (hi < 0 || (max_chars >= 0 && hi >= max_chars))) return std::nullopt;
    const auto range = [](std::int64_t a, std::int64_t b) {
      return b < 0    ? str(a, " or more")
             : a == b ? str(a)
             : a == 0 ? str("at most ", b)
                      : str(a, " to ", b);
    };
    const std::string span = str(" (it writes ", range(min_chars, max_chars), " characters)");
    if (std::max(lo, hi) > RegexDfa::kMaxCountedLength)
      fail(where, str("'minLength' and 'maxLength' that cut the texts of ", what,
                      " are supported up to ", RegexDfa::kMaxCountedLength, span));
    const std::string group =
        str("(?{", lo, ",", hi < 0 ? "" : std::to_string(hi), "}:", regex, ")");
    try {
      shared_regex(group, field_);  // compiled once: the whole schema's compile is another
    } catch (const RegexError& e) {
      if (e.kind() == RegexError::Kind::no_text)
        fail(where, str(what, " writes no text of ", range(lo, hi), " characters", span));
      fail(where,
           str(what, " cut to ", range(lo, hi), " characters is too large an automaton", span));
    }
    return group;
  }

  std::string string_body(const Json& s, const std::string& where) {
    if (s.contains("pattern") && s.contains("format"))
      fail(where, "'pattern' does not combine with 'format'");
    // OpenAPI's password format (Pydantic's SecretStr) asks a form to hide the text: any string.
    if (s.contains("format") && s["format"] != "password") {
      const std::string name = s["format"].is_string() ? s["format"].get<std::string>() : "";
      const std::optional<StringFormat> f = string_format(name);
      if (!f)
        fail(where, "'format' " + s["format"].dump() + " is not supported (" +
                        std::string(kStringFormats) + ")");
      return length_cut(s, where, str("'format' \"", name, "\""), f->regex, f->min_chars,
                        f->max_chars)
          .value_or("(?:" + f->regex + ")");
    }
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) fail(where, "'pattern' must be a string");
      const std::string whole = s["pattern"].get<std::string>();
      const std::string field = str(field_, "' pattern at '", where);
      // The pattern holds of the string's characters, which the JSON text writes as json.dumps
      // does: a quote, a backslash or a control character by its escape (a JSON group).
      const auto string_of = [&](const std::string& p, const RegexDfa& dfa) {
        const auto [min_chars, max_chars] = pattern_span(dfa);
        return "(?json:" + length_cut(s, where, "'pattern'", p, min_chars, max_chars).value_or(p) +
               ")";
      };
      // A string holds a pattern where some part of it matches (JSON Schema reads patterns as
      // ECMA-262's search does): a search group, unless its automaton (its lengths cut, its
      // characters escaped) is too large, and then the strings it matches whole, fewer texts,
      // each a match. (Where the search finds no text, neither does the whole; a pattern may match
      // no text whole and some searched: "(?=.*[0-9])[a-z]".)
      const std::string search = "(?search:" + whole + ")";
      std::shared_ptr<const RegexDfa> searched;
      try {
        searched = shared_regex(search, field);
      } catch (const RegexError&) {  // too large, or no text: the whole match says which
      } catch (const Error&) {
        // A syntax error: named at the pattern's own byte offsets.
        static_cast<void>(RegexDfa(whole, field));
        throw;
      }
      if (searched) {
        try {
          std::string body = string_of(search, *searched);
          shared_regex(body, field_);
          return body;
        } catch (const Error&) {
        }
      }
      return string_of(whole, RegexDfa(whole, field));
    }
    const int lo = count(s, "minLength", where, 0), hi = count(s, "maxLength", where, -1);
    if (hi >= 0 && hi < lo) fail(where, "'maxLength' is below 'minLength'");
    return kChar + repeat(lo, hi);
  }

  // The schema a $ref names: the root ('#') or an entry of its $defs or definitions.
  const Json* target(const std::string& r) const {
    if (r == "#") return &root_;
    for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
      const std::string section = std::string(prefix).substr(2, std::strlen(prefix) - 3);
      const std::string name = r.substr(std::min(r.size(), std::strlen(prefix)));
      if (r.starts_with(prefix) && root_.contains(section) && root_[section].is_object() &&
          root_[section].contains(name))
        return &root_[section][name];
    }
    return nullptr;
  }

  std::string reference(const Json& ref, const std::string& where) {
    if (!ref.is_string()) fail(where, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    const Json* to = target(r);
    if (!to)
      fail(where, "'$ref' " + ref.dump() +
                      " names neither the root ('#') nor an entry of its $defs or definitions");
    // A recursive definition (a tree, a list of replies) is written down to kMaxRecursion levels
    // of itself; below that the reference admits no value, so the deepest level takes the
    // alternatives that end (an empty list, an absent property, null).
    if (std::count(expanding_.begin(), expanding_.end(), r) >= kMaxRecursion) {
      cut_recursion_ = true;
      return kNoValue;
    }
    expanding_.push_back(r);
    std::string out = value(*to, r);
    expanding_.pop_back();
    return out;
  }

  const Json& root_;
  std::string field_;
  std::vector<std::string> expanding_;  // $refs being expanded
  bool cut_recursion_ = false;          // some $ref stood for no value
  std::size_t written_ = 0;             // bytes of every regex compiled so far
  int depth_ = 0;                       // schemas being compiled, outermost first
};

}  // namespace

std::size_t json_nesting(std::string_view text) noexcept {
  std::size_t depth = 0, most = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      most = std::max(most, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return most;
}

std::string json_schema_regex(std::string_view schema_json, std::string_view field) {
  // A schema holds a level of objects or arrays per level of schemas, and a few of its own.
  if (json_nesting(schema_json) > 4 * kMaxSchemaNesting)
    throw Error(ErrorCategory::invalid_argument,
                str("'", field, "': the schema nests more than ", kMaxSchemaNesting, " levels"));
  Json root;
  try {
    root = Json::parse(schema_json);
  } catch (const Json::exception& e) {
    throw Error(ErrorCategory::invalid_argument,
                str("'", field, "': the schema is not JSON: ", e.what()));
  }
  Compiler compiler(root, field);
  std::string pattern = compiler.value(root, "#");
  // A recursion cut at its bound may leave no text at all (a property that requires its own
  // definition with no way to end): said of the schema here, not of the regex later. The
  // automaton is compiled into the shared cache, where the request's own compile finds it.
  if (compiler.cut_recursion()) {
    try {
      shared_regex(pattern, field);
    } catch (const RegexError& e) {
      if (e.kind() == RegexError::Kind::no_text)
        throw Error(ErrorCategory::invalid_argument,
                    str("'", field,
                        "': the schema admits no value: a recursive '$ref' has no "
                        "way to end within ",
                        kMaxRecursion, " levels"));
      throw;
    }
  }
  return pattern;
}

}  // namespace dcp
