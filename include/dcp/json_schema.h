// JSON Schema -> a regular expression (RegexDfa's syntax) whose matches are compact-or-spaced JSON
// texts valid under the schema, for guided generation (OpenAI's response_format json_schema,
// vLLM's guided_json, SGLang's json_schema).
//
// Supported: "type" (one or a list) object, array, string, integer, number, boolean, null;
// objects' "properties" (written in the schema's order; those not in "required" may be left out;
// no others are written, which every "additionalProperties" allows); objects without "properties"
// (any names, values under "additionalProperties", up to "maxProperties", "minProperties" 0 or
// 1); arrays' "items" and "prefixItems" with "minItems"/"maxItems"; strings' "minLength"/
// "maxLength", "pattern" (strings in which it finds a match, as ECMA-262's search does; matched
// whole where that automaton would be too large) and "format" (date, time, date-time, uuid, ipv4,
// hostname, email, uri; lengths beside a format or pattern keep its texts of those lengths);
// integers' and numbers' bounds; "enum", "const", "anyOf", "oneOf" of schemas that exclude each
// other (types, single values, or a required property's const), "allOf" of one schema, "$ref" to
// "#", "#/$defs/..." or "#/definitions/..." (recursion written down to kMaxRecursion levels). A
// value the schema leaves free ({}, true, an object or array with nothing said of its members) is
// any JSON value whose arrays and objects nest at most kFreeFormNesting levels, itself included.
// Annotations (title, description, default, examples, $schema, $id, $comment, discriminator) are
// ignored. Anything else that would constrain a value (not, allOf of several schemas, a
// fractional multipleOf, ...) is refused by name. Between tokens the text holds at most one space
// (compact or as json.dumps writes it).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace dcp {

// Schemas nested deeper than this (objects in objects, items in items) are refused.
constexpr int kMaxSchemaNesting = 64;

// How deep the arrays and objects of a value the schema leaves free may nest: a regex holds
// nesting only to a bound, and its automaton grows with it (about 700 states at 3 levels).
constexpr int kFreeFormNesting = 3;

// How many levels of itself a recursive definition ($ref to "#" or to an enclosing $defs entry)
// is written down to: below that only the alternatives that end remain (an empty array, an
// absent optional property, another branch of an anyOf).
constexpr int kMaxRecursion = 4;

// The regex text a schema may compile to, copies of its parts included (each is written out
// where it is used): past it the schema is refused as too large, before any automaton is built.
constexpr std::size_t kMaxSchemaRegexBytes = std::size_t{4} << 20;

// How deep the arrays and objects of a JSON text nest (0 for a scalar), read without parsing it:
// nlohmann's parser copies a nested object's members as it grows an ordered object, by recursion,
// so outside text is measured before it is parsed.
std::size_t json_nesting(std::string_view text) noexcept;

// Throws dcp::Error(invalid_argument) naming `field` and where in the schema it fails.
std::string json_schema_regex(std::string_view schema_json, std::string_view field = "json_schema");

}  // namespace dcp
