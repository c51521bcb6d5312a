// dcp bench guide: the tokens a guided request may write next, worked out once per automaton
// state (TokenGuide::allowed, a walk of the vocabulary in byte order that shares prefixes), against
// walking every token's bytes one token at a time (the baseline), on the same states in one run.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iomanip>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/error.h"
#include "dcp/gbnf_grammar.h"
#include "dcp/json_grammar.h"
#include "dcp/json_schema.h"
#include "dcp/regex_dfa.h"
#include "dcp/text_stream.h"
#include "dcp/token_guide.h"
#include "dcp/tokenizer.h"

namespace dcp::cli {
namespace {

// A byte-level vocabulary grown as BPE grows one: every single byte, then tokens that extend an
// earlier token by a letter (so most prefixes of a word are tokens too), words with and without a
// leading space, capitalized, other words, numbers and runs of JSON punctuation, all distinct.
std::vector<std::optional<std::string>> synthetic_vocabulary(int size, std::uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<std::optional<std::string>> texts;
  std::set<std::string> seen;
  const auto add = [&](std::string t) {
    if (seen.insert(t).second) texts.emplace_back(std::move(t));
  };
  for (int b = 0; b < 256 && b < size; ++b) add(std::string(1, static_cast<char>(b)));
  const std::string letters = "etaoinshrdlcumwfgypbvkjxqz";  // by frequency in English
  std::geometric_distribution<int> letter(0.2);
  const auto draw_letter = [&] { return letters[std::min<std::size_t>(letter(gen), 25)]; };
  std::uniform_int_distribution<int> kind(0, 99), digits(1, 3), mark(0, 8);
  const std::string marks = "{}[]\":, \n";
  std::vector<std::string> words = {" ", ""};  // word tokens, grown a letter at a time
  while (static_cast<int>(texts.size()) < size) {
    const int k = kind(gen);
    std::string t;
    if (k < 45) {  // an earlier word and a letter
      std::uniform_int_distribution<std::size_t> pick(0, words.size() - 1);
      t = words[pick(gen)] + draw_letter();
      if (k < 5 && (t.size() == 1 || t[0] == ' ')) t.back() = static_cast<char>(t.back() - 32);
      if (!seen.count(t) && t.size() < 12) words.push_back(t);
    } else if (k < 90) {  // a word of its own
      t = k < 65 ? " " : "";
      for (int i = digits(gen) + digits(gen); i > 0; --i) t += draw_letter();
      if (!seen.count(t)) words.push_back(t);
    } else if (k < 96) {
      for (int i = digits(gen); i > 0; --i) t += static_cast<char>('0' + mark(gen));
    } else {
      for (int i = digits(gen); i > 0; --i) t += marks[static_cast<std::size_t>(mark(gen))];
    }
    add(std::move(t));
  }
  return texts;
}

// Longest match first over `texts` (every single byte is a token, so any text encodes).
std::vector<std::int32_t> greedy_encode(const std::vector<std::optional<std::string>>& texts,
                                        const std::string& text) {
  std::map<std::string, std::int32_t, std::less<>> ids;
  std::size_t longest = 0;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    if (!texts[i]) continue;
    ids.emplace(*texts[i], static_cast<std::int32_t>(i));
    longest = std::max(longest, texts[i]->size());
  }
  std::vector<std::int32_t> out;
  for (std::size_t at = 0; at < text.size();) {
    for (std::size_t n = std::min(longest, text.size() - at); n > 0; --n) {
      const auto it = ids.find(std::string_view(text).substr(at, n));
      if (it != ids.end()) {
        out.push_back(it->second);
        at += n;
        break;
      }
    }
  }
  return out;
}

struct GuideCase {
  std::string name;
  std::function<std::shared_ptr<const ByteGrammar>()> make;
  std::string text;  // a text of the language, whose states the rows time
};

std::vector<GuideCase> guide_cases() {
  const std::string object =
      R"({"name": "Alice Smith", "age": 31, "city": "Paris", "tags": ["admin", "ops"]})";
  const std::string schema =
      R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},)"
      R"( "city": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},)"
      R"( "required": ["name", "age", "city", "tags"]})";
  const std::string json_gbnf = R"(root ::= object
value ::= object | array | string | number | ("true" | "false" | "null")
object ::= "{" ws ( string ws ":" ws value ws ("," ws string ws ":" ws value ws)* )? "}"
array ::= "[" ws ( value ws ("," ws value ws)* )? "]"
string ::= "\"" ( [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\""
number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]+)?
ws ::= [ \t\n]{0,20}
)";
  const std::string words =
      "the quick brown fox jumps over the lazy dog while seven wizards quietly judge the boxes";
  return {
      {"regex [a-z ]{0,1000}", [] { return std::make_shared<const RegexDfa>("[a-z ]{0,1000}"); },
       words},
      {"json_object", [] { return std::make_shared<const JsonGrammar>(); }, object},
      {"json_schema",
       [schema] { return std::make_shared<const RegexDfa>(json_schema_regex(schema)); }, object},
      {"gbnf json", [json_gbnf] { return std::make_shared<const GbnfGrammar>(json_gbnf); }, object},
  };
}

// The baseline: every writable token's bytes walked from `state`, one token at a time.
std::vector<std::int32_t> scan_allowed(const ByteGrammar& g, const GuideVocabulary& vocab,
                                       std::int32_t state) {
  std::vector<std::int32_t> ids;
  for (std::int32_t t = 0; t < vocab.size(); ++t) {
    if (vocab.writable(t) && g.walk(state, vocab.bytes(t)) != ByteGrammar::kDead) ids.push_back(t);
  }
  return ids;
}

}  // namespace

void bench_guide(const GuideBenchOptions& o) {
  std::vector<std::optional<std::string>> texts;  // the synthetic vocabulary's
  std::optional<Tokenizer> tokenizer;
  std::shared_ptr<const GuideVocabulary> vocab;
  if (!o.tokenizer_path.empty()) tokenizer = Tokenizer::from_dir(o.tokenizer_path);
  if (!tokenizer) texts = synthetic_vocabulary(o.vocab_size, o.seed);
  const auto start = Clock::now();
  vocab = tokenizer ? guide_vocabulary(*tokenizer, tokenizer->vocab_size())  // as dcp serve does
                    : std::make_shared<const GuideVocabulary>(texts);
  const double vocab_ms = ms_since(start);
  std::printf(
      "allowed tokens per guide state, 1 thread: byte-ordered walk vs token-by-token scan\n");
  double bytes = 0, unshared = 0;  // a walk in byte order steps over the unshared bytes only
  for (std::size_t k = 0; k < vocab->by_bytes().size(); ++k) {
    bytes += static_cast<double>(vocab->sorted_bytes(k).size());
    unshared += static_cast<double>(vocab->sorted_bytes(k).size() - vocab->shared_prefix()[k]);
  }
  std::printf(
      "vocabulary: %s, %d ids (%zu writable, %.0f bytes, %.0f%% not shared with the\n"
      "previous token in byte order), laid out in byte order in %.1f ms\n",
      tokenizer ? o.tokenizer_path.c_str() : "synthetic", vocab->size(), vocab->by_bytes().size(),
      bytes, 100 * unshared / bytes, vocab_ms);
  std::printf(
      "first: a new automaton (states built as the walk reaches them); again: the same\n"
      "states asked of a new guide (transitions known); medians of %d runs\n",
      o.repeats);
  std::printf("shared: a regex's next request, whose sets an earlier guide kept\n");
  std::printf("%-22s %6s %6s %9s | %10s %10s %7s | %10s %10s %7s | %10s\n", "guide", "tokens",
              "states", "allowed", "first scan", "first walk", "ratio", "again scan", "again walk",
              "ratio", "shared");
  CsvFile csv(o.csv, {"guide", "vocabulary", "tokens", "states", "allowed_per_state",
                      "first_scan_ms_per_state", "first_walk_ms_per_state", "first_speedup",
                      "again_scan_ms_per_state", "again_walk_ms_per_state", "again_speedup",
                      "shared_ms_per_state"});
  for (const GuideCase& c : guide_cases()) {
    const std::vector<std::int32_t> tokens =
        tokenizer ? tokenizer->encode(c.text) : greedy_encode(texts, c.text);
    // Where the text reaches a state first (a guide keeps a state's set after). A lazily built
    // automaton numbers its states in the order it builds them, and asking for a state's tokens
    // builds others, so each run finds its states by walking the text itself.
    std::vector<std::size_t> firsts;
    {
      const auto g = c.make();
      std::int32_t s = g->start();
      std::set<std::int32_t> seen;
      for (std::size_t i = 0; i < tokens.size(); ++i) {
        if (seen.insert(s).second) firsts.push_back(i);
        s = g->walk(s, vocab->bytes(tokens[i]));
        DCP_CHECK(s != ByteGrammar::kDead, internal, "guide bench: the text of '", c.name,
                  "' left its language at its token ", i);
      }
    }
    // The state before token firsts[0], firsts[1], ... of `g`, given to `f` in order.
    const auto visit = [&](const ByteGrammar& g, const std::function<void(std::int32_t)>& f) {
      std::int32_t s = g.start();
      std::size_t i = 0;
      for (const std::size_t at : firsts) {
        for (; i < at; ++i) s = g.walk(s, vocab->bytes(tokens[i]));
        f(s);
      }
    };
    std::vector<double> first_scan, first_walk, again_scan, again_walk, shared_walk;
    double allowed = 0;
    for (int r = 0; r < o.repeats; ++r) {
      const auto scanned = c.make(), walked = c.make();
      std::vector<std::vector<std::int32_t>> by_scan;
      // Each call timed alone: the text's own walk between them and the copies are not.
      const auto time_scan = [&](const ByteGrammar& g) {
        by_scan.clear();
        double ms = 0;
        visit(g, [&](std::int32_t state) {
          const auto t0 = Clock::now();
          by_scan.push_back(scan_allowed(g, *vocab, state));
          ms += ms_since(t0);
        });
        return ms;
      };
      // share: with the sets an earlier guide of the same automaton kept (a regex's next request).
      const auto time_walk = [&](const std::shared_ptr<const ByteGrammar>& g, bool share) {
        TokenGuide guide(g, vocab, share);
        std::vector<std::vector<std::int32_t>> by_walk;
        double ms = 0;
        visit(*g, [&](std::int32_t state) {
          const auto t0 = Clock::now();
          const std::vector<std::int32_t>& a = guide.allowed(state);
          ms += ms_since(t0);
          by_walk.push_back(a);
        });
        double ids = 0;
        for (std::size_t i = 0; i < firsts.size(); ++i) {
          DCP_CHECK(by_walk[i] == by_scan[i], internal, "guide bench: '", c.name, "' before token ",
                    firsts[i], ": the walk allows ", by_walk[i].size(), " tokens, the scan ",
                    by_scan[i].size());
          ids += static_cast<double>(by_walk[i].size());
        }
        allowed = ids / static_cast<double>(firsts.size());
        return ms;
      };
      first_scan.push_back(time_scan(*scanned));
      first_walk.push_back(time_walk(walked, false));
      again_scan.push_back(time_scan(*walked));
      again_walk.push_back(time_walk(walked, false));
      if (dynamic_cast<const RegexDfa*>(walked.get())) {
        time_walk(walked, true);  // keeps the sets
        shared_walk.push_back(time_walk(walked, true));
      }
    }
    const double n = static_cast<double>(firsts.size());
    const double fs = median(first_scan) / n, fw = median(first_walk) / n;
    const double as = median(again_scan) / n, aw = median(again_walk) / n;
    // A regex's next request; none for the automata each request builds for itself.
    const std::optional<double> sw =
        shared_walk.empty() ? std::nullopt : std::optional(median(shared_walk) / n);
    const std::string shared = sw ? str(*sw) : "";
    std::printf(
        "%-22s %6zu %6zu %9.0f | %10.3f %10.3f %6.2fx | %10.3f %10.3f %6.2fx | %10s\n",
        c.name.c_str(), tokens.size(), firsts.size(), allowed, fs, fw, fs / fw, as, aw, as / aw,
        sw ? str(std::setprecision(4), std::fixed, *sw).c_str() : "-");
    std::fflush(stdout);
    csv.row({c.name, tokenizer ? o.tokenizer_path : "synthetic", str(tokens.size()),
             str(firsts.size()), str(allowed), str(fs), str(fw), str(fs / fw), str(as), str(aw),
             str(as / aw), shared});
  }
}

void add_guide_bench(CLI::App* bench) {
  auto o = std::make_shared<GuideBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "guide",
      "Allowed tokens per guided-decoding state: byte-ordered walk vs token-by-token scan");
  CLI::Option* path =
      cmd->add_option("--tokenizer-path", o->tokenizer_path,
                      "folder with tokenizer.json (or tiktoken.model) whose vocabulary to walk; "
                      "default: a synthetic byte-level vocabulary of --vocab-size ids")
          ->check(CLI::ExistingDirectory);
  cmd->add_option("--vocab-size", o->vocab_size, "ids of the synthetic vocabulary")
      ->check(CLI::Range(256, 1 << 22))
      ->excludes(path)
      ->capture_default_str();
  cmd->add_option("--repeats", o->repeats, "runs per guide (median)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the synthetic vocabulary")
      ->excludes(path)
      ->capture_default_str();
  cmd->add_option("--csv", o->csv, "write the table as CSV")->check(writable_file());
  cmd->callback([o] { bench_guide(*o); });
}

}  // namespace dcp::cli
