// Reading replies: tool calls in DeepSeek V3's and V3.1's and Kimi K2's formats (written here as
// their chat templates write a call into a conversation), whole, cut anywhere and spoiled; and a
// reasoning model's thinking told from its content, whole and streamed in random pieces.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dcp/reasoning.h"
#include "dcp/tokenizer.h"
#include "dcp/tool_calls.h"
#include "test_util.h"

namespace dcp {
namespace {

// DeepSeek's markers (full-width bars, U+2581 word marks), and Kimi K2's.
const std::string kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallBegin = "<｜tool▁call▁begin｜>",
                  kDsSep = "<｜tool▁sep｜>", kDsCallEnd = "<｜tool▁call▁end｜>",
                  kDsCallsEnd = "<｜tool▁calls▁end｜>";
const std::string kKimiCallsBegin = "<|tool_calls_section_begin|>",
                  kKimiCallBegin = "<|tool_call_begin|>",
                  kKimiArgs = "<|tool_call_argument_begin|>", kKimiCallEnd = "<|tool_call_end|>",
                  kKimiCallsEnd = "<|tool_calls_section_end|>";

// Concatenation by appends (gcc 12 warns falsely on chains that begin with a literal).
template <class... Parts>
std::string cat(const Parts&... parts) {
  std::string s;
  (s.append(parts), ...);
  return s;
}

struct Call {
  std::string name, arguments;
};

// A reply as the model writes it: `content`, then the calls. DeepSeek V3 (the template's
// "function<sep>NAME\n```json\nARGS\n```", calls after the first on a new line), V3.1
// ("NAME<sep>ARGS"), Kimi K2 ("functions.NAME:INDEX" then the arguments).
enum class Style { v3, v31, kimi };
// `ends`, when given, gets where each call's end marker ends.
std::string write(Style style, const std::string& content, const std::vector<Call>& calls,
                  bool close = true, std::vector<std::size_t>* ends = nullptr) {
  std::string out = cat(content, style == Style::kimi ? kKimiCallsBegin : kDsCallsBegin);
  for (std::size_t k = 0; k < calls.size(); ++k) {
    const Call& c = calls[k];
    if (style == Style::v3) {
      out += cat(k ? "\n" : "", kDsCallBegin, "function", kDsSep, c.name, "\n```json\n",
                 c.arguments, "\n```", kDsCallEnd);
    } else if (style == Style::v31) {
      out += cat(kDsCallBegin, c.name, kDsSep, c.arguments, kDsCallEnd);
    } else {
      out += cat(kKimiCallBegin, "functions.", c.name, ":", std::to_string(k), kKimiArgs,
                 c.arguments, kKimiCallEnd);
    }
    if (ends) ends->push_back(out.size());
  }
  if (close) out += style == Style::kimi ? kKimiCallsEnd : kDsCallsEnd;
  return out;
}

ToolCallFormat format_of(Style s) {
  return s == Style::kimi ? ToolCallFormat::kimi_k2 : ToolCallFormat::deepseek_v3;
}

void expect_calls(const ParsedToolCalls& got, const std::string& content,
                  const std::vector<Call>& calls, Style style) {
  EXPECT_EQ(got.content, content);
  ASSERT_EQ(got.calls.size(), calls.size());
  for (std::size_t k = 0; k < calls.size(); ++k) {
    EXPECT_EQ(got.calls[k].name, calls[k].name) << k;
    EXPECT_EQ(got.calls[k].arguments, calls[k].arguments) << k;
    EXPECT_EQ(got.calls[k].id,
              style == Style::kimi ? cat("functions.", calls[k].name, ":", std::to_string(k)) : "")
        << k;
  }
}

TEST(ToolCalls, EachFormatReadsBackWhatItWrites) {
  const std::vector<Call> calls = {{"get_weather", R"({"city": "Paris", "days": [1, 2]})"},
                                   {"now", "{}"},
                                   {"search-web", "{\"q\": \"a\\nb ```\"}"}};
  for (Style style : {Style::v3, Style::v31, Style::kimi}) {
    SCOPED_TRACE(static_cast<int>(style));
    const ToolCallFormat f = format_of(style);
    expect_calls(parse_tool_calls(write(style, "Let me look.\n", calls), f), "Let me look.\n",
                 calls, style);
    expect_calls(parse_tool_calls(write(style, "", {calls[0]}), f), "", {calls[0]}, style);
    // DeepSeek-V3's template leaves the closing marker out after a single call.
    expect_calls(parse_tool_calls(write(style, "x", calls, false), f), "x", calls, style);
    // Text after the calls stays content.
    expect_calls(parse_tool_calls(write(style, "a", {calls[1]}) + " b", f), "a b", {calls[1]},
                 style);
    // No marker: all content, the other format's markers included.
    const std::string other = write(style == Style::kimi ? Style::v3 : Style::kimi, "c", calls);
    expect_calls(parse_tool_calls(other, f), other, {}, style);
  }
  // Kimi's name is what lies between "functions." and the index.
  const ParsedToolCalls dotted = parse_tool_calls(
      kKimiCallsBegin + kKimiCallBegin + "functions.a.b:12" + kKimiArgs + "{}" + kKimiCallEnd,
      ToolCallFormat::kimi_k2);
  ASSERT_EQ(dotted.calls.size(), 1u);
  EXPECT_EQ(dotted.calls[0].name, "a.b");
  EXPECT_EQ(dotted.calls[0].id, "functions.a.b:12");
}

// A call that does not read ends the calls: those read before it stay calls and the text from it on
// is content; where no call was read, the whole reply is content. Nothing the model wrote is lost.
TEST(ToolCalls, ASpoiledCallEndsTheCalls) {
  const std::string good = kDsCallBegin + "f" + kDsSep + "{}" + kDsCallEnd;
  const std::vector<std::string> spoiled = {
      kDsCallBegin + "function" + kDsSep + "f\n```json\n{}\n" + kDsCallEnd,
      kDsCallBegin + "function" + kDsSep + "f{}" + kDsCallEnd,
      kDsCallBegin + "f{}" + kDsCallEnd,
      kDsCallBegin + kDsSep + "{}" + kDsCallEnd,
      kDsCallBegin + "f" + kDsSep + kDsCallEnd,
      "text" + kDsCallBegin + "f" + kDsSep + "{}" + kDsCallEnd,
      "x" + kDsCallBegin,
      kDsCallBegin + "f" + kDsSep + "{}",  // cut short
      kDsCallBegin.substr(0, 5),
  };
  for (const std::string& bad : spoiled) {
    SCOPED_TRACE(bad);
    const std::string none = cat("a ", kDsCallsBegin, bad);
    ParsedToolCalls got = parse_tool_calls(none, ToolCallFormat::deepseek_v3);
    EXPECT_EQ(got.content, none);
    EXPECT_TRUE(got.calls.empty());
    // After one call read, and the blank space after it.
    got = parse_tool_calls(cat("a ", kDsCallsBegin, good, " \n", bad, kDsCallsEnd, " b"),
                           ToolCallFormat::deepseek_v3);
    EXPECT_EQ(got.content, cat("a ", bad, kDsCallsEnd, " b"));
    ASSERT_EQ(got.calls.size(), 1u);
    EXPECT_EQ(got.calls[0].name, "f");
    EXPECT_EQ(got.calls[0].arguments, "{}");
  }
  // The closing marker right after the opening one: no call, all content.
  const std::string empty = cat("a ", kDsCallsBegin, kDsCallsEnd);
  EXPECT_EQ(parse_tool_calls(empty, ToolCallFormat::deepseek_v3).content, empty);
}

// Random calls in each format: read back whole; and any prefix of the reply (a generation cut by
// max_tokens) gives the calls whose end marker it holds, and after them, as content, the text
// from the first that is not blank (nothing when the closing marker is whole); with no call
// ended, all content.
TEST(ToolCalls, RandomRepliesAndTheirPrefixes) {
  test::Rng rng = test::make_rng();
  const std::string alphabet = "abcxyz_-09 {}[]\":,.\n`<|>｜▁é";
  const auto random_text = [&](int most) {
    std::string s;
    const int n = static_cast<int>(rng.range(0, most));
    for (int i = 0; i < n; ++i) {
      // Whole characters only: the multi-byte ones are picked as a unit.
      const std::size_t at = static_cast<std::size_t>(rng.range(0, 26));
      const unsigned char lead = static_cast<unsigned char>(alphabet[at]);
      std::size_t len = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : 3;
      if (at + len > alphabet.size() || (lead & 0xC0) == 0x80)
        len = 1, s += 'q';
      else
        s += alphabet.substr(at, len);
    }
    return s;
  };
  for (int round = 0; round < 300; ++round) {
    const Style style = static_cast<Style>(rng.range(0, 2));
    const ToolCallFormat f = format_of(style);
    const std::string marker = std::string(tool_calls_begin(f));
    const std::string closing = style == Style::kimi ? kKimiCallsEnd : kDsCallsEnd;
    std::string content = random_text(12);
    if (content.find(marker) != std::string::npos) content.clear();
    std::vector<Call> calls(static_cast<std::size_t>(rng.range(1, 4)));
    for (Call& c : calls) {
      c.name = cat("f", std::to_string(rng.range(0, 999)));
      // Arguments a model could write: no marker inside, no blank space at the ends.
      c.arguments = cat("{\"v\": \"", random_text(10), "\"}");
      for (const std::string& m : {kDsCallEnd, kDsSep, kKimiCallEnd, kKimiArgs})
        if (c.arguments.find(m) != std::string::npos) c.arguments = "{}";
    }
    const bool close = rng.coin();
    std::vector<std::size_t> ends;
    const std::string text = write(style, content, calls, close, &ends);
    SCOPED_TRACE(text);
    expect_calls(parse_tool_calls(text, f), content, calls, style);
    for (std::size_t cut = 0; cut <= text.size(); ++cut) {
      const ParsedToolCalls got = parse_tool_calls(text.substr(0, cut), f);
      std::size_t ended = 0;
      while (ended < ends.size() && ends[ended] <= cut) ++ended;
      if (ended == 0) {
        EXPECT_EQ(got.content, text.substr(0, cut));
        EXPECT_TRUE(got.calls.empty()) << cut;
        continue;
      }
      const std::size_t rest = std::min(text.find_first_not_of(" \n", ends[ended - 1]), cut);
      std::string tail = text.substr(rest, cut - rest);
      if (tail == closing) tail.clear();
      expect_calls(got, content + tail, std::vector<Call>(calls.begin(), calls.begin() + ended),
                   style);
    }
  }
}

// A stream's reading: the reply in random pieces, read as it grows. Each call is read as soon as
// the text holds its end marker, the content resumes once the closing marker is whole (or a byte
// no marker begins follows the calls), and the whole text reads as parse_tool_calls reads it.
TEST(ToolCalls, AReaderReadsEachCallOnceItsEndMarkerArrives) {
  test::Rng rng = test::make_rng();
  for (int round = 0; round < 300; ++round) {
    const Style style = static_cast<Style>(rng.range(0, 2));
    const ToolCallFormat f = format_of(style);
    const std::string closing = style == Style::kimi ? kKimiCallsEnd : kDsCallsEnd;
    std::vector<Call> calls(static_cast<std::size_t>(rng.range(1, 4)));
    for (std::size_t k = 0; k < calls.size(); ++k)
      calls[k] = {cat("g", std::to_string(k)), cat("{\"k\": ", std::to_string(k), "}")};
    std::vector<std::size_t> ends;
    const bool close = rng.coin();
    std::string text = write(style, rng.coin() ? "Look: " : "", calls, close, &ends);
    // The content resumes past the closing marker, or without one at text no marker begins.
    std::size_t resumes = close ? text.size() : ToolCallReader::npos, known = resumes;
    if (rng.coin()) {
      text += " after";
      if (!close) resumes = text.size() - 5, known = resumes + 1;
    }
    SCOPED_TRACE(text);
    ToolCallReader reader(f);
    std::size_t at = 0;
    while (at < text.size()) {
      at = std::min(text.size(), at + static_cast<std::size_t>(rng.range(1, 12)));
      reader.read(std::string_view(text).substr(0, at));
      std::size_t ended = 0;
      while (ended < ends.size() && ends[ended] <= at) ++ended;
      ASSERT_EQ(reader.calls().size(), ended) << at;
      EXPECT_EQ(reader.content_resumes(false), at >= known ? resumes : ToolCallReader::npos) << at;
    }
    const ParsedToolCalls whole = parse_tool_calls(text, f);
    ASSERT_EQ(reader.calls().size(), whole.calls.size());
    for (std::size_t k = 0; k < whole.calls.size(); ++k) {
      EXPECT_EQ(reader.calls()[k].name, whole.calls[k].name);
      EXPECT_EQ(reader.calls()[k].arguments, whole.calls[k].arguments);
    }
    EXPECT_EQ(cat(text.substr(0, reader.calls_begin()), text.substr(reader.content_resumes(true))),
              whole.content);
  }
}

// tool_choice "required": the list of calls, each call's arguments as json.dumps separates them,
// every string and number spelt as written. Python writes random lists with random blank space
// (json.dumps with blank separators and indents) and the arguments it expects (json.dumps' own
// separators, strings escaped alike), then spoils copies by one character: Python's json.loads
// decides which still read as a list of calls, and the values their arguments must hold.
TEST(ToolCalls, ListedCallsKeepTheirArgumentsAsWritten) {
  const auto cases =
      test::python_oracle({{"seed", test::test_seed() % 1000000007}}, R"(import json, random, sys
rng = random.Random(json.load(open(sys.argv[1]))["seed"])
def string():
    return "".join(rng.choice(['a', 'Z', ' ', '"', '\\', '\n', '\t', '\x01', '/', 'é', '中', '😀', '\u2028'])
                   for _ in range(rng.randint(0, 6)))
def number():
    k = rng.randint(0, 3)
    if k == 0: return rng.randint(-10**40, 10**40)
    if k == 1: return rng.randint(-5, 5)
    if k == 2: return rng.uniform(-1e6, 1e6)
    return rng.choice([0.0, -0.0, 1e300, 5e-324, 1.5e-10, 1e22, -2.5])
def value(depth):
    k = rng.randint(0, 5 if depth < 4 else 2)
    if k == 0: return string()
    if k == 1: return number()
    if k == 2: return rng.choice([True, False, None])
    if k == 3: return [value(depth + 1) for _ in range(rng.randint(0, 3))]
    return {string(): value(depth + 1) for _ in range(rng.randint(0, 3))}
blank = [' ', '\n', '\t', '\r', '', '']
def calls_of(v):
    ok = (isinstance(v, list) and len(v) > 0 and all(
        isinstance(c, dict) and set(c) == {"name", "parameters"} and isinstance(c["name"], str)
        and isinstance(c["parameters"], dict) for c in v))
    return [[c["name"], json.dumps(c["parameters"])] for c in v] if ok else None
out = []
for _ in range(300):
    calls = [{"name": "f%d" % rng.randint(0, 99), "parameters": {string(): value(1) for _ in range(rng.randint(0, 4))}}
             for _ in range(rng.randint(1, 3))]
    ascii = rng.random() < 0.3
    text = json.dumps(calls, ensure_ascii=ascii, indent=rng.choice([None, None, 0, 2, "\t"]),
                      separators=(rng.choice(blank) + "," + rng.choice(blank), rng.choice(blank) + ":" + rng.choice(blank)))
    text = rng.choice(blank) + text + rng.choice(blank)
    out.append({"text": text, "spelt": [[c["name"], json.dumps(c["parameters"], ensure_ascii=ascii)] for c in calls]})
    for _ in range(3):  # one character dropped or put in
        i = rng.randint(0, len(text) - 1)
        spoilt = text[:i] + text[i + 1:] if rng.random() < 0.5 else text[:i] + rng.choice(',:[]{}"\\ 0-.eE1a') + text[i:]
        try:
            read = calls_of(json.loads(spoilt))
        except ValueError:
            read = None
        out.append({"text": spoilt, "values": read})
json.dump(out, open(sys.argv[2], "w"))
)");
  if (!cases) GTEST_SKIP() << "/usr/bin/python3 is not installed";
  int spelt = 0, refused = 0;
  nlohmann::json kept = nlohmann::json::array();  // [arguments, the parameters Python read]
  for (const nlohmann::json& c : *cases) {
    const std::string text = c["text"];
    SCOPED_TRACE(text);
    const std::optional<std::vector<ToolCall>> got = read_listed_calls(text);
    const nlohmann::json& want = c.contains("spelt") ? c["spelt"] : c["values"];
    if (want.is_null()) {
      EXPECT_FALSE(got.has_value());
      ++refused;
      continue;
    }
    ASSERT_TRUE(got.has_value());
    ASSERT_EQ(got->size(), want.size());
    for (std::size_t k = 0; k < want.size(); ++k) {
      EXPECT_EQ((*got)[k].name, want[k][0].get<std::string>());
      EXPECT_TRUE((*got)[k].id.empty());
      if (c.contains("spelt")) {
        EXPECT_EQ((*got)[k].arguments, want[k][1].get<std::string>());
        ++spelt;
      } else {
        kept.push_back({(*got)[k].arguments, want[k][1]});
      }
    }
  }
  // The value Python reads from each call's arguments is the one it read from the list.
  const auto same = test::python_oracle(kept, R"(import json, sys
pairs = json.load(open(sys.argv[1]))
json.dump([json.dumps(json.loads(a)) == json.dumps(json.loads(b)) for a, b in pairs], open(sys.argv[2], "w"))
)");
  for (std::size_t k = 0; k < kept.size(); ++k)
    EXPECT_TRUE((*same)[k].get<bool>()) << kept[k][0] << " vs " << kept[k][1];
  EXPECT_GT(spelt, 300);
  EXPECT_GT(refused, 300);     // most spoilt copies are not JSON any more
  EXPECT_GT(kept.size(), 5u);  // some are (a digit more, a blank space)
}

// What a double cannot hold is kept as written; a list that is not one of calls is no list.
TEST(ToolCalls, ListedCallsByHand) {
  const auto args = [](const std::string& text) {
    const auto calls = read_listed_calls(text);
    return calls && calls->size() == 1 ? (*calls)[0].arguments : std::string("(none)");
  };
  EXPECT_EQ(args(R"([{"name":"f","parameters":{"a":1e400,"b":-123456789012345678901234567890}}])"),
            R"({"a": 1e400, "b": -123456789012345678901234567890})");
  EXPECT_EQ(args("[{\"name\": \"f\", \"parameters\": {\"s\": \"\\u00e9\\/\\\"\", \"n\": [1E+5, -0, "
                 "0.0e-0, {}, []]}}]"),
            "{\"s\": \"\\u00e9\\/\\\"\", \"n\": [1E+5, -0, 0.0e-0, {}, []]}");
  EXPECT_EQ(args(" \n[ { \"parameters\" : { } , \"name\" : \"g\" } ]\t"), "{}");
  // JSON's grammar allows a lone surrogate's escape (Python reads it): kept in the arguments; a
  // name cannot hold one (no function is named so).
  EXPECT_EQ(args(R"([{"name":"f","parameters":{"\udddd":"\ud800"}}])"), R"({"\udddd": "\ud800"})");
  for (const char* bad : {"[]",
                          "{}",
                          "[{}]",
                          R"([{"name":"f"}])",
                          R"([{"parameters":{}}])",
                          R"([{"name":"f","parameters":[]}])",
                          R"([{"name":1,"parameters":{}}])",
                          R"([{"name":"f","parameters":{},"x":0}])",
                          R"([{"name":"f","name":"f","parameters":{}}])",
                          R"([{"name":"f","parameters":{}},])",
                          R"([{"name":"f","parameters":{"a":01}}])",
                          R"([{"name":"f","parameters":{"a":1.}}])",
                          R"([{"name":"f","parameters":{"a":.5}}])",
                          R"([{"name":"f","parameters":{"a":"\q"}}])",
                          "[{\"name\":\"f\",\"parameters\":{\"a\":\"\x01\"}}]",
                          R"([{"name":"f","parameters":{"a":tru}}])",
                          R"([{"name":"f","parameters":{"a":NaN}}])",
                          R"([{"name":"f","parameters":{"a":1}}] x)",
                          R"([{"name":"f","parameters":{"a":1})",
                          "[{\"name\":\"f\",\"parameters\":{\"a\":\"\xff\"}}]"})
    EXPECT_EQ(args(bad), "(none)") << bad;
}

// A "required" reply read as it grows: random lists with random blank space, in random pieces and
// cut anywhere. Each call is read once its object closes; a whole list has no content; a cut one
// keeps the calls read and the text after the last of them is content (all of it with none).
TEST(ToolCalls, AListedCallReaderReadsEachCallOnceItsObjectCloses) {
  test::Rng rng = test::make_rng();
  const std::vector<std::pair<std::string, std::string>> items = {
      {R"({"name": "f", "parameters": {}})", "{}"},
      {R"({ "parameters" : {"a":[1, {"b":"}]"}]} ,"name":"g"})", R"({"a": [1, {"b": "}]"}]})"},
      {R"({"name":"h\u00e9","parameters":{"n":-12.5e+3}})", R"({"n": -12.5e+3})"}};
  const auto blank = [&] { return std::string(static_cast<std::size_t>(rng.range(0, 2)), ' '); };
  for (int round = 0; round < 300; ++round) {
    std::vector<std::size_t> picked, ends;
    std::string text = blank() + "[";
    for (int k = static_cast<int>(rng.range(1, 3)); k > 0; --k) {
      picked.push_back(static_cast<std::size_t>(rng.range(0, 2)));
      text += blank() + items[picked.back()].first;
      ends.push_back(text.size());
      text += blank() + (k > 1 ? "," : "]");
    }
    text += blank();
    SCOPED_TRACE(text);
    ListedCallReader reader;
    std::size_t at = 0;
    while (at < text.size()) {
      at = std::min(text.size(), at + static_cast<std::size_t>(rng.range(1, 9)));
      reader.read(std::string_view(text).substr(0, at));
      std::size_t ended = 0;
      while (ended < ends.size() && ends[ended] <= at) ++ended;
      ASSERT_EQ(reader.calls().size(), ended) << at;
      EXPECT_EQ(reader.content_resumes(false), ListedCallReader::npos) << at;
    }
    ASSERT_TRUE(reader.whole());
    EXPECT_EQ(reader.content_resumes(true), ListedCallReader::npos);
    const auto whole = read_listed_calls(text);
    ASSERT_TRUE(whole);
    ASSERT_EQ(whole->size(), picked.size());
    for (std::size_t k = 0; k < picked.size(); ++k) {
      EXPECT_EQ((*whole)[k].arguments, items[picked[k]].second);
      EXPECT_EQ(reader.calls()[k].arguments, items[picked[k]].second);
      EXPECT_EQ(reader.calls()[k].name, (*whole)[k].name);
    }
    // Cut short: the calls ended are calls, the rest content; cut after ']' it is whole.
    const std::size_t cut =
        static_cast<std::size_t>(rng.range(0, static_cast<std::int64_t>(text.size())));
    ListedCallReader part;
    part.read(std::string_view(text).substr(0, cut));
    std::size_t ended = 0;
    while (ended < ends.size() && ends[ended] <= cut) ++ended;
    ASSERT_EQ(part.calls().size(), ended) << cut;
    const bool closed = text.find_last_of(']') < cut;
    EXPECT_EQ(part.whole(), closed) << cut;
    EXPECT_EQ(part.content_resumes(true), closed  ? ListedCallReader::npos
                                          : ended ? ends[ended - 1]
                                                  : 0)
        << cut;
  }
  // What does not go on with a list ends it: the calls before stay, the rest is content.
  for (const auto& [text, calls, from] :
       std::vector<std::tuple<std::string, std::size_t, std::size_t>>{
           {"x[]", 0, 0},
           {"[1]", 0, 0},
           {R"([{"name": "f", "parameters": {}} x])", 1, 32},
           {R"([{"name": "f", "parameters": {}}, {"name": 1, "parameters": {}}])", 1, 32},
           {R"([{"name": "f", "parameters": {}}] ,)", 1, 32}}) {
    ListedCallReader reader;
    reader.read(text);
    EXPECT_EQ(reader.calls().size(), calls) << text;
    EXPECT_FALSE(reader.whole()) << text;
    EXPECT_EQ(reader.content_resumes(false), from) << text;  // known before the end
  }
}

// A tokenizer with only the bytes and `specials` as added tokens.
Tokenizer tokenizer_with(const std::vector<std::string>& specials) {
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[test::byte_char(b)] = b;
  nlohmann::json added = nlohmann::json::array();
  for (std::size_t k = 0; k < specials.size(); ++k)
    added.push_back({{"id", 300 + k}, {"content", specials[k]}, {"special", true}});
  const nlohmann::json t = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"added_tokens", added}};
  return Tokenizer::from_json(t.dump());
}

TEST(ToolCalls, TheFormatIsNamedOrFoundInTheTokenizer) {
  EXPECT_EQ(tool_call_format_named("deepseek_v3"), ToolCallFormat::deepseek_v3);
  EXPECT_EQ(tool_call_format_named("kimi_k2"), ToolCallFormat::kimi_k2);
  EXPECT_EQ(tool_call_format_named("hermes"), std::nullopt);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::kimi_k2), "kimi_k2");
  EXPECT_EQ(tool_call_format_of(tokenizer_with({kDsCallsBegin, kDsCallBegin})),
            ToolCallFormat::deepseek_v3);
  EXPECT_EQ(tool_call_format_of(tokenizer_with({"<s>", kKimiCallsBegin})), ToolCallFormat::kimi_k2);
  EXPECT_EQ(tool_call_format_of(tokenizer_with({"<s>", "</s>"})), std::nullopt);
  EXPECT_EQ(tool_call_format_named("minicpm3"), ToolCallFormat::minicpm3);
  EXPECT_STREQ(tool_call_format_name(ToolCallFormat::minicpm3), "minicpm3");
  EXPECT_EQ(tool_call_format_of(tokenizer_with({"<|tool_call_start|>", "<|tool_call_end|>"})),
            ToolCallFormat::minicpm3);
}

// MiniCPM3's block of Python (its values against Python itself: tests/python/test_tool_calls.py)
// is read whole once its closing marker arrives, and gives all its calls or none.
TEST(ToolCalls, MiniCpm3ReadsItsPythonBlockOnceItCloses) {
  const std::string text =
      "<|thought_start|>\nweather\n<|thought_end|>\n<|tool_call_start|>\n```python\n"
      "get_weather(city='Paris', days=[1, 2], unit=celsius)\nnow()\n```\n<|tool_call_end|>\nOK";
  const std::size_t begin = text.find("<|tool_call_start|>");
  const std::size_t end = text.find("<|tool_call_end|>") + std::string("<|tool_call_end|>").size();
  ToolCallReader reader(ToolCallFormat::minicpm3);
  for (std::size_t at = 1; at <= text.size(); ++at) {
    reader.read(std::string_view(text).substr(0, at));
    SCOPED_TRACE(at);
    ASSERT_EQ(reader.calls().size(), at >= end ? 2u : 0u);
    EXPECT_EQ(reader.calls_begin(), at >= begin + std::string("<|tool_call_start|>").size()
                                        ? begin
                                        : ToolCallReader::npos);
    EXPECT_EQ(reader.content_resumes(false), at >= end ? end : ToolCallReader::npos);
  }
  EXPECT_EQ(reader.calls()[0].name, "get_weather");
  EXPECT_EQ(reader.calls()[0].arguments, R"({"city": "Paris", "days": [1, 2], "unit": "celsius"})");
  EXPECT_EQ(reader.calls()[1].arguments, "{}");
  const ParsedToolCalls whole = parse_tool_calls(text, ToolCallFormat::minicpm3);
  EXPECT_EQ(whole.content, "<|thought_start|>\nweather\n<|thought_end|>\n\nOK");
  // One statement that is not a call of literals spoils the block: all of it is content.
  const std::string spoiled = "<|tool_call_start|>f(a=1)\ng(h(x=1))<|tool_call_end|>";
  const ParsedToolCalls none = parse_tool_calls(spoiled, ToolCallFormat::minicpm3);
  EXPECT_TRUE(none.calls.empty());
  EXPECT_EQ(none.content, spoiled);
  // Cut short (no closing marker at the end): content too.
  EXPECT_EQ(parse_tool_calls("<|tool_call_start|>f(a=1)", ToolCallFormat::minicpm3).content,
            "<|tool_call_start|>f(a=1)");
}

// DeepSeek-R1's split, written independently: a leading "<think>" dropped (vLLM drops all text up
// to a "<think>" anywhere; dcp keeps text that is not a leading one); reasoning up to the first
// "</think>", content after; without one, all reasoning. With `opens` (Kimi-K2's tool-call
// section), reasoning up to whichever comes first, and `opens` starts the content.
std::pair<std::string, std::string> reference_split(std::string text, bool* ended,
                                                    const std::string& opens = "") {
  if (text.rfind("<think>", 0) == 0) text.erase(0, 7);
  std::size_t close = text.find("</think>"), skip = 8;
  if (const std::size_t at = opens.empty() ? std::string::npos : text.find(opens); at < close) {
    close = at;
    skip = 0;
  }
  *ended = close != std::string::npos;
  if (!*ended) return {text, ""};
  return {text.substr(0, close), text.substr(close + skip)};
}

ReasoningSplit::Parts streamed(const std::vector<std::string>& pieces, ReasoningSplit& s) {
  ReasoningSplit::Parts all;
  for (const std::string& p : pieces) {
    ReasoningSplit::Parts got = s.push(p);
    all.reasoning += got.reasoning;
    all.content += got.content;
  }
  ReasoningSplit::Parts rest = s.finish();
  all.reasoning += rest.reasoning;
  all.content += rest.content;
  return all;
}

TEST(ReasoningSplit, ThinkingThenContent) {
  const auto whole = [](const std::string& text) {
    ReasoningSplit s;
    ReasoningSplit::Parts p = streamed({text}, s);
    return std::tuple{p.reasoning, p.content, s.ended()};
  };
  EXPECT_EQ(whole("Let me see.</think>Four."), std::tuple("Let me see.", "Four.", true));
  EXPECT_EQ(whole("<think>\nHm.\n</think>\n\nYes"), std::tuple("\nHm.\n", "\n\nYes", true));
  EXPECT_EQ(whole("still thinking <"), std::tuple("still thinking <", "", false));
  EXPECT_EQ(whole("</think>"), std::tuple("", "", true));
  EXPECT_EQ(whole("<think"), std::tuple("<think", "", false));
  EXPECT_EQ(whole("a</think>b</think>c"), std::tuple("a", "b</think>c", true));
  EXPECT_EQ(whole("x<think>y"), std::tuple("x<think>y", "", false));
  // Streamed: a piece that could begin a marker waits for the next.
  ReasoningSplit s;
  EXPECT_EQ(s.push("<thi").reasoning, "");
  EXPECT_EQ(s.push("nk>ab</th").reasoning, "ab");
  EXPECT_FALSE(s.ended());
  const ReasoningSplit::Parts p = s.push("ink>cd");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, "cd");
  EXPECT_TRUE(s.ended());
}

// Kimi-K2-Thinking may go from its thinking straight to its tool-call section: the section ends
// the thinking and is the content's start (where its calls are read from).
TEST(ReasoningSplit, AToolCallSectionEndsKimisThinking) {
  const std::string section = "<|tool_calls_section_begin|>";
  ReasoningMarkers kimi;
  kimi.opens_content = section;
  const auto whole = [&](const std::string& text) {
    ReasoningSplit s(kimi);
    ReasoningSplit::Parts p = streamed({text}, s);
    return std::tuple{p.reasoning, p.content, s.ended()};
  };
  EXPECT_EQ(whole("Weather first." + section + "<|tool_call_begin|>"),
            std::tuple("Weather first.", section + "<|tool_call_begin|>", true));
  EXPECT_EQ(whole("a</think>b" + section), std::tuple("a", "b" + section, true));
  EXPECT_EQ(whole("a" + section + "b</think>c"), std::tuple("a", section + "b</think>c", true));
  EXPECT_EQ(whole("a<|tool_calls"), std::tuple("a<|tool_calls", "", false));
  ReasoningSplit s(kimi);
  EXPECT_EQ(s.push("hm<|tool_calls_sec").reasoning, "hm");  // held: it may be the section
  const ReasoningSplit::Parts p = s.push("tion_begin|>x");
  EXPECT_EQ(p.reasoning, "");
  EXPECT_EQ(p.content, section + "x");
  EXPECT_TRUE(s.ended());
  // Without the marker (DeepSeek's parsers), the section is thinking.
  ReasoningSplit plain;
  EXPECT_EQ(streamed({"a" + section}, plain).reasoning, "a" + section);
}

// MiniCPM3 thinks when it chooses to: only a reply that opens with its thought has one.
TEST(ReasoningSplit, MiniCpm3ThinksOnlyWhereTheReplyOpensItsThought) {
  const auto whole = [](const std::vector<std::string>& pieces) {
    ReasoningSplit s(ReasoningMarkers::minicpm3());
    ReasoningSplit::Parts p = streamed(pieces, s);
    return std::tuple{p.reasoning, p.content, s.ended()};
  };
  EXPECT_EQ(whole({"<|thought_start|>\nplan\n<|thought_end|>\n<|tool_call_start|>"}),
            std::tuple("\nplan\n", "\n<|tool_call_start|>", true));
  EXPECT_EQ(whole({"Hello <|thought_start|>x<|thought_end|>"}),
            std::tuple("", "Hello <|thought_start|>x<|thought_end|>", true));
  EXPECT_EQ(whole({"<|thought_", "start|>cut"}), std::tuple("cut", "", false));
  EXPECT_EQ(whole({"<|thou"}), std::tuple("", "<|thou", true));  // the whole reply: content
  EXPECT_EQ(whole({"</think>a"}), std::tuple("", "</think>a", true));
  ReasoningSplit s(ReasoningMarkers::minicpm3());
  EXPECT_EQ(s.push("<|tho").content, "");  // held: it may open the thought
  EXPECT_EQ(s.push("ught_start|>a<|thought_e").reasoning, "a");
  EXPECT_EQ(s.push("nd|>b").content, "b");
}

// MiniCPM3's split, written independently: a reply opening with "<|thought_start|>" thinks up to
// the first "<|thought_end|>" (all of it without one); any other reply is content.
std::pair<std::string, std::string> reference_minicpm3(std::string text, bool* ended) {
  const std::string open = "<|thought_start|>", close = "<|thought_end|>";
  if (text.rfind(open, 0) != 0) {
    *ended = true;
    return {"", text};
  }
  text.erase(0, open.size());
  const std::size_t at = text.find(close);
  *ended = at != std::string::npos;
  if (!*ended) return {text, ""};
  return {text.substr(0, at), text.substr(at + close.size())};
}

// Random replies over an alphabet rich in the markers' characters, cut into random pieces: the
// streamed parts joined equal the reference's split of the whole.
TEST(ReasoningSplit, RandomRepliesInRandomPiecesSplitAsTheWhole) {
  test::Rng rng = test::make_rng();
  const std::string section = "<|tool_calls_section_begin|>";
  const std::vector<std::string> atoms = {"<",
                                          ">",
                                          "/",
                                          "t",
                                          "h",
                                          "i",
                                          "n",
                                          "k",
                                          "<think>",
                                          "</think>",
                                          "</thi",
                                          "x",
                                          "\n",
                                          "é",
                                          section,
                                          "<|",
                                          "<|tool_",
                                          "|>",
                                          "<|thought_start|>",
                                          "<|thought_end|>",
                                          "<|thought_",
                                          "_end|>",
                                          "start|>"};
  for (int round = 0; round < 2000; ++round) {
    std::string text;
    const int n = static_cast<int>(rng.range(0, 14));
    for (int i = 0; i < n; ++i)
      text += atoms[static_cast<std::size_t>(
          rng.range(0, static_cast<std::int64_t>(atoms.size()) - 1))];
    std::vector<std::string> pieces;
    for (std::size_t at = 0; at < text.size();) {
      const std::size_t len = static_cast<std::size_t>(rng.range(0, 5));
      pieces.push_back(text.substr(at, len));
      at += len;
    }
    for (const std::string& opens : {std::string(), section}) {
      bool ended = false;
      const auto [reasoning, content] = reference_split(text, &ended, opens);
      ReasoningMarkers markers;
      markers.opens_content = opens;
      ReasoningSplit s(markers);
      const ReasoningSplit::Parts got = streamed(pieces, s);
      EXPECT_EQ(got.reasoning, reasoning) << text << " | " << opens;
      EXPECT_EQ(got.content, content) << text << " | " << opens;
      EXPECT_EQ(s.ended(), ended) << text << " | " << opens;
    }
    bool ended = false;
    const auto [reasoning, content] = reference_minicpm3(text, &ended);
    ReasoningSplit s(ReasoningMarkers::minicpm3());
    const ReasoningSplit::Parts got = streamed(pieces, s);
    EXPECT_EQ(got.reasoning, reasoning) << text << " | minicpm3";
    EXPECT_EQ(got.content, content) << text << " | minicpm3";
    EXPECT_EQ(s.ended(), ended) << text << " | minicpm3";
  }
}

}  // namespace
}  // namespace dcp
