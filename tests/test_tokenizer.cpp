// The byte-level and SentencePiece-style BPE tokenizers on small tokenizer.json files written
// here, and the chat template engine (the real DeepSeek-V3 and Llama 2 files are compared with the
// reference implementations by tests/text/).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/text_stream.h"
#include "dcp/tokenizer.h"
#include "test_util.h"
#include "text/sentencepiece_normalizer.h"

namespace dcp {
namespace {

using json = nlohmann::json;

using test::byte_char;

// Ids 0..255: the byte characters (id = byte); then the merged tokens listed, from 256.
json small_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(b)] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    m.push_back(a + " " + b);
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array(
                 {{{"type", "Split"},
                   {"pattern", {{"Regex", "\\p{N}{1,3}"}}},
                   {"behavior", "Isolated"},
                   {"invert", false}},
                  {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}})}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", json::array({{{"id", 400}, {"content", "<s>"}, {"special", true}},
                                        {{"id", 401}, {"content", "<s>>"}, {"special", true}},
                                        {{"id", 402}, {"content", "ab"}, {"special", false}}})}};
}

Tokenizer make(const json& t, const json& config = nullptr) {
  return Tokenizer::from_json(t.dump(), config.is_null() ? "" : config.dump());
}

std::vector<std::int32_t> bytes_of(const std::string& s) {
  std::vector<std::int32_t> ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(Tokenizer, MergesApplyByRankAndTiesGoLeft) {
  // "hello": l+l (rank 0) first, then h+e, he+ll, hell+o.
  const Tokenizer t = make(small_tokenizer({{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}}));
  EXPECT_EQ(t.encode("hello"), (std::vector<std::int32_t>{259}));
  // "lll": the two l+l candidates tie on rank; the left one merges.
  EXPECT_EQ(t.encode("lll"), (std::vector<std::int32_t>{256, 'l'}));
  // A merge whose left part never forms does not apply: "hel" is he + l.
  EXPECT_EQ(t.encode("hel"), (std::vector<std::int32_t>{257, 'l'}));
}

TEST(Tokenizer, PreTokenizerSplitsDigitsAndWordsBeforeMerging) {
  // Merges never cross a pre-token: "l1l" has no l+l, digits go in runs of three, and GPT-2's
  // pattern keeps a space with the word after it.
  const Tokenizer t =
      make(small_tokenizer({{"l", "l"}, {"1", "2"}, {"12", "3"}, {byte_char(' '), "l"}}));
  EXPECT_EQ(t.encode("l1l"), (std::vector<std::int32_t>{'l', '1', 'l'}));
  EXPECT_EQ(t.encode("1234"), (std::vector<std::int32_t>{258, '4'}));  // "123" | "4"
  EXPECT_EQ(t.encode("l l"), (std::vector<std::int32_t>{'l', 259}));  // "l" | " l"
  // Bytes outside ASCII map to their byte characters, one id per byte without merges.
  EXPECT_EQ(t.encode("\xc3\xa9"), bytes_of("\xc3\xa9"));
}

TEST(Tokenizer, AddedTokensMatchFirstLeftmostLongest) {
  const Tokenizer t = make(small_tokenizer({{"a", "b"}}));
  // "ab" is an added token (402), not the merge a+b; "<s>>" beats "<s>" where both start.
  EXPECT_EQ(t.encode("xab<s>>y<s>"),
            (std::vector<std::int32_t>{'x', 402, 401, 'y', 400}));
  EXPECT_TRUE(t.is_special(400));
  EXPECT_FALSE(t.is_special(402));
  EXPECT_EQ(t.decode({'x', 402, 401, 'y', 400}), "xab<s>>y<s>");
  EXPECT_EQ(t.decode({'x', 402, 401, 'y', 400}, true), "xaby");
}

TEST(Tokenizer, DecodesBytesAndReplacesInvalidSequences) {
  const Tokenizer t = make(small_tokenizer({}));
  const std::string text = "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x99\x82";
  EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.decode({'a', 0xff, 'b'}), "a\xef\xbf\xbd" "b");
  EXPECT_TRUE(test::throws_error([&] { t.decode({100000}); }, ErrorCategory::invalid_argument,
                                 "token id 100000 is not in the vocabulary"));
  // Invalid input bytes become U+FFFD before encoding, as a browser's TextDecoder reads them.
  EXPECT_EQ(t.encode("a\x80" "b"), t.encode("a\xef\xbf\xbd" "b"));
}

TEST(Tokenizer, StreamDecoderNeverEmitsHalfACharacter) {
  const Tokenizer t = make(small_tokenizer({}));
  const std::string text = "a\xe4\xbd\xa0\xf0\x9f\x99\x82z";  // a, 你, 🙂, z
  StreamDecoder s(t);
  std::vector<std::string> parts;
  for (std::int32_t id : bytes_of(text)) parts.push_back(s.push(id));
  parts.push_back(s.finish());
  const std::vector<std::string> want = {
      "a", "", "", "\xe4\xbd\xa0", "", "", "", "\xf0\x9f\x99\x82", "z", ""};
  EXPECT_EQ(parts, want);
  // An invalid byte is emitted at once (as U+FFFD); a cut-off character at the end by finish().
  StreamDecoder bad(t);
  EXPECT_EQ(bad.push(0xff), "\xef\xbf\xbd");
  EXPECT_EQ(bad.push(0xe4), "");
  EXPECT_EQ(bad.finish(), "\xef\xbf\xbd");
}

TEST(Tokenizer, ConfigGivesBosEosAndTheChatTemplate) {
  json t = small_tokenizer({});
  const json config = {{"add_bos_token", true},
                       {"bos_token", {{"content", "<s>"}, {"__type", "AddedToken"}}},
                       {"eos_token", "<s>>"},
                       {"chat_template", "{{ bos_token }}"}};
  const Tokenizer tok = make(t, config);
  EXPECT_EQ(tok.bos_id(), 400);
  EXPECT_EQ(tok.eos_id(), 401);
  EXPECT_EQ(tok.bos_token(), "<s>");
  EXPECT_EQ(tok.encode("x", true), (std::vector<std::int32_t>{400, 'x'}));
  EXPECT_EQ(tok.encode("x", false), (std::vector<std::int32_t>{'x'}));
  ASSERT_TRUE(tok.chat_template().has_value());
  EXPECT_EQ(*tok.chat_template(), "{{ bos_token }}");
  EXPECT_TRUE(test::throws_error([&] { make(t, {{"bos_token", "<nope>"}}); }, ErrorCategory::io,
                                 "bos_token '<nope>' is not a token of tokenizer.json"));
  EXPECT_TRUE(test::throws_error([&] { make(t, {{"clean_up_tokenization_spaces", true}}); },
                                 ErrorCategory::io,
                                 "clean_up_tokenization_spaces = true is not supported"));
}

TEST(Tokenizer, ASetChatTemplateReplacesTheConfigsOrIsTheOnlyOne) {
  Tokenizer own = make(small_tokenizer({}), {{"bos_token", "<s>"}, {"chat_template", "config"}});
  own.set_chat_template("{{ bos_token }}{{ messages | length }}");
  EXPECT_EQ(apply_chat_template(own, R"([{"role": "user", "content": "a"}])", false), "<s>1");
  Tokenizer none = make(small_tokenizer({}));
  ASSERT_FALSE(none.chat_template().has_value());
  EXPECT_TRUE(test::throws_error([&] { apply_chat_template(none, "[]", false); },
                                 ErrorCategory::invalid_argument, "has no chat_template"));
  // A template for one call: the tokenizer's stays as it was.
  EXPECT_EQ(apply_chat_template(own, "[]", true, "{{ add_generation_prompt }}"), "True");
  EXPECT_EQ(*own.chat_template(), "{{ bos_token }}{{ messages | length }}");
  none.set_chat_template("{{ messages | length }} messages");
  EXPECT_EQ(apply_chat_template(none, "[]", false), "0 messages");
}

// The text of `tokens` pushed one at a time, then finished; the pieces as they came.
std::vector<std::string> stream_pieces(TextStream& s, const std::string& tokens) {
  std::vector<std::string> pieces;
  for (unsigned char c : tokens) pieces.push_back(s.push(c));  // byte-level ids: the byte
  pieces.push_back(s.finish());
  return pieces;
}

TEST(TextStream, EndsBeforeTheFirstStopStringAcrossTokens) {
  const Tokenizer t = make(small_tokenizer({}));
  EXPECT_TRUE(test::throws_error(
      [&] {
        TextStream(&t, {"cd", ""}, false);
      },
      ErrorCategory::invalid_argument, "must not be empty"));
  TextStream s(&t, {"cd", "xyz"}, false);
  // "c" is held back until "d" completes "cd"; what follows is dropped.
  EXPECT_EQ(stream_pieces(s, "abcdef"), (std::vector<std::string>{"a", "b", "", "", "", "", ""}));
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.tokens(), (std::vector<std::int32_t>{'a', 'b', 'c', 'd'}));
  // A start of a stop string that does not go on is released, at the end at the latest.
  TextStream t2(&t, {"xyz"}, false);
  EXPECT_EQ(stream_pieces(t2, "axyaxy"),
            (std::vector<std::string>{"a", "", "", "xya", "", "", "xy"}));
  EXPECT_FALSE(t2.stopped());
  // One token completes both: the earlier match wins over the stop string listed first.
  TextStream t3(&t, {"bc", "abc"}, false);
  std::string text;
  for (const std::string& p : stream_pieces(t3, "xabc")) text += p;
  EXPECT_EQ(text, "x");
  // No tokenizer: ids only, no text.
  TextStream ids(nullptr, {"a"}, false);
  EXPECT_EQ(stream_pieces(ids, "ab"), (std::vector<std::string>{"", "", ""}));
  EXPECT_EQ(ids.tokens(), (std::vector<std::int32_t>{'a', 'b'}));
}

// min_tokens: a stop string counts only where it ends in a later token's text; include_stop
// keeps the stop string in the text.
TEST(TextStream, MinTokensAndIncludeStopString) {
  const Tokenizer t = make(small_tokenizer({}));
  const auto text_of = [](TextStream& s, const std::string& chars) {
    std::string text;
    for (const std::string& p : stream_pieces(s, chars)) text += p;
    return text;
  };
  // "cd" lies within the first 4 tokens: it does not stop; the second "cd" (tokens 6-7) does.
  TextStream s(&t, {"cd"}, false, 4);
  EXPECT_EQ(text_of(s, "abcdecdf"), "abcde");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.tokens().size(), 7u);
  // One that starts within them and ends after them counts, cut where it starts.
  TextStream straddle(&t, {"cde"}, false, 4);
  EXPECT_EQ(text_of(straddle, "abcdef"), "ab");
  EXPECT_EQ(straddle.tokens().size(), 5u);
  // One that ends on the last of the first min_tokens tokens does not.
  TextStream last(&t, {"cd"}, false, 4);
  EXPECT_EQ(text_of(last, "abcd"), "abcd");
  EXPECT_FALSE(last.stopped());
  // include_stop: the text ends after the stop string (the one starting first).
  TextStream kept(&t, {"bc", "abc"}, false, 0, true);
  EXPECT_EQ(text_of(kept, "xabcd"), "xabc");
  TextStream kept_min(&t, {"cd"}, false, 4, true);
  EXPECT_EQ(text_of(kept_min, "abcdecdf"), "abcdecd");
  // min_tokens 0 is the plain stream.
  TextStream none(&t, {"cd"}, false, 0);
  EXPECT_EQ(text_of(none, "abcdecdf"), "ab");
  EXPECT_TRUE(test::throws_error([&] { TextStream(&t, {"cd"}, false, -1); },
                                 ErrorCategory::invalid_argument, "min_tokens = -1 must be >= 0"));
}

// The stop token that ends a generation counts among its tokens but writes no text (unless the
// stop is to be kept); a special token elsewhere is text when special tokens are kept.
TEST(TextStream, TheEndingStopTokenWritesNoText) {
  const Tokenizer t = make(small_tokenizer({}));
  TextStream s(&t, {}, false);
  EXPECT_EQ(s.push(400), "<s>");
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push_stop_token(400), "");
  EXPECT_EQ(s.finish(), "");
  EXPECT_EQ(s.tokens(), (std::vector<std::int32_t>{400, 'a', 400}));
  TextStream kept(&t, {}, false, 0, /*include_stop=*/true);
  EXPECT_EQ(kept.push('a'), "a");
  EXPECT_EQ(kept.push_stop_token(400), "<s>");
  // A stop string's held-back start is released by the stop token, as the end releases it.
  TextStream held(&t, {"ab"}, false);
  EXPECT_EQ(held.push('a'), "");
  EXPECT_EQ(held.push_stop_token(400), "");
  EXPECT_EQ(held.finish(), "a");
}

TEST(TextStream, BadWordsAreBannedAtTheStartAndAfterASpace) {
  // "hi" is one token (256) and " hi" another (257); "x y" has no merges.
  const Tokenizer t = make(small_tokenizer({{"h", "i"}, {byte_char(' '), "hi"}}));
  using Ids = std::vector<std::vector<std::int32_t>>;
  EXPECT_EQ(bad_word_token_ids(t, {"  hi", "x y"}),
            (Ids{{256}, {257}, {'x', ' ', 'y'}, {' ', 'x', ' ', 'y'}}));
  EXPECT_TRUE(bad_word_token_ids(t, {}).empty());
  EXPECT_TRUE(test::throws_error(
      [&] {
        bad_word_token_ids(t, {"hi", " \t"});
      },
      ErrorCategory::invalid_argument, "bad_words[1] = ' \t' holds no token"));
}

TEST(Tokenizer, RefusesWhatItCannotReadExactly) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& needle) {
    json t = small_tokenizer({{"a", "b"}});
    edit(t);
    return test::throws_error([&] { make(t); }, ErrorCategory::io, needle);
  };
  EXPECT_TRUE(refused([](json& t) { t["model"]["type"] = "WordPiece"; },
                      "model type 'WordPiece' is not supported (legal: BPE)"));
  EXPECT_TRUE(refused([](json& t) { t["normalizer"] = {{"type", "NFC"}}; },
                      "normalizer 'NFC' is not supported"));
  EXPECT_TRUE(refused(
      [](json& t) { t["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "MergedWithNext"; },
      "Split behavior 'MergedWithNext' is not supported (legal: Isolated, Removed)"));
  EXPECT_TRUE(
      refused([](json& t) { t["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(a"; },
              "PCRE2 cannot compile the pattern"));
  EXPECT_TRUE(refused([](json& t) { t["model"]["merges"].push_back("zz qq"); },
                      "('zz', 'qq') names a token that is not in the vocabulary"));
  EXPECT_TRUE(refused([](json& t) { t["decoder"] = {{"type", "WordPiece"}}; },
                      "decoder 'WordPiece' is not supported"));
  EXPECT_TRUE(refused([](json& t) { t["added_tokens"][0]["lstrip"] = true; },
                      "added token '<s>': lstrip = true is not supported"));
  EXPECT_TRUE(test::throws_error([] { Tokenizer::from_json("{"); }, ErrorCategory::io,
                                 "tokenizer.json is not valid JSON"));
}

// SentencePiece-style: <unk> <s> </s>, the 256 byte tokens <0x00>..<0xFF> (ids 3..258), then
// "▁" 259, "a" 260, "b" 261 and the merges' results from 262.
const std::string kMark = "\xE2\x96\x81";  // U+2581

json sentencepiece_tokenizer(bool byte_tokens = true) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    if (byte_tokens) vocab[name] = 3 + b;
  }
  vocab[kMark] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab[kMark + "a"] = 262;
  vocab["ab"] = 263;
  vocab[kMark + "ab"] = 264;
  const json merges = {kMark + " a", kMark + "a b", "a b"};
  const json replace_space = {
      {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMark}};
  return {
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges", merges},
        {"unk_token", "<unk>"},
        {"fuse_unk", true},
        {"byte_fallback", true}}},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kMark}}, replace_space})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", kMark}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"added_tokens", json::array({{{"id", 0}, {"content", "<unk>"}, {"special", true}},
                                    {{"id", 1}, {"content", "<s>"}, {"special", true}},
                                    {{"id", 2}, {"content", "</s>"}, {"special", true}}})}};
}

TEST(SentencePieceBpe, SpacesBecomeMarksAndMergesRunOverTheWholeText) {
  const Tokenizer tok = make(sentencepiece_tokenizer());
  // "▁ab▁ab": "▁ a" (rank 0) then "▁a b" (rank 1) at both places; "a b" never gets its turn.
  EXPECT_EQ(tok.encode("ab ab"), (std::vector<std::int32_t>{264, 264}));
  EXPECT_EQ(tok.encode("b  a"), (std::vector<std::int32_t>{259, 261, 259, 262}));
  // One mark before each stretch of text between added tokens.
  EXPECT_EQ(tok.encode("<s>ab</s>a"), (std::vector<std::int32_t>{1, 264, 2, 262}));
  EXPECT_EQ(tok.token_bytes(264), " ab");
  EXPECT_EQ(tok.decode({264, 264}), "ab ab");  // the leading space the normalizer added goes
  EXPECT_EQ(tok.decode({1, 264}), "<s> ab");   // only at the very start of the text
  EXPECT_EQ(tok.decode({1, 264}, true), "ab");
}

TEST(SentencePieceBpe, CharactersOutsideTheVocabularyFallBackToBytesElseUnk) {
  const Tokenizer tok = make(sentencepiece_tokenizer());
  // "é" is C3 A9.
  EXPECT_EQ(tok.encode("\xC3\xA9"), (std::vector<std::int32_t>{259, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.token_bytes(3 + 0xC3), "\xC3");
  EXPECT_EQ(tok.decode({259, 3 + 0xC3, 3 + 0xA9, 260}),
            "\xC3\xA9"
            "a");
  EXPECT_EQ(tok.decode({3 + 0xC3}), "\xEF\xBF\xBD");  // half a character: U+FFFD
  // Without byte tokens an unknown character is <unk>, a run of them one <unk> (fuse_unk).
  const Tokenizer no_bytes = make(sentencepiece_tokenizer(false));
  EXPECT_EQ(no_bytes.encode("\xC3\xA9\xC3\xA9"
                            "a"),
            (std::vector<std::int32_t>{259, 0, 260}));
  json unfused = sentencepiece_tokenizer(false);
  unfused["model"]["fuse_unk"] = false;
  EXPECT_EQ(make(unfused).encode("\xC3\xA9\xC3\xA9"), (std::vector<std::int32_t>{259, 0, 0}));
}

TEST(SentencePieceBpe, SpecialTokensComeFromThePostProcessorUnlessTheConfigSays) {
  const Tokenizer tok = make(sentencepiece_tokenizer());
  EXPECT_EQ(tok.encode("a", true), (std::vector<std::int32_t>{1, 262}));
  EXPECT_EQ(tok.bos_id(), std::optional<std::int32_t>(1));
  EXPECT_EQ(make(sentencepiece_tokenizer(), {{"add_bos_token", false}}).encode("a", true),
            (std::vector<std::int32_t>{262}));
  json with_eos = sentencepiece_tokenizer();
  with_eos["post_processor"]["single"].push_back({{"SpecialToken", {{"id", "</s>"}}}});
  EXPECT_EQ(make(with_eos).encode("a", true), (std::vector<std::int32_t>{1, 262, 2}));
  EXPECT_EQ(make(with_eos).eos_id(), std::optional<std::int32_t>(2));
}

TEST(SentencePieceBpe, RefusesAnyOtherPipeline) {
  const auto refused = [](const std::function<void(json&)>& edit, const std::string& needle) {
    json t = sentencepiece_tokenizer();
    edit(t);
    return test::throws_error([&] { make(t); }, ErrorCategory::io, needle);
  };
  EXPECT_TRUE(refused(
      [](json& t) {
        t["normalizer"] = {{"type", "NFKC"}};
      },
      "the normalizer must be a Sequence of Prepend"));
  EXPECT_TRUE(refused([](json& t) { t["normalizer"]["normalizers"][0]["prepend"] = "_"; },
                      "the normalizer must be a Sequence of Prepend"));
  EXPECT_TRUE(refused(
      [](json& t) {
        t["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMark}};
      },
      "pre_tokenizer must be null (got type Metaspace)"));
  EXPECT_TRUE(refused([](json& t) { t["decoder"]["decoders"].erase(1); },
                      "the decoder must be a Sequence of Replace"));
  EXPECT_TRUE(refused([](json& t) { t["decoder"]["decoders"][3]["start"] = 2; },
                      "the decoder must be a Sequence of Replace"));
  EXPECT_TRUE(refused([](json& t) { t["model"]["unk_token"] = "<oov>"; },
                      "model.unk_token '<oov>' is not in the vocabulary"));
  EXPECT_TRUE(refused(
      [](json& t) {
        auto& single = t["post_processor"]["single"];
        single.insert(single.begin(), single[0]);
      },
      "post_processor.single ="));
  EXPECT_TRUE(
      refused([](json& t) { t["post_processor"]["single"][0]["SpecialToken"]["id"] = "<x>"; },
              "post_processor special token '<x>' is not a token"));
  EXPECT_TRUE(refused(
      [](json& t) {
        t["post_processor"] = {{"type", "BertProcessing"}};
      },
      "post_processor 'BertProcessing' is not supported"));
  EXPECT_TRUE(refused(
      [](json& t) {
        t["added_tokens"].push_back({{"id", 265}, {"content", "a b"}, {"normalized", true}});
      },
      "added token 'a b': normalized = true with a space in it is not supported"));
}

TEST(Utf8, LossyDecodingReplacesEachMaximalInvalidSubpart) {
  // As the WHATWG encoding standard decodes: a truncated sequence is one U+FFFD, a byte that can
  // never start or continue one is one each.
  const std::string r = "\xef\xbf\xbd";
  EXPECT_EQ(utf8_lossy("a\x80" "b"), "a" + r + "b");
  EXPECT_EQ(utf8_lossy("\xe4\xbd" "a"), r + "a");
  EXPECT_EQ(utf8_lossy("x\xf0\x9f\x98"), "x" + r);
  EXPECT_EQ(utf8_lossy("\xc0\xaf"), r + r);              // overlong: never valid
  EXPECT_EQ(utf8_lossy("\xed\xa0\x80"), r + r + r);      // a surrogate
  EXPECT_EQ(utf8_lossy("\xf4\x90\x80\x80"), r + r + r + r);  // past U+10FFFF
  EXPECT_EQ(utf8_lossy("ok \xe4\xbd\xa0"), "ok \xe4\xbd\xa0");
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xbd"), 1u);
  EXPECT_EQ(utf8_complete_prefix("a\xff"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xe4\xbd\xa0"), 4u);
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

std::string render(const std::string& tmpl, const std::string& context = "{}") {
  return ChatTemplate(tmpl).render(context);
}

// Where Python's Jinja (what transformers' apply_chat_template runs) and the JavaScript reference
// differ, dcp follows Python; the rest is compared with the reference in tests/text/.
TEST(ChatTemplate, ContinueFinalMessageCutsAfterItsLastOccurrence) {
  // The content also appears earlier (in a user turn): the cut is after the final one.
  EXPECT_EQ(continue_final_message("<u>The sky is<a>The sky is</s>", "The sky is"),
            "<u>The sky is<a>The sky is");
  EXPECT_TRUE(test::throws_error([] { continue_final_message("<a></s>", ""); },
                                 ErrorCategory::invalid_argument, "has no content to continue"));
  EXPECT_TRUE(test::throws_error([] { continue_final_message("<a>THE SKY</s>", "the sky"); },
                                 ErrorCategory::invalid_argument,
                                 "did not write the final message"));
}

TEST(ChatTemplate, FollowsPythonWhereTheJavaScriptReferenceDiffers) {
  EXPECT_EQ(render("{{ true }} {{ none }} {{ 1.0 }} {{ [1, 'a'] }}"), "True None 1.0 [1, 'a']");
  EXPECT_EQ(render("{{ -7 % 3 }} {{ -7 // 2 }} {{ 'ab' * 3 }} {{ 7 / 2 }}"), "2 -4 ababab 3.5");
  EXPECT_EQ(render("{{ x | tojson }}", R"({"x": {"b": [1, "é"], "a": null}})"),
            R"({"b": [1, "é"], "a": null})");
}

// Found by fuzz_chat_template (a leak): a namespace that holds itself, or its own bound method,
// renders, and the renderer frees it.
TEST(ChatTemplate, NamespacesMayHoldThemselves) {
  EXPECT_EQ(render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{% set ns.f = ns.items %}"
                   "{{ ns.self.self.a }}"),
            "1");
}

// Found by fuzz_chat_template (a stack overflow printing such a namespace): every recursion is
// bounded, of values, of expressions and of blocks, and fails naming the limit.
TEST(ChatTemplate, NestingIsBounded) {
  EXPECT_TRUE(test::throws_error(
      [] { render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}"); },
      ErrorCategory::invalid_argument, "values nested deeper than 200"));
  std::string sum = "{{ 1";
  for (int k = 0; k < 1000; ++k) sum += " + 1";
  EXPECT_TRUE(test::throws_error([&] { ChatTemplate(sum + " }}"); },
                                 ErrorCategory::invalid_argument,
                                 "an expression nested deeper than 500"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{{ " + std::string(1000, '(') + "1" +
                                                   std::string(1000, ')') + " }}"); },
                                 ErrorCategory::invalid_argument, "nested deeper than"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{{ " + std::string(1000, '-') + "1 }}"); },
                                 ErrorCategory::invalid_argument, "more than 200 signs in a row"));
  std::string blocks;
  for (int k = 0; k < 300; ++k) blocks += "{% if true %}";
  EXPECT_TRUE(test::throws_error([&] { ChatTemplate{blocks}; }, ErrorCategory::invalid_argument,
                                 "blocks nested deeper than 200"));
  std::string deep = "1";
  for (int k = 0; k < 300; ++k) deep = "[" + deep + "]";
  EXPECT_TRUE(test::throws_error([&] { render("{{ x }}", "{\"x\": " + deep + "}"); },
                                 ErrorCategory::invalid_argument, "values nested deeper than 200"));
  std::string ok = "{{ 1";
  for (int k = 0; k < 100; ++k) ok += " + 1";
  EXPECT_EQ(render(ok + " }}"), "101");
}

TEST(ChatTemplate, ScopesLikeJinja) {
  // A loop's {% set %} stays in the loop; a namespace carries values out of it.
  EXPECT_EQ(render("{% set n = 0 %}{% for i in range(3) %}{% set n = n + i %}{% endfor %}{{ n }}"),
            "0");
  EXPECT_EQ(render("{% set ns = namespace(n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
                   "{% endfor %}{{ ns.n }}"),
            "3");
  EXPECT_EQ(render("{% for a, b in [[1, 2], [3, 4]] %}{{ a * b }},{% endfor %}"), "2,12,");
}

TEST(ChatTemplate, NoneHasNoAttributesOrItems) {
  // Python's Jinja (and the JavaScript reference) read them as undefined, not as an error.
  EXPECT_EQ(render("{% set x = none %}[{{ x.foo }}]{{ x.foo is defined }}{{ x['a'] is defined }}"),
            "[]FalseFalse");
}

TEST(ChatTemplate, CallBlocksPassTheirBodyAsCaller) {
  // The body renders where the block is (its loop and variables), each time the macro calls it.
  EXPECT_EQ(
      render("{% macro twice() %}[{{ caller() }}{{ caller() }}]{% endmacro %}"
             "{% set v = 'v' %}{% for i in range(2) %}{% call twice() %}{{ v }}{{ loop.index }}"
             "{% endcall %}{% endfor %}"),
      "[v1v1][v2v2]");
  // Parameters of the caller, with defaults; the macro's own arguments as usual.
  EXPECT_EQ(render("{% macro tag(t) %}<{{ t }}>{{ caller(t | upper) }}{{ caller('x', n=3) }}"
                   "{% endmacro %}{% call(s, n=1) tag('b') %}{{ s }}{{ n }}{% endcall %}"),
            "<b>B1x3");
  // Recursion through call blocks, as MiniCPM3's tool template builds its classes.
  EXPECT_EQ(render("{% macro nest(k) %}{% set ns = namespace(f=caller()) %}{% if k > 0 %}"
                   "{% call nest(k - 1) %}({{ k }}){% endcall %}{% endif %}{{ ns.f }}{% endmacro %}"
                   "{% call nest(2) %}top{% endcall %}"),
            "(1)(2)top");
  // A macro that never calls caller() refuses a call block; one that does, called without a
  // block, finds caller undefined.
  EXPECT_TRUE(test::throws_error(
      [] { render("{% macro m() %}x{% endmacro %}{% call m() %}y{% endcall %}"); },
      ErrorCategory::invalid_argument, "the macro 'm' is called by {% call %} but never calls"));
  EXPECT_TRUE(
      test::throws_error([] { render("{% macro m() %}{{ caller() }}{% endmacro %}{{ m() }}"); },
                         ErrorCategory::invalid_argument, "is not callable"));
}

TEST(ChatTemplate, RefusesWhatItDoesNotRunNamingTheLine) {
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("a\n{% filter upper %}x{% endfilter %}"); },
                                 ErrorCategory::invalid_argument,
                                 "chat template line 2: '{% filter %}' is not supported"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% call x %}y{% endcall %}"); },
                                 ErrorCategory::invalid_argument, "{% call %} must call a macro"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% call m() %}y"); },
                                 ErrorCategory::invalid_argument, "'{% endcall %}' is missing"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% if x %}"); },
                                 ErrorCategory::invalid_argument, "'{% endif %}' is missing"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{{ x | nosuch }}").render("{}"); },
                                 ErrorCategory::invalid_argument,
                                 "the filter '|nosuch' is not supported"));
  EXPECT_TRUE(test::throws_error([] { render("{{ raise_exception('no system role') }}"); },
                                 ErrorCategory::invalid_argument, "chat template: no system role"));
  EXPECT_TRUE(test::throws_error([] { render("{{ x['a'] }}"); }, ErrorCategory::invalid_argument,
                                 "cannot index a undefined"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 'a' }", "{}"); }, ErrorCategory::invalid_argument,
                                 "a tag is not closed with '}}'"));
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// Macros, loop controls and the rest of what Kimi's published templates use. Each expected text
// is what Python's Jinja 3.1 renders with Hugging Face's settings (trim_blocks, lstrip_blocks,
// loop controls).
TEST(ChatTemplate, MacrosTakeArgumentsAsJinjaPassesThem) {
  // Defaults are evaluated at the call and see the parameters before them; a parameter left
  // without a value is undefined; keywords bind by name.
  EXPECT_EQ(render("{% macro m(a, b=a~'!') %}{{ a }}{{ b }}{% endmacro %}"
                   "{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}"),
            "11!1243");
  EXPECT_EQ(render("{% macro m(a, b) %}{{ a }}{{ b is defined }}{% endmacro %}{{ m(1) }}"),
            "1False");
  EXPECT_EQ(render("{% macro m(a='x') %}{{ a }}{% endmacro %}{{ m(none) }}"), "None");
  // Extra arguments only where the body reads varargs or kwargs.
  EXPECT_EQ(render("{% macro m(x) %}{{ varargs | length }}{{ kwargs.c }}{% endmacro %}"
                   "{{ m(1, 2, 3, c=4) }}"),
            "24");
  EXPECT_TRUE(test::throws_error(
      [] { render("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}"); },
      ErrorCategory::invalid_argument, "the macro 'm' takes at most 1 arguments, not 2"));
  EXPECT_TRUE(test::throws_error([] { render("{% macro m(a) %}{% endmacro %}{{ m(c=1) }}"); },
                                 ErrorCategory::invalid_argument,
                                 "the macro 'm' has no parameter 'c'"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% macro m(a=1, b) %}{% endmacro %}"); },
                                 ErrorCategory::invalid_argument,
                                 "parameter 'b' without a default follows one with a default"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% macro m(a, a) %}{% endmacro %}"); },
                                 ErrorCategory::invalid_argument, "names its parameter 'a' twice"));
  // Whitespace control inside the body; the result is a string.
  EXPECT_EQ(render("{%- macro m(msg) -%}\n  {{ msg }}\n{%- endmacro -%}\n{{ m('q') }}"), "q");
  EXPECT_EQ(render("{% macro m() %}a{% endmacro %}{{ m() | length }}{{ m() ~ 'b' }}"
                   "{{ m() is string }}"),
            "1abTrue");
}

TEST(ChatTemplate, MacrosSeeTheScopesTheyAreDefinedIn) {
  // The template's variables as they are at the call, set before or after the definition.
  EXPECT_EQ(render("{% set x = 1 %}{% macro m() %}[{{ x }}]{% endmacro %}{% set x = 2 %}{{ m() }}"),
            "[2]");
  // A loop's variables inside that loop; never the caller's loop variables or `loop`.
  EXPECT_EQ(
      render("{% for i in [1, 2] %}{% macro m() %}{{ i }}{% endmacro %}{{ m() }}{% endfor %}"),
      "12");
  EXPECT_EQ(render("{% macro m() %}{{ x }}{{ loop }}{% endmacro %}"
                   "{% for x in [1, 2] %}{{ m() }}{% endfor %}"),
            "");
  // The body's sets stay in it; a namespace carries values out.
  EXPECT_EQ(render("{% macro m() %}{% set x = 3 %}{{ x }}{% endmacro %}{% set x = 1 %}"
                   "{{ m() }}{{ x }}"),
            "31");
  EXPECT_EQ(render("{% set ns = namespace(v=0) %}{% macro m(s) %}{% set s.v = s.v + 7 %}"
                   "{% endmacro %}{{ m(ns) }}{{ ns.v }}"),
            "7");
  // Defined inside an if, visible after it; calling one another, and themselves.
  EXPECT_EQ(render("{% if true %}{% macro m() %}{{ n() }}{% endmacro %}{% endif %}"
                   "{% macro n() %}two{% endmacro %}{{ m() }}"),
            "two");
  EXPECT_EQ(render("{% macro m(x) %}{% if x > 0 %}{{ x }}{{ m(x - 1) }}{% endif %}{% endmacro %}"
                   "{{ m(3) }}"),
            "321");
  // dcp's one refusal: a macro taken out of the loop it is defined in.
  EXPECT_TRUE(test::throws_error(
      [] {
        render(
            "{% set ns = namespace() %}{% for i in [1] %}{% macro m() %}{{ i }}{% endmacro %}"
            "{% set ns.f = m %}{% endfor %}{{ ns.f() }}");
      },
      ErrorCategory::invalid_argument, "the macro 'm' is called after the loop it is defined in"));
}

TEST(ChatTemplate, RecursiveMacrosAreBounded) {
  EXPECT_TRUE(test::throws_error([] { render("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}"); },
                                 ErrorCategory::invalid_argument,
                                 "the rendering nests deeper than 1000"));
  EXPECT_TRUE(test::throws_error(
      [] {
        render(
            "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}{% endmacro %}"
            "{{ m(40) }}");
      },
      ErrorCategory::invalid_argument, "more than 1000000 macro calls"));
  // Recursion through call blocks: each body the macro calls opens another block.
  EXPECT_TRUE(test::throws_error(
      [] {
        render(
            "{% macro m() %}{% call m() %}x{% endcall %}{{ caller() }}{% endmacro %}"
            "{% call m() %}y{% endcall %}");
      },
      ErrorCategory::invalid_argument, "the rendering nests deeper than 1000"));
}

TEST(ChatTemplate, BreakAndContinueEndTheirLoop) {
  EXPECT_EQ(render("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}"
                   "{% endfor %}"),
            "012");
  EXPECT_EQ(render("{% for i in range(5) %}{% if i % 2 %}{% continue %}{% endif %}{{ i }}"
                   "{% endfor %}"),
            "024");
  EXPECT_EQ(render("{% for i in range(3) %}{% for j in range(3) %}{% if j == 1 %}{% break %}"
                   "{% endif %}{{ i }}{{ j }} {% endfor %}{% endfor %}"),
            "00 10 20 ");
  EXPECT_EQ(render("{% for i in range(4) %}{{ loop.index }}{% if loop.last %}L{% endif %}"
                   "{% if i == 1 %}{% continue %}{% endif %}x{% endfor %}"),
            "1x23x4Lx");
  // Jinja runs a loop's else when no iteration reached the end of its body.
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% break %}{% else %}E{% endfor %}"), "0E");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% if i == 1 %}{% break %}{% endif %}"
                   "{% else %}E{% endfor %}"),
            "01");
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% continue %}{% else %}E{% endfor %}"), "012E");
  // A break in a loop's else ends the loop around it.
  EXPECT_EQ(render("{% for j in [1, 2] %}{% for i in [] %}{% else %}{% break %}{% endfor %}"
                   "{{ j }}{% endfor %}"),
            "");
  for (const char* outside :
       {"{% break %}", "{% for i in [] %}{% else %}{% continue %}{% endfor %}",
        "{% for i in [1] %}{% macro m() %}{% break %}{% endmacro %}"
        "{% endfor %}"})
    EXPECT_TRUE(test::throws_error([&] { ChatTemplate{outside}; }, ErrorCategory::invalid_argument,
                                   "outside a loop"))
        << outside;
}

TEST(ChatTemplate, ForLoopsFilterTheirItems) {
  // The `if` after the iterable filters items: it is not a conditional expression.
  EXPECT_EQ(render("{% for i in range(3) if i > 5 %}{{ i }}{% else %}E{% endfor %}"), "E");
  EXPECT_EQ(render("{% for m in messages if m.role == 'user' %}{{ m.content }}{{ loop.length }}"
                   "{% endfor %}",
                   R"({"messages": [{"role": "user", "content": "a"},)"
                   R"( {"role": "system", "content": "b"}, {"role": "user", "content": "c"}]})"),
            "a2c2");
}

TEST(ChatTemplate, TagsEndWhereTheirBracketsClose) {
  EXPECT_EQ(render("{{ {'y': {}} }}"), "{'y': {}}");
  EXPECT_EQ(render("{{ [{'a': [1]}][0]['a'] }}}"), "[1]}");
  // A comment ends at its first #}, quotes or not.
  EXPECT_EQ(render("a{# don't #}b"), "ab");
}

TEST(ChatTemplate, TojsonTakesHuggingFacesArguments) {
  const std::string x = R"({"x": {"b": [1, {"é": 2}], "a": 1.5}})";
  EXPECT_EQ(render("{{ x | tojson(indent=2) }}", x),
            "{\n  \"b\": [\n    1,\n    {\n      \"é\": 2\n    }\n  ],\n  \"a\": 1.5\n}");
  EXPECT_EQ(render("{{ x | tojson(ensure_ascii=true) }}", x),
            R"({"b": [1, {"\u00e9": 2}], "a": 1.5})");
  EXPECT_EQ(render("{{ x | tojson(separators=(',', ':'), sort_keys=true) }}", x),
            R"({"a":1.5,"b":[1,{"é":2}]})");
  EXPECT_EQ(render("{{ x | tojson(indent='\t', sort_keys=true) }}", x),
            "{\n\t\"a\": 1.5,\n\t\"b\": [\n\t\t1,\n\t\t{\n\t\t\t\"é\": 2\n\t\t}\n\t]\n}");
  EXPECT_EQ(render("{{ x | tojson(indent=2, separators=(';', '=')) }}", R"({"x": {"b": 1}})"),
            "{\n  \"b\"=1\n}");
  EXPECT_EQ(render("{{ [1] | tojson(indent=-2) }}"), "[\n1\n]");
  EXPECT_EQ(render("{{ ['\\x7f', '\\U0001F600'] | tojson(ensure_ascii=true) }}"),
            R"(["\u007f", "\ud83d\ude00"])");
  EXPECT_EQ(render("{{ [1.0e308 * 10, -1.0e308 * 10] | tojson }}"), "[Infinity, -Infinity]");
  EXPECT_TRUE(test::throws_error([] { render("{{ [1] | tojson(foo=1) }}"); },
                                 ErrorCategory::invalid_argument,
                                 "tojson() has no argument 'foo' (legal: ensure_ascii, indent, "
                                 "separators, sort_keys)"));
}

TEST(ChatTemplate, DictsortOrdersPairsAsJinja) {
  const std::string d = R"({"d": {"b": 1, "A": 2, "a": 3}})";
  EXPECT_EQ(render("{% for k, v in d | dictsort %}{{ k }}{{ v }}{% endfor %}", d), "A2a3b1");
  EXPECT_EQ(render("{% for k, v in d | dictsort(true) %}{{ k }}{{ v }}{% endfor %}", d), "A2a3b1");
  EXPECT_EQ(
      render("{% for k, v in d | dictsort(by='value', reverse=true) %}{{ k }}{% endfor %}", d),
      "aAb");
  EXPECT_TRUE(test::throws_error([] { render("{{ {'b': 1, 'a': 'x'} | dictsort(by='value') }}"); },
                                 ErrorCategory::invalid_argument,
                                 "'|dictsort' cannot order a string and a integer"));
}

// DeepSeek-V3.1's template keeps what follows the first </think> with split('</think>', 1).
TEST(ChatTemplate, StringMethodsTakePythonsArguments) {
  EXPECT_EQ(render("{{ 'a</t>b</t>c'.split('</t>', 1)[1] }}|{{ 'a b  c '.split(None, 1)[1] }}|"
                   "{{ ' a b  c '.split(maxsplit=1)[1] }}|{{ 'a,b,c'.split(',', 0)[0] }}|"
                   "{{ 'a b'.split(sep=' ') | length }}"),
            "b</t>c|b  c |b  c |a,b,c|2");
  EXPECT_EQ(render("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'aaa' | replace('a', 'b', 1) }}"),
            "bba baa");
  EXPECT_EQ(render("{{ 'abc'.startswith(('x', 'a')) }} {{ 'abc'.endswith(('x', 'y')) }}"),
            "True False");
  // Offsets and counts in characters, as Python's str has them.
  EXPECT_EQ(render("{{ '\xe6\xb7\xb1\xe5\xba\xa6x'.find('x') }} {{ 'abc'.count('') }}"), "2 4");
  EXPECT_TRUE(test::throws_error([] { render("{{ 'abc'.find('b', 1) }}"); },
                                 ErrorCategory::invalid_argument,
                                 "find() takes at most 1 arguments here, not 2"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 'abc'.split(foo=1) }}"); },
                                 ErrorCategory::invalid_argument, "split() has no argument 'foo'"));
}

TEST(ChatTemplate, StringLiteralsTakePythonsEscapes) {
  EXPECT_EQ(render("{{ '\\x41\\u00e9\\U0001F600\\a' }}"), "A\xc3\xa9\xf0\x9f\x98\x80\a");
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{{ '\\x4' }}"); },
                                 ErrorCategory::invalid_argument, "'\\x' needs 2 hex digits"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{{ '\\ud800' }}"); },
                                 ErrorCategory::invalid_argument, "not a Unicode scalar value"));
}

// Case and whitespace by Python's Unicode rules (the expected texts are Python 3.11's, with
// Jinja2 3.1's `title` filter): full mappings, titlecase digraphs, the final sigma, spaces past
// ASCII; Jinja's `title` filter is not str.title().
TEST(ChatTemplate, CaseAndWhitespaceFollowPythonsUnicodeRules) {
  const std::string greek =
      "Stra\u00dfe \u01c5emal \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 "
      "\u03a3\u0391\u03a3' \u0130 \ufb01";
  const auto with = [](const std::string& t, const std::string& s) {
    return ChatTemplate(t).render(json{{"s", s}}.dump());
  };
  EXPECT_EQ(with("{{ s.upper() }}", greek),
            "STRASSE \u01c4EMAL \u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 "
            "\u03a3\u0391\u03a3' \u0130 FI");
  EXPECT_EQ(with("{{ s|lower }}", greek),
            "stra\u00dfe \u01c6emal \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c2 "
            "\u03c3\u03b1\u03c2' i\u0307 \ufb01");
  EXPECT_EQ(with("{{ s.title() }}", greek),
            "Stra\u00dfe \u01c5emal \u039f\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c2 "
            "\u03a3\u03b1\u03c2' \u0130 Fi");
  EXPECT_EQ(with("{{ s|capitalize }}", greek),
            "Stra\u00dfe \u01c6emal \u03bf\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c2 "
            "\u03c3\u03b1\u03c2' i\u0307 \ufb01");
  EXPECT_EQ(with("{{ s|title }}", greek),
            "Stra\u00dfe \u01c4emal \u039f\u03b4\u03c5\u03c3\u03c3\u03b5\u03c5\u03c2 "
            "\u03a3\u03b1\u03c2' \u0130 FI");
  EXPECT_EQ(with("{{ s.title() }}|{{ s|title }}", "it's unit_name x-ray(y)"),
            "It'S Unit_Name X-Ray(Y)|It's Unit_name X-Ray(Y)");
  const std::string spaced = "\u00a0 a\u3000b \u2028";
  EXPECT_EQ(with("{{ s.split()|tojson }}{{ s.strip()|tojson }}{{ s|trim|tojson }}", spaced),
            "[\"a\", \"b\"]\"a\u3000b\"\"a\u3000b\"");
  // Characters to strip are characters, not bytes: U+00E9 and U+00E8 share their first byte.
  EXPECT_EQ(with("{{ s.strip('\u00e9') }}", "\u00e9\u00e8\u00e9"), "\u00e8");
}

// Filters, methods and statements of Jinja past the common core; each expected text is what
// Python's Jinja2 renders.
TEST(ChatTemplate, MoreFiltersMethodsAndBlockSetRenderAsJinja) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ 'a\nb'|indent(2) }}", "a\n  b"},
      {"{{ 'a\r\nb\n\nc'|indent(first=true, blank=true) }}", "    a\n    b\n    \n    c"},
      {"{{ 'a\n\nb'|indent('> ') }}", "a\n\n> b"},
      {"{{ ['b','A','a']|sort }}", "['A', 'a', 'b']"},
      {"{{ ['b','A','a']|sort(case_sensitive=true, reverse=true) }}", "['b', 'a', 'A']"},
      {"{{ ['b','A','a']|unique|list }}", "['b', 'A']"},
      {"{{ [[2, 'b'], [1, 'a']]|sort(attribute='0,1') }}", "[[1, 'a'], [2, 'b']]"},
      {"{{ [{'a': 2}, {'a': 1}]|sort(attribute='a')|map(attribute='a')|list }}", "[1, 2]"},
      {"{{ [1,2]|sum }} {{ [1,2.5]|sum }} {{ [{'n': 2}]|sum(attribute='n', start=1) }}", "3 3.5 3"},
      {"{{ ['b','C']|max }} {{ ['b','C']|max(case_sensitive=true) }} {{ []|max }}|", "C b |"},
      {"{{ -3|abs }} {{ 1 - 2|abs }} {{ -[1, 2][0] }}", "3 -1 -1"},
      {"{{ 2.5|round }} {{ 0.125|round(2) }} {{ 1.005|round(2) }} {{ 2.675|round(2) }}",
       "2.0 0.12 1.0 2.67"},
      {"{{ 2.5|round(method='ceil') }} {{ 7|round }} {{ (5/7)|round(1, 'floor') }}", "3.0 7 0.7"},
      {"{{ ' 1_000 '|int }} {{ '3.9e2'|int }} {{ 'x'|int(7) }} {{ '1_'|int }} {{ 'nan'|int }}",
       "1000 390 7 0 0"},
      {"{{ '1e3'|float }} {{ '-Infinity'|float }} {{ '.5'|float }} {{ '1e'|float }}",
       "1000.0 -inf 0.5 0.0"},
      {"{% set x %}a{{ 1 }}b{% endset %}{{ x }}{{ x|length }}", "a1b3"},
      {"{{ ', '.join(['a','b']) }} {{ '-'.join('xy') }}", "a, b x-y"},
      {"{{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b'.rsplit(none, 1) }} {{ 'a  b '.rsplit() }}",
       "['a,b', 'c'] ['  a', 'b'] ['a', 'b']"},
      {"{{ 'abc'.removeprefix('a') }} {{ 'abc'.removesuffix('bc') }} {{ 'abc'.rfind('c') }}",
       "bc a 2"},
      {"{{ 'x\ny\r\n\nz'.splitlines() }} {{ 'x\ny'.splitlines(true) }}",
       "['x', 'y', '', 'z'] ['x\\n', 'y']"},
  };
  for (const auto& [tmpl, want] : cases) EXPECT_EQ(render(tmpl), want) << tmpl;
  // Jinja catches int()'s ValueError, not its OverflowError.
  EXPECT_TRUE(test::throws_error([] { render("{{ 'inf'|int(5) }}"); },
                                 ErrorCategory::invalid_argument, "'|int' of an infinite float"));
  EXPECT_TRUE(test::throws_error([] { render("{{ [[1], [1]]|unique|list }}"); },
                                 ErrorCategory::invalid_argument, "not hashable"));
  EXPECT_TRUE(test::throws_error([] { render("{{ [1, 'a']|sort }}"); },
                                 ErrorCategory::invalid_argument,
                                 "'|sort' cannot order a string and a integer"));
  EXPECT_TRUE(test::throws_error([] { render("{{ ['a']|sum }}"); }, ErrorCategory::invalid_argument,
                                 "'|sum' adds numbers"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 1.5|round(-1) }}"); },
                                 ErrorCategory::invalid_argument, "(legal: 0-22)"));
  EXPECT_TRUE(test::throws_error([] { render("{{ [1]|sort(key=1) }}"); },
                                 ErrorCategory::invalid_argument,
                                 "'|sort' has no argument 'key' (legal: reverse, case_sensitive, "
                                 "attribute)"));
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("{% set x %}a"); },
                                 ErrorCategory::invalid_argument, "'{% endset %}' is missing"));
  // The local date, as datetime.now().strftime writes it.
  const std::string year = render("{{ strftime_now('%Y') }}|{{ strftime_now('100%%') }}");
  EXPECT_EQ(year.size(), 9u);
  EXPECT_EQ(year.substr(4), "|100%");
  // Longer than a first guess at the buffer (strftime's 0 means "too small" there).
  std::string many;
  for (int k = 0; k < 40; ++k) many += "%c";
  const std::size_t one = render("{{ strftime_now('%c') }}").size();
  EXPECT_EQ(render("{{ strftime_now('" + many + "') }}").size(), 40 * one);
  EXPECT_GT(40 * one, 256u);
}

// Tuples, the remaining tests, loop.cycle and loop.changed, and repr's escapes; each expected
// text is what Python's Jinja2 renders.
TEST(ChatTemplate, TuplesTestsAndLoopHelpersRenderAsJinja) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{{ (1, 2) }}{{ (1,) }}{{ () }}{{ (1, 2) == [1, 2] }}{{ (1, 2)[1:] }}{{ (1,) + (2,) }}",
       "(1, 2)(1,)()False(2,)(1, 2)"},
      {"{{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'a': 1}.items()|list }}",
       "[('b', 1), ('a', 2)] [('a', 1)]"},
      {"{% macro m(a) %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 3, x=5) }}{{ m(1) }}",
       "(3,){'x': 5}(){}"},
      {"{% set t = 1, 'a' %}{{ t }}{{ t|tojson }}{{ t|list }}{{ [(1, 'a'), (1, 'a')]|unique|list "
       "}}",
       "(1, 'a')[1, \"a\"][1, 'a'][(1, 'a')]"},
      {"{{ 6 is divisibleby 3 }}{{ 7.5 is divisibleby 2.5 }}{{ 2 is in [1, 2] }}{{ 'a' is in 'cat' "
       "}}"
       "{{ none is sameas none }}",
       "TrueTrueTrueTrueTrue"},
      {"{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 2 is lt 1 }}{{ 'a' is le 'b' }}{{ [1, 2, 3]|select('gt', "
       "1)|list }}{{ [1, 2, 3]|reject('in', [1, 3])|list }}",
       "TrueTrueFalseTrue[2, 3][2]"},
      {"{% for x in [1, 1, 2] %}{{ loop.cycle('a', 'b') }}{{ loop.changed(x) }}{{ loop.depth }}"
       "{% endfor %}",
       "aTrue1bFalse1aTrue1"},
      {"{{ [\"it's\", 'a\"b', 'x\\\\y', '\u3000\x85\u200b\U000e0001\t\x7f\u00e9'] }}",
       "[\"it's\", 'a\"b', 'x\\\\y', '\\u3000\\x85\\u200b\\U000e0001\\t\\x7f\u00e9']"},
  };
  for (const auto& [tmpl, want] : cases) EXPECT_EQ(render(tmpl), want) << tmpl;
  // Found by rendering random expressions with both: Python's number rules, Jinja's undefined
  // for what cannot be indexed, its sequence and iterable tests, list methods and ordering.
  const std::vector<std::pair<std::string, std::string>> more = {
      {"{{ true is number }}{{ 2.5 is odd }}{{ 3.0 is odd }}{{ -3 is odd }}{{ true is odd }}"
       "{{ -4.0 is even }}",
       "TrueFalseTrueTrueTrueTrue"},
      {"{{ true[0] }}|{{ 'ab'.foo }}|{{ 'ab'['k'] }}|", "|||"},
      {"{{ 'ab' * 2 }}{{ 2 * 'ab' }}{{ true * 'x' }}{{ [1] * 2 }}{{ (1,) * 2 }}{{ 0 * [1] }}"
       "{{ -1 * 'a' }}|",
       "ababababx[1, 1](1, 1)[]|"},
      {"{{ x is sequence }}{{ x is iterable }}{{ x is callable }}{{ {} is sequence }}"
       "{{ 1 is iterable }}{{ none is sequence }}",
       "TrueTrueTrueTrueFalseFalse"},
      {"{{ [1, 2, 1].count(1) }}{{ ['a', 'b'].index('b') }}{{ ['b', 'a'] >= ['b', 'a'] }}"
       "{{ [1] < [1, 0] }}{{ (2,) > (1, 5) }}",
       "21TrueTrueTrue"},
      {"{{ u|length }}{{ none|map('upper')|list }}{{ 0|select|list }}{{ ''|reject|list }}"
       "{{ 1 in u }}{{ (1,) in {'a': 1} }}",
       "0[][][]FalseFalse"},
      // Python's float repr: positional from 1e-4 up to 1e16, an exponent outside.
      {"{{ 0.0004 }} {{ 1e16 }} {{ 1e15 }} {{ 0.00001 }} {{ [0.0004]|tojson }} {{ 2 ** -1 }}",
       "0.0004 1e+16 1000000000000000.0 1e-05 [0.0004] 0.5"},
  };
  for (const auto& [tmpl, want] : more) EXPECT_EQ(render(tmpl), want) << tmpl;
  // What Python or Jinja raises on, raised here too.
  for (const auto& bad : std::vector<std::pair<std::string, std::string>>{
           {"{{ 0.0 ** -1 }}", "0 raised to a negative power"},
           {"{{ (-8) ** 0.5 }}", "(a complex number)"},
           {"{{ 10.0 ** 400 }}", "past the largest float"},
           {"{{ u|tojson }}", "tojson() of an undefined value"},
           {"{{ 'a' in none }}", "'in' a none"},
           {"{{ [1] in {'a': 1} }}", "(not hashable)"},
           {"{{ 'ab'|upper[0] }}", "'[' after a filter"},
           {"{{ none|list }}", "'|list' on a none"},
           {"{{ u|int }}", "'|int' of an undefined value"},
           {"{{ 'ab'|items|list }}", "'|items' of a string, not a mapping"}})
    EXPECT_TRUE(test::throws_error([&] { render(bad.first); }, ErrorCategory::invalid_argument,
                                   bad.second))
        << bad.first;
  EXPECT_TRUE(test::throws_error([] { render("{{ 'ab'.isdigit() }}"); },
                                 ErrorCategory::invalid_argument,
                                 "strings have no method 'isdigit' here"));
  EXPECT_TRUE(test::throws_error([] { render("{{ ['a'].index('z') }}"); },
                                 ErrorCategory::invalid_argument, "'z' is not in the list"));
  // A slice is Python's own subscript in Jinja (an index goes through its getitem): it raises.
  EXPECT_TRUE(test::throws_error([] { render("{{ b[::-1] }}", R"({"b": true})"); },
                                 ErrorCategory::invalid_argument, "cannot slice a boolean"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 'x'|title.count('a') }}"); },
                                 ErrorCategory::invalid_argument,
                                 "the filter '|title.count' is not supported"));
  EXPECT_TRUE(test::throws_error([] { render("{{ {}|indent }}"); }, ErrorCategory::invalid_argument,
                                 "'|indent' of a dict"));
  EXPECT_TRUE(test::throws_error([] { render("{{ [''] * 1000000 }}"); },
                                 ErrorCategory::invalid_argument, "a list repeated past"));
  EXPECT_TRUE(test::throws_error([] { render("{{ (1, 2) + [3] }}"); },
                                 ErrorCategory::invalid_argument, "between a tuple and a list"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 1 is divisibleby 0 }}"); },
                                 ErrorCategory::invalid_argument, "'is divisibleby' 0"));
  EXPECT_TRUE(test::throws_error([] { render("{% for x in [1] %}{{ loop.cycle() }}{% endfor %}"); },
                                 ErrorCategory::invalid_argument, "loop.cycle() needs values"));
}

// vLLM's detection of the content format, on the shapes of the published templates.
TEST(ChatTemplate, ReadsContentPartsWhereALoopGoesOverAMessagesContent) {
  const auto parts = [](const std::string& t) { return ChatTemplate(t).reads_content_parts(); };
  // Kimi K2's: a loop over message['content'] of a loop over messages.
  EXPECT_TRUE(
      parts("{% for message in messages %}{% if message['content'] is string %}"
            "{{ message['content'] }}{% else %}{% for part in message['content'] %}"
            "{{ part['text'] }}{% endfor %}{% endif %}{% endfor %}"));
  // Through a variable set from the messages, an attribute, a filter; or a loop over `content`.
  EXPECT_TRUE(
      parts("{% set rest = messages[1:] %}{% set turns = rest %}{% for m in turns %}"
            "{% for p in m.content | list %}{{ p.text }}{% endfor %}{% endfor %}"));
  EXPECT_TRUE(
      parts("{% for m in messages %}{% set content = m.content %}"
            "{% for p in content %}{{ p }}{% endfor %}{% endfor %}"));
  // DeepSeek's (content written as a string), and a macro looping over a variable of another
  // name (Kimi K2 Thinking's): strings.
  EXPECT_FALSE(parts("{% for message in messages %}{{ message['content'] }}{% endfor %}"));
  EXPECT_FALSE(
      parts("{% macro body(msg) %}{% set c = msg.get('content') %}{% for p in c %}"
            "{{ p.text }}{% endfor %}{% endmacro %}"
            "{% for message in messages %}{{ body(message) }}{% endfor %}"));
  EXPECT_FALSE(parts("{% for m in other %}{% for p in m.content %}{% endfor %}{% endfor %}"));
}

TEST(ChatTemplate, OpenAIMessagesTakeTheFormTheTemplateReads) {
  const std::string as_string = "{% for m in messages %}{{ m.content }}{% endfor %}";
  const std::string as_parts =
      "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}";
  const std::string msgs =
      R"([{"role": "user", "content": [{"type": "text", "text": "a", "x": 1},)"
      R"( {"type": "text", "text": "b"}]}, {"role": "tool", "content": [{"type": "text",)"
      R"( "text": "c"}, {"type": "text", "text": "d"}]}, {"role": "assistant", "content": null},)"
      R"( {"role": "system"}])";
  EXPECT_EQ(openai_chat_messages(msgs, as_string),
            R"([{"role":"user","content":"a\nb"},{"role":"tool","content":"c\nd"},)"
            R"({"role":"assistant","content":null},{"role":"system"}])");
  EXPECT_EQ(openai_chat_messages(msgs, as_parts),
            R"([{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},)"
            R"({"role":"tool","content":"c\nd"},{"role":"assistant","content":null},)"
            R"({"role":"system"}])");
  const auto refuses = [&](const std::string& m, const std::string& words) {
    return test::throws_error([&] { openai_chat_messages(m, as_string); },
                              ErrorCategory::invalid_argument, words);
  };
  EXPECT_TRUE(refuses(R"({"role": "user"})", "messages must be a list of messages"));
  EXPECT_TRUE(refuses(R"([{"role": "user"}, {"content": "x"}])",
                      "messages[1] must be an object with a string 'role'"));
  EXPECT_TRUE(refuses(R"([{"role": "user", "content": 3}])",
                      "messages[0].content must be a string, null or a list of text parts"));
  EXPECT_TRUE(refuses(R"([{"role": "user", "content": [{"type": "text", "text": "a"},)"
                      R"( {"type": "input_audio", "input_audio": {}}]}])",
                      "messages[0].content[1] is a part of type 'input_audio': this engine reads "
                      "text only"));
  EXPECT_TRUE(refuses(R"([{"role": "user", "content": ["a"]}])",
                      R"(messages[0].content[0] must be {"type": "text", "text": "..."})"));
}

// Which templates need a tool call's arguments as a mapping, on the shapes of published ones.
TEST(ChatTemplate, ReadsToolArgumentsAsAMappingOnlyWithoutATypeTest) {
  const auto mapping = [](const std::string& t) {
    return ChatTemplate(t).reads_tool_arguments_as_mapping();
  };
  // vLLM's MiniCPM3 template: the call replaced by its function, then `arguments|items`.
  EXPECT_TRUE(
      mapping("{% for m in messages %}{% for tool_call in m.tool_calls %}"
              "{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}"
              "{% endif %}{% for k, v in tool_call.arguments|items %}{{ k }}={{ v|tojson }}"
              "{% endfor %}{% endfor %}{% endfor %}"));
  // Qwen2.5's: `tojson` with no test first; a dict method, a subscript, a loop, through an alias,
  // a default, inside a macro or a call block.
  EXPECT_TRUE(
      mapping("{% for c in m.tool_calls %}{{ c.function.arguments | tojson }}{% endfor %}"));
  EXPECT_TRUE(mapping("{{ c['function']['arguments'].items() | list }}"));
  EXPECT_TRUE(mapping("{{ c.function.arguments['city'] }}"));
  EXPECT_TRUE(mapping("{% for k in c.function.arguments %}{{ k }}{% endfor %}"));
  EXPECT_TRUE(mapping("{% set a = c.arguments %}{% set b = a %}{{ b|dictsort }}"));
  EXPECT_TRUE(mapping("{{ (c.arguments | default({})).keys() | list }}"));
  EXPECT_TRUE(mapping("{% macro f(c) %}{{ c.arguments.get('x') }}{% endmacro %}"));
  EXPECT_TRUE(
      mapping("{% macro show(args, n=0) %}{{ args|tojson }}{% endmacro %}"
              "{{ show(c.function.arguments) }}"));
  EXPECT_TRUE(
      mapping("{% macro show(n, args) %}{{ args|items|list }}{% endmacro %}"
              "{{ show(1, args=c.arguments) }}"));
  EXPECT_FALSE(
      mapping("{% macro show(args) %}{{ args|tojson }}{% endmacro %}{{ show(c.name) }}"
              "{{ c.arguments }}"));
  EXPECT_TRUE(
      mapping("{% macro g() %}{{ caller() }}{% endmacro %}"
              "{% call g() %}{{ c.arguments|items|list }}{% endcall %}"));
  // DeepSeek's (concatenated), Kimi K2's and Qwen3's (a type test first), a template that never
  // reads them, and a mapping use of something else: the string.
  EXPECT_FALSE(mapping("{{ '```json\\n' + tool['function']['arguments'] + '\\n```' }}"));
  EXPECT_FALSE(
      mapping("{% if c['function']['arguments'] is string %}{{ c['function']['arguments'] }}"
              "{% else %}{{ c['function']['arguments'] | tojson }}{% endif %}"));
  EXPECT_FALSE(
      mapping("{% if c.arguments is mapping %}{{ c.arguments|tojson }}{% else %}"
              "{{ c.arguments }}{% endif %}"));
  EXPECT_FALSE(mapping("{% for m in messages %}{{ m.content }}{% endfor %}"));
  EXPECT_FALSE(
      mapping("{% for t in tools %}{{ t.function.parameters|tojson }}{% endfor %}"
              "{{ c.arguments|length }}"));
}

TEST(ChatTemplate, OpenAIToolArgumentsAreParsedForAMappingTemplate) {
  const std::string as_mapping =
      "{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments|tojson }}"
      "{% endfor %}{% endfor %}";
  const std::string as_string =
      "{% for m in messages %}{% for c in m.tool_calls %}"
      "{{ c.function.arguments }}{% endfor %}{% endfor %}";
  const auto call = [](const std::string& arguments) {
    return R"({"id": "1", "type": "function", "function": {"name": "f", "arguments": )" +
           arguments + "}}";
  };
  const std::string msgs = R"([{"role": "user", "content": "hi"}, {"role": "assistant", )"
                           R"("content": null, "tool_calls": [)" +
                           call(R"("{\"city\": \"Paris\", \"days\": [1, 2]}")") + ", " +
                           call(R"("")") + ", " + call("null") + ", " + call(R"({"b": 2})") +
                           R"(]}, {"role": "tool", "content": "ok"}])";
  const auto arguments_of = [&](const std::string& out) {
    std::vector<std::string> a;
    const auto messages = nlohmann::ordered_json::parse(out);
    for (const auto& c : messages[1]["tool_calls"]) a.push_back(c["function"]["arguments"].dump());
    return a;
  };
  // Parsed (keys in their order; empty and null made {}), or left as sent (an object written as
  // its JSON text).
  EXPECT_EQ(
      arguments_of(openai_chat_messages(msgs, as_mapping)),
      (std::vector<std::string>{R"({"city":"Paris","days":[1,2]})", "{}", "{}", R"({"b":2})"}));
  EXPECT_EQ(arguments_of(openai_chat_messages(msgs, as_string)),
            (std::vector<std::string>{R"("{\"city\": \"Paris\", \"days\": [1, 2]}")", R"("")",
                                      "null", R"("{\"b\": 2}")"}));
  const auto refuses = [&](const std::string& arguments, const std::string& words) {
    const std::string m = R"([{"role": "assistant", "tool_calls": [)" + call(R"("{}")") + ", " +
                          call(arguments) + "]}]";
    return test::throws_error([&] { openai_chat_messages(m, as_mapping); },
                              ErrorCategory::invalid_argument, words);
  };
  EXPECT_TRUE(refuses(R"("{\"a\": ")",
                      "messages[0].tool_calls[1].function.arguments is not JSON "
                      "(this chat template reads a call's arguments as a "
                      "mapping)"));
  EXPECT_TRUE(refuses(R"("[1, 2]")",
                      "messages[0].tool_calls[1].function.arguments must be a JSON object, not "
                      "array"));
  EXPECT_TRUE(refuses("7",
                      "messages[0].tool_calls[1].function.arguments must be a JSON object "
                      "in a string"));
  // Arguments given as an object, for a template that reads a string: json.dumps' text of them
  // (keys in their order, non-ASCII kept); a mapping template keeps the object.
  const std::string object_arguments = R"([{"role": "assistant", "tool_calls": [)" +
                                       call(R"({"city": "Zürich", "n": [1, 2.5, null], "o": {}})") +
                                       "]}]";
  EXPECT_EQ(
      arguments_of(R"([{"role": "user"}, )" +
                   openai_chat_messages(object_arguments, as_string).substr(1)),
      std::vector<std::string>{
          nlohmann::ordered_json("{\"city\": \"Z\u00fcrich\", \"n\": [1, 2.5, null], \"o\": {}}")
              .dump()});
  EXPECT_EQ(arguments_of(R"([{"role": "user"}, )" +
                         openai_chat_messages(object_arguments, as_mapping).substr(1)),
            std::vector<std::string>{R"({"city":"Zürich","n":[1,2.5,null],"o":{}})"});
  // An empty list of calls is dropped, whatever the template reads.
  EXPECT_EQ(openai_chat_messages(R"([{"role": "assistant", "content": "a", "tool_calls": []}])",
                                 as_string),
            R"([{"role":"assistant","content":"a"}])");
  // A template that does not read them takes anything.
  EXPECT_NO_THROW(openai_chat_messages(
      R"([{"role": "assistant", "tool_calls": [)" + call(R"("{\"a\": ")") + "]}]", as_string));
}

// Found by fuzz_chat_template: numbers past 64 bits are refused naming the line, not thrown as
// std::out_of_range (or computed with undefined overflow).
TEST(ChatTemplate, NumbersPast64BitsAreRefused) {
  EXPECT_TRUE(test::throws_error([] { ChatTemplate("\n{{ 99999999999999999999 }}"); },
                                 ErrorCategory::invalid_argument,
                                 "line 2: the integer 99999999999999999999 is out of range"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 9223372036854775807 + 1 }}"); },
                                 ErrorCategory::invalid_argument, "integer overflow in '+'"));
  EXPECT_TRUE(test::throws_error([] { render("{{ 3 ** 99 }}"); }, ErrorCategory::invalid_argument,
                                 "integer overflow in '**'"));
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-1) ** 7 }} {{ 0 ** 0 }}"), "4611686018427387904 -1 1");
}

// Also found by fuzz_chat_template: strings index and slice by character (as Python's str), and
// tojson of bytes that are not UTF-8 writes U+FFFD instead of throwing.
TEST(ChatTemplate, PowersGoLeftToRightAsInJinja) {
  // Not Python's order: Jinja's parser loops over '**', and a sign binds before the power.
  EXPECT_EQ(render("{{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 2 * 3 ** 2 }}"), "64 4 18");
}

TEST(ChatTemplate, StringsAreCharactersAndTojsonNeverThrows) {
  EXPECT_EQ(
      render("{{ 'h\xc3\xa9llo'[1] }}|{{ 'h\xc3\xa9llo'[1:3] }}|{{ 'h\xc3\xa9llo' | length }}"),
      "\xc3\xa9|\xc3\xa9l|5");
  EXPECT_EQ(render("{{ x | tojson }}", "{\"x\": \"a\"}"), "\"a\"");
  EXPECT_EQ(render("{{ '\xff' | tojson }}"), "\"\xef\xbf\xbd\"");
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

TEST(SmallTokenizer, GeneratedCheckpointsTakeAndGiveText) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("dcp_small_tokenizer_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const auto& [vocab, sentencepiece] :
       {std::pair{260, false}, {320, false}, {512, false}, {288, true}, {320, true}, {512, true}}) {
    write_small_tokenizer(dir.string(), vocab, sentencepiece);
    const Tokenizer t = Tokenizer::from_dir(dir.string());
    EXPECT_LE(t.vocab_size(), vocab);
    const std::string text = "the thing is in the string, 深度 🙂";
    const std::vector<std::int32_t> ids = t.encode(text, true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids.front(), *t.bos_id());
    for (std::int32_t id : ids) EXPECT_LT(id, vocab);
    EXPECT_EQ(t.decode(ids, true), text);
    if (vocab > 300) {
      EXPECT_LT(ids.size(), text.size());  // merges shorten English
    }
    // SentencePiece-style: spaces are U+2581 in the pieces; the text keeps them.
    if (sentencepiece) {
      EXPECT_EQ(t.token_bytes(t.encode("the")[0]).front(), ' ');
      EXPECT_EQ(t.token_piece(t.encode("the")[0]).rfind("\u2581", 0), 0u);  // the piece's mark
    } else {
      EXPECT_EQ(t.token_piece(t.encode(" ")[0]), "\u0120");  // GPT-2's character for a space
    }
    EXPECT_EQ(t.token_piece(*t.bos_id()), "<s>");
    EXPECT_THROW((void)t.token_piece(t.vocab_size()), Error);
    EXPECT_EQ(t.decode(t.encode("the")), "the");
    ASSERT_TRUE(t.chat_template().has_value());
    const std::string prompt = ChatTemplate(*t.chat_template())
                                   .render(R"({"messages": [{"role": "system", "content": "S"},)"
                                           R"( {"role": "user", "content": "Hi"}],)"
                                           R"( "bos_token": "<s>", "eos_token": "</s>",)"
                                           R"( "add_generation_prompt": true})");
    EXPECT_EQ(prompt, "<s>S\n<|user|>Hi<|assistant|>");
  }
  EXPECT_TRUE(test::throws_error([&] { write_small_tokenizer(dir.string(), 259); },
                                 ErrorCategory::invalid_argument,
                                 "vocab_size = 259 must be >= 260"));
  EXPECT_TRUE(test::throws_error([&] { write_small_tokenizer(dir.string(), 287, true); },
                                 ErrorCategory::invalid_argument,
                                 "vocab_size = 287 must be >= 288"));
  fs::remove_all(dir);
}

// Kimi K2 ships its chat template as chat_template.jinja beside the tokenizer files; transformers
// takes it over tokenizer_config.json's.
TEST(SmallTokenizer, ChatTemplateJinjaBesideTheFilesIsTheTemplate) {
  namespace fs = std::filesystem;
  const fs::path dir =
      fs::temp_directory_path() / ("dcp_template_file_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  write_small_tokenizer(dir.string(), 320);
  const std::string from_config = *Tokenizer::from_dir(dir.string()).chat_template();
  const std::string own =
      "{%- macro turn(m) -%}[{{ m.role }}]{%- endmacro -%}"
      "{% for m in messages %}{{ turn(m) }}{% endfor %}";
  std::ofstream(dir / "chat_template.jinja") << own;
  const Tokenizer t = Tokenizer::from_dir(dir.string());
  ASSERT_TRUE(t.chat_template().has_value());
  EXPECT_EQ(*t.chat_template(), own);
  EXPECT_NE(from_config, own);
  EXPECT_EQ(apply_chat_template(t, R"([{"role": "user", "content": "a"}])", false), "[user]");
  fs::remove_all(dir);
}

// ---- tiktoken (Kimi's format) ----

std::string base64(const std::string& bytes) {
  static const char* const digits =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (std::size_t i = 0; i < bytes.size(); i += 3) {
    std::uint32_t n = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (i + 1 < bytes.size())
      n |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    if (i + 2 < bytes.size()) n |= static_cast<unsigned char>(bytes[i + 2]);
    out += digits[(n >> 18) & 63];
    out += digits[(n >> 12) & 63];
    out += i + 1 < bytes.size() ? digits[(n >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? digits[n & 63] : '=';
  }
  return out;
}

// Every byte at its own rank, then a few merges.
std::string small_tiktoken_model(const std::vector<std::string>& merged) {
  std::string model;
  for (int b = 0; b < 256; ++b)
    model += base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(b) + "\n";
  for (std::size_t k = 0; k < merged.size(); ++k)
    model += base64(merged[k]) + " " + std::to_string(256 + k) + "\n";
  return model;
}

TEST(Tiktoken, ClassIntersectionsBecomeLookaheads) {
  EXPECT_EQ(rewrite_class_intersections(R"([\p{L}&&[^\p{Han}]]+x)"),
            R"((?:(?=[^\p{Han}])[\p{L}])+x)");
  EXPECT_EQ(rewrite_class_intersections(R"(a[\]&]b\[c&&d\])"), R"(a[\]&]b\[c&&d\])")
      << "escaped brackets, a single & and && outside a class are left alone";
  EXPECT_TRUE(test::throws_error([] { rewrite_class_intersections("[a&&b]"); },
                                 ErrorCategory::invalid_argument, "[A&&[B]]"));
  EXPECT_TRUE(test::throws_error([] { rewrite_class_intersections("[a"); },
                                 ErrorCategory::invalid_argument, "not closed"));
}

TEST(Tiktoken, MergesByTokenRankAndKimisPatternSplitsHanFromLetters) {
  const Tokenizer tok = Tokenizer::from_tiktoken(
      small_tiktoken_model({"he", "ll", "hell", "hello", "lo", "ab", "cd"}),
      R"({"added_tokens_decoder": {"263": {"content": "[EOS]", "special": true}}, "eos_token": "[EOS]"})");
  EXPECT_EQ(tok.vocab_size(), 264);
  EXPECT_EQ(tok.eos_id(), 263);
  EXPECT_TRUE(tok.contains(263));
  EXPECT_FALSE(tok.contains(264));
  EXPECT_FALSE(tok.contains(-1));
  // A gap between ranks is no token, though below vocab_size().
  const Tokenizer gap = Tokenizer::from_tiktoken(small_tiktoken_model({}) + "YWI= 300\n");
  EXPECT_EQ(gap.vocab_size(), 301);
  EXPECT_FALSE(gap.contains(280));
  EXPECT_TRUE(gap.contains(300));
  EXPECT_EQ(tok.encode("hello"), std::vector<std::int32_t>({259}))
      << "a whole piece that is a token";
  // "hellO": lower-case letters then an upper-case one are two pieces under Kimi's pattern.
  EXPECT_EQ(tok.encode("hellO"), std::vector<std::int32_t>({258, 'O'}));
  // "hel" + "lo": the pair of lowest merged rank first ("he" 256 < "lo" 260), then what is left.
  EXPECT_EQ(tok.encode(" hello"), std::vector<std::int32_t>({' ', 259}))
      << "a leading space is its own piece in Kimi's pattern only before a non-letter";
  // Han characters split off letters on both sides: the class intersections at work.
  const std::vector<std::int32_t> joined = tok.encode("ab\xe6\xbc\xa2" "cd");
  std::vector<std::int32_t> parts = tok.encode("ab");
  for (const auto& piece : {std::string("\xe6\xbc\xa2"), std::string("cd")}) {
    const std::vector<std::int32_t> more = tok.encode(piece);
    parts.insert(parts.end(), more.begin(), more.end());
  }
  EXPECT_EQ(joined, parts);
  EXPECT_EQ(joined.front(), 261);
  EXPECT_EQ(tok.decode(tok.encode("hello[EOS] ab\xe6\xbc\xa2")), "hello[EOS] ab\xe6\xbc\xa2");
  EXPECT_EQ(tok.encode("x[EOS]"), std::vector<std::int32_t>({'x', 263}));
}

TEST(Tiktoken, RefusesAMalformedModelNamingTheLine) {
  const auto io = ErrorCategory::io;
  std::string model = small_tiktoken_model({});
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_tiktoken(model + "!!!! 300\n"); }, io,
                                 "tiktoken.model line 257"));
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_tiktoken(model + "YWI= -1\n"); }, io,
                                 "line 257"));
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_tiktoken(model + "YWI= 5\n"); }, io,
                                 "rank 5 or its token repeats"));
  const std::string no_byte_7 = model.substr(0, model.find(base64(std::string(1, '\x07'))));
  EXPECT_TRUE(
      test::throws_error([&] { Tokenizer::from_tiktoken(no_byte_7); }, io, "byte 7 has no token"));
  EXPECT_TRUE(test::throws_error(
      [&] {
        Tokenizer::from_tiktoken(model, R"({"added_tokens_decoder": {"5": {"content": "x"}}})");
      },
      io, "added token id 5 is also a tiktoken rank"));
  // One sparse rank would size the id table by it (2^29 entries): refused.
  EXPECT_TRUE(test::throws_error([&] { Tokenizer::from_tiktoken(model + "YWI= 536870912\n"); }, io,
                                 "the largest id, 536870912, is far beyond the 257 tokens"));
}

}  // namespace
}  // namespace dcp

namespace dcp {
namespace {

// A precompiled_charsmap as spm_train writes it: the trie's size, darts-clone units, then the
// replacements. Units: a node is (offset << 10) | (ends a rule << 8) | label; a rule's value unit
// has bit 31 set and the replacement's byte offset.
std::string charsmap(const std::vector<std::uint32_t>& units, const std::string& strings) {
  std::string blob;
  const auto put = [&](std::uint32_t v) {
    for (int b = 0; b < 4; ++b) blob += static_cast<char>((v >> (8 * b)) & 0xff);
  };
  put(static_cast<std::uint32_t>(4 * units.size()));
  for (std::uint32_t u : units) put(u);
  return blob + strings;
}

// Rules "a" -> "b" and "ab" -> "X Y": root (offset 1) at 0, 'a' at 1 ^ 0x61 = 96 (a rule, offset
// 1: its value at 97), 'b' at 97 ^ 0x62 = 3 (a rule, offset 1: its value at 2).
std::vector<std::uint32_t> two_rules(std::uint32_t a_offset = 1, std::uint32_t ab_value = 2) {
  std::vector<std::uint32_t> u(98, 0);
  u[0] = 1u << 10;
  u[96] = (a_offset << 10) | (1u << 8) | 0x61;
  u[97] = (1u << 31) | 0;
  u[3] = (1u << 10) | (1u << 8) | 0x62;
  u[2] = (1u << 31) | ab_value;
  return u;
}

TEST(SentencePieceNormalizer, LongestRuleFirstThenSpacesMarked) {
  const std::string strings("b\0X Y\0", 6);
  const text_internal::SentencePieceNormalizer keep(charsmap(two_rules(), strings), false);
  // "ab" takes its own rule over "a"'s; spaces (a rule's too) become U+2581, one prepended.
  EXPECT_EQ(keep.normalize("ab a  c"), "\u2581X\u2581Y\u2581b\u2581\u2581c");
  EXPECT_EQ(keep.normalize(" "), "\u2581\u2581");
  const text_internal::SentencePieceNormalizer collapse(charsmap(two_rules(), strings), true);
  EXPECT_EQ(collapse.normalize("  ab   a  c  "), "\u2581X\u2581Y\u2581b\u2581c");
  EXPECT_EQ(collapse.normalize("   "), "");
  EXPECT_EQ(collapse.normalize("\u00e9 x"), "\u2581\u00e9\u2581x");  // no rule: kept whole
  const text_internal::SentencePieceNormalizer none("", true);
  EXPECT_EQ(none.normalize(" ab  a "), "\u2581ab\u2581a");
}

TEST(SentencePieceNormalizer, RefusesAMalformedMapNamingTheFault) {
  const std::string strings("b\0X Y\0", 6);
  const auto refused = [](const std::string& blob, const std::string& why) {
    try {
      text_internal::SentencePieceNormalizer n(blob, false);
      ADD_FAILURE() << "accepted a map that should fail with: " << why;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("precompiled_charsmap is malformed: " + why),
                std::string::npos)
          << e.what();
    }
  };
  refused(std::string("\x04\0\0", 3), "shorter than its 4-byte header");
  std::string past = charsmap(two_rules(), strings);
  past[1] = 0x10;  // a trie of 0x1088 bytes instead of 0x188
  refused(past, "a trie of 4232 bytes in a map of 398");
  std::string odd = charsmap(two_rules(), strings);
  odd[0] = static_cast<char>(odd[0] + 2);
  refused(odd, "a trie of 394 bytes");
  refused(charsmap(two_rules(), std::string("b\0X Y", 5)),
          "its last replacement has no terminating NUL");
  refused(charsmap(two_rules(1, 100), strings), "a rule points at byte 100 of 6");
  refused(charsmap(two_rules(0x100), strings), "unit 96 ends a rule past the trie");
  refused(charsmap(two_rules(), std::string("b\0\xff\0", 4)),
          "the replacement at byte 2 is not valid UTF-8");
}

}  // namespace
}  // namespace dcp
