#include "dcp/sampling.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <utility>

#include "dcp/error.h"
#include "kernels/cpu/exp_weights.h"

namespace dcp {
namespace {

// splitmix64: a full-period mix, so (seed, step) pairs that differ in one bit draw unrelated
// numbers.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

struct Weighted {
  std::int32_t token;
  double weight;  // unnormalised probability
};

bool more_likely(const Weighted& a, const Weighted& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.token < b.token);
}

// This thread's row of exp weights: a fresh vocabulary-sized buffer per draw costs more in page
// faults than the exp itself.
std::vector<double>& exp_row(const float* logits, int vocab, float top, double inv_t) {
  thread_local std::vector<double> weights;
  weights.resize(static_cast<std::size_t>(vocab));
  exp_weights(logits, weights.size(), top, inv_t, weights.data());
  return weights;
}

// A weight's binary order of magnitude: its exponent field (weights lie in [0, 1]).
int magnitude(double weight) {
  return static_cast<int>(std::bit_cast<std::uint64_t>(weight) >> 52);
}

// Puts w's most likely tokens in order from the front, in passes (1024, then twice as many as
// before) that sort only as many as the mass needs: a whole sort of a large vocabulary cost ten
// times the rest of a draw. `in_order` are sorted already; `candidates` (the front) are heavier
// than all the others, which `more` appends when called. Returns how many reach `mass`.
std::size_t most_likely_reaching(std::vector<Weighted>& w, std::size_t in_order,
                                 std::size_t candidates, double mass, std::function<void()> more) {
  double reached = 0;
  std::size_t keep = 0;
  while (true) {
    if (in_order < candidates) {
      const std::size_t next = std::min(candidates, std::max<std::size_t>(2 * in_order, 1024));
      const auto from = w.begin() + static_cast<std::ptrdiff_t>(in_order);
      const auto to = w.begin() + static_cast<std::ptrdiff_t>(next);
      const auto end = w.begin() + static_cast<std::ptrdiff_t>(candidates);
      if (to != end) std::nth_element(from, to, end, more_likely);
      std::sort(from, to, more_likely);
      in_order = next;
    }
    while (keep < in_order && reached < mass) reached += w[keep++].weight;
    if (keep < in_order) return keep;
    if (in_order == candidates) {
      if (more) std::exchange(more, nullptr)();
      if (candidates == w.size()) return keep;
      candidates = w.size();
    }
  }
}

// The truncations' candidates: the tokens of the heaviest binary orders of magnitude that hold
// at least `count` tokens (top-k) or reach `mass_fraction` of the mass (top-p; with one order
// more, against the rounding of the orders' sums), into `w` in id order. Every other token is
// lighter than all of them, so the most likely tokens begin with these, and `rest` appends the
// others should top-p's candidates fall short. Gathered in one pass over the weights: building
// and ordering the whole vocabulary's list cost several times the rest of a draw.
struct Candidates {
  double total = 0;  // every weight, summed in id order
  std::function<void()> rest;
};

Candidates heaviest(const std::vector<double>& weights, std::size_t count, double mass_fraction,
                    std::vector<Weighted>& w) {
  std::array<double, 2048> order_mass{};
  std::array<std::size_t, 2048> order_count{};
  Candidates c;
  for (const double x : weights) {
    c.total += x;
    order_mass[static_cast<std::size_t>(magnitude(x))] += x;
    ++order_count[static_cast<std::size_t>(magnitude(x))];
  }
  double reached = 0;
  std::size_t counted = 0;
  int cut = static_cast<int>(order_mass.size()) - 1;  // ends one order below those that suffice
  while (cut > 0 && (counted < count || reached < mass_fraction * c.total)) {
    reached += order_mass[static_cast<std::size_t>(cut)];
    counted += order_count[static_cast<std::size_t>(cut--)];
  }
  if (counted >= count && mass_fraction == 0) ++cut;  // top-k: counts are exact
  w.clear();
  for (std::size_t i = 0; i < weights.size(); ++i)
    if (magnitude(weights[i]) >= cut) w.push_back({static_cast<std::int32_t>(i), weights[i]});
  c.rest = [&weights, &w, cut] {
    for (std::size_t i = 0; i < weights.size(); ++i)
      if (magnitude(weights[i]) < cut) w.push_back({static_cast<std::int32_t>(i), weights[i]});
  };
  return c;
}

// The tokens a draw may pick (into `w`, whose capacity is reused), with their unnormalised
// probabilities after temperature and the truncations (top-k, then top-p over what is left, then
// min-p).
void kept_tokens(const float* logits, int vocab, const SamplingParams& p,
                 std::vector<Weighted>& w) {
  const std::vector<double>& weights =
      exp_row(logits, vocab, logits[greedy_token(logits, vocab)], 1.0 / p.temperature);
  const bool top_k = p.top_k > 0 && p.top_k < vocab;
  if (top_k) {
    heaviest(weights, static_cast<std::size_t>(p.top_k), 0, w);
    std::partial_sort(w.begin(), w.begin() + p.top_k, w.end(), more_likely);
    w.resize(static_cast<std::size_t>(p.top_k));
    if (p.top_p < 1) {  // over the k kept, in order already
      const double total = std::accumulate(
          w.begin(), w.end(), 0.0, [](double s, const Weighted& x) { return s + x.weight; });
      w.resize(std::max<std::size_t>(
          most_likely_reaching(w, w.size(), w.size(), p.top_p * total, nullptr), 1));
    }
  } else if (p.top_p < 1) {
    Candidates c = heaviest(weights, 0, p.top_p, w);
    w.resize(std::max<std::size_t>(
        most_likely_reaching(w, 0, w.size(), p.top_p * c.total, std::move(c.rest)), 1));
  } else {
    w.resize(weights.size());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = {static_cast<std::int32_t>(i), weights[i]};
  }
  const bool sorted = top_k || p.top_p < 1;
  // A draw walks the kept tokens in id order: in likelihood order, two tokens whose logits differ
  // by a rounding (another DCP size's merge order) could trade places and the draw between them.
  if (sorted)
    std::sort(w.begin(), w.end(),
              [](const Weighted& a, const Weighted& b) { return a.token < b.token; });
  // The most likely token has weight 1 (logits were shifted by their maximum). Tokens of weight 0
  // go too (masked, or beyond exp's range), so that no rounding at the end of a draw picks one.
  const double floor = p.min_p;
  w.erase(std::remove_if(w.begin(), w.end(),
                         [&](const Weighted& x) { return !(x.weight > 0) || x.weight < floor; }),
          w.end());
}

}  // namespace

std::int32_t greedy_token(const float* logits, int vocab) {
  return static_cast<std::int32_t>(std::max_element(logits, logits + vocab) - logits);
}

void validate(const SamplingParams& p, int vocab, std::span<const std::int32_t> maskable) {
  DCP_ARG_CHECK(std::isfinite(p.temperature) && p.temperature >= 0 && p.temperature <= 100,
                "temperature = ", p.temperature, " must be in [0, 100] (0: greedy)");
  DCP_ARG_CHECK(std::isfinite(p.top_p) && p.top_p > 0 && p.top_p <= 1, "top_p = ", p.top_p,
                " must be in (0, 1]");
  DCP_ARG_CHECK(p.top_k >= 0, "top_k = ", p.top_k, " must be >= 0 (0: off)");
  DCP_ARG_CHECK(std::isfinite(p.min_p) && p.min_p >= 0 && p.min_p <= 1, "min_p = ", p.min_p,
                " must be in [0, 1]");
  DCP_ARG_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0,
                "repetition_penalty = ", p.repetition_penalty, " must be > 0 (1: off)");
  DCP_ARG_CHECK(std::isfinite(p.presence_penalty) && std::abs(p.presence_penalty) <= 2,
                "presence_penalty = ", p.presence_penalty, " must be in [-2, 2]");
  DCP_ARG_CHECK(std::isfinite(p.frequency_penalty) && std::abs(p.frequency_penalty) <= 2,
                "frequency_penalty = ", p.frequency_penalty, " must be in [-2, 2]");
  for (const auto& [token, bias] : p.logit_bias) {
    DCP_ARG_CHECK(token >= 0 && token < vocab, "logit_bias: token ", token,
                  " is outside the vocabulary [0, ", vocab, ")");
    DCP_ARG_CHECK(std::isfinite(bias) && std::abs(bias) <= 100, "logit_bias: token ", token,
                  "'s bias ", bias, " must be in [-100, 100]");
  }
  // Tokens some step may mask; a choice needs one that no step can.
  std::vector<bool> masked(static_cast<std::size_t>(vocab), !p.allowed_token_ids.empty());
  for (std::int32_t t : p.allowed_token_ids) {
    DCP_ARG_CHECK(t >= 0 && t < vocab, "allowed_token_ids: token ", t,
                  " is outside the vocabulary [0, ", vocab, ")");
    masked[static_cast<std::size_t>(t)] = false;
  }
  for (std::size_t w = 0; w < p.bad_words.size(); ++w) {
    DCP_ARG_CHECK(!p.bad_words[w].empty(), "bad_words[", w, "] is empty");
    for (std::int32_t t : p.bad_words[w]) {
      DCP_ARG_CHECK(t >= 0 && t < vocab, "bad_words[", w, "]: token ", t,
                    " is outside the vocabulary [0, ", vocab, ")");
    }
    masked[static_cast<std::size_t>(p.bad_words[w].back())] = true;
  }
  for (std::int32_t t : maskable) {
    if (t >= 0 && t < vocab) masked[static_cast<std::size_t>(t)] = true;
  }
  if (!p.choices.empty()) {
    DCP_ARG_CHECK(p.allowed_token_ids.empty() && p.bad_words.empty(),
                  "choices do not combine with allowed_token_ids or bad_words (their masks could "
                  "leave no choice to continue)");
    for (std::size_t c = 0; c < p.choices.size(); ++c) {
      DCP_ARG_CHECK(!p.choices[c].empty(), "choices[", c, "] is empty");
      for (std::int32_t t : p.choices[c]) {
        DCP_ARG_CHECK(t >= 0 && t < vocab, "choices[", c, "]: token ", t,
                      " is outside the vocabulary [0, ", vocab, ")");
        DCP_ARG_CHECK(std::find(maskable.begin(), maskable.end(), t) == maskable.end(), "choices[",
                      c, "] holds token ", t, ", a stop token that min_tokens holds back");
      }
    }
    if (const auto pair = prefix_pair(p.choices)) {
      throw Error(ErrorCategory::invalid_argument,
                  str("choices[", pair->first, "] begins choices[", pair->second,
                      "]: a reply could not tell them apart"));
    }
  }
  if (!p.guide_after.empty()) {
    DCP_ARG_CHECK(
        p.guided(),
        "guide_after needs a guide (choices, regex, json_object or grammar) to hold back");
    for (std::int32_t t : p.guide_after) {
      DCP_ARG_CHECK(t >= 0 && t < vocab, "guide_after: token ", t,
                    " is outside the vocabulary [0, ", vocab, ")");
    }
  }
  if (p.json_object) {
    DCP_ARG_CHECK(
        p.regex.empty() && p.choices.empty() && p.allowed_token_ids.empty() && p.bad_words.empty(),
        "json_object does not combine with regex, choices, allowed_token_ids or "
        "bad_words");
  }
  if (!p.regex.empty()) {
    DCP_ARG_CHECK(p.choices.empty() && p.allowed_token_ids.empty() && p.bad_words.empty(),
                  "regex does not combine with choices, allowed_token_ids or bad_words");
  }
  if (!p.grammar.empty()) {
    DCP_ARG_CHECK(p.regex.empty() && !p.json_object && p.choices.empty() &&
                      p.allowed_token_ids.empty() && p.bad_words.empty(),
                  "grammar does not combine with regex, json_object, choices, allowed_token_ids "
                  "or bad_words");
  }
  DCP_ARG_CHECK(std::find(masked.begin(), masked.end(), false) != masked.end(),
                "allowed_token_ids and bad_words (with the stop tokens held back by min_tokens) "
                "could mask every token: leave at least one token that is never masked");
}

std::vector<float> adjusted_logits(const float* logits, int vocab, const SamplingParams& p,
                                   std::span<const std::int32_t> prompt,
                                   std::span<const std::int32_t> output) {
  std::vector<float> out(logits, logits + vocab);
  for (const auto& [token, bias] : p.logit_bias)
    out[static_cast<std::size_t>(token)] += static_cast<float>(bias);
  if (p.repetition_penalty != 1) {
    std::vector<bool> seen(static_cast<std::size_t>(vocab), false);
    for (auto tokens : {prompt, output}) {
      for (std::int32_t t : tokens) seen[static_cast<std::size_t>(t)] = true;
    }
    const auto rp = static_cast<float>(p.repetition_penalty);
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (seen[i]) out[i] = out[i] > 0 ? out[i] / rp : out[i] * rp;
    }
  }
  if (p.presence_penalty != 0 || p.frequency_penalty != 0) {
    std::vector<std::int32_t> count(static_cast<std::size_t>(vocab), 0);
    for (std::int32_t t : output) ++count[static_cast<std::size_t>(t)];
    for (std::size_t i = 0; i < out.size(); ++i) {
      if (count[i] == 0) continue;
      out[i] -= static_cast<float>(p.frequency_penalty * count[i] + p.presence_penalty);
    }
  }
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  if (!p.allowed_token_ids.empty()) {
    std::vector<float> kept(out.size(), kMasked);
    for (std::int32_t t : p.allowed_token_ids)
      kept[static_cast<std::size_t>(t)] = out[static_cast<std::size_t>(t)];
    out.swap(kept);
  }
  const std::optional<std::size_t> start = p.choices.empty() ? std::nullopt : p.guide_start(output);
  if (start) {  // only the tokens that continue a choice the guided output begins
    const std::span<const std::int32_t> guided = output.subspan(*start);
    std::vector<float> kept(out.size(), kMasked);
    for (const std::vector<std::int32_t>& c : p.choices) {
      if (c.size() > guided.size() && std::equal(guided.begin(), guided.end(), c.begin())) {
        const auto t = static_cast<std::size_t>(c[guided.size()]);
        kept[t] = out[t];
      }
    }
    out.swap(kept);
  }
  for (const std::vector<std::int32_t>& word : p.bad_words) {
    const std::size_t before = word.size() - 1;  // the tokens that must end the output
    if (before <= output.size() && std::equal(word.begin(), word.end() - 1,
                                              output.end() - static_cast<std::ptrdiff_t>(before)))
      out[static_cast<std::size_t>(word.back())] = kMasked;
  }
  return out;
}

bool SamplingParams::completes_choice(std::span<const std::int32_t> output) const {
  const std::optional<std::size_t> start = choices.empty() ? std::nullopt : guide_start(output);
  if (!start) return false;
  const std::span<const std::int32_t> guided = output.subspan(*start);
  return std::any_of(choices.begin(), choices.end(), [&](const std::vector<std::int32_t>& c) {
    return std::equal(c.begin(), c.end(), guided.begin(), guided.end());
  });
}

std::optional<std::size_t> SamplingParams::guide_start(std::span<const std::int32_t> output) const {
  if (guide_after.empty()) return 0;
  const auto at = std::search(output.begin(), output.end(), guide_after.begin(), guide_after.end());
  if (at == output.end()) return std::nullopt;
  return static_cast<std::size_t>(at - output.begin()) + guide_after.size();
}

std::optional<std::pair<std::size_t, std::size_t>> prefix_pair(
    const std::vector<std::vector<std::int32_t>>& sequences) {
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    for (std::size_t j = 0; j < sequences.size(); ++j) {
      const auto& a = sequences[i];
      const auto& b = sequences[j];
      if (i != j && a.size() <= b.size() && std::equal(a.begin(), a.end(), b.begin()))
        return std::pair{i, j};
    }
  }
  return std::nullopt;
}

std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& p,
                          std::uint64_t step) {
  if (p.greedy()) return greedy_token(logits, vocab);
  return draw_token(token_distribution(logits, vocab, p),
                    draw_uniform(p.seed, step, DrawPurpose::token));
}

double TokenDistribution::probability(std::int32_t token) const {
  const auto at = std::lower_bound(tokens.begin(), tokens.end(), token);
  if (at == tokens.end() || *at != token) return 0;
  return weights[static_cast<std::size_t>(at - tokens.begin())] / total;
}

TokenDistribution token_distribution(const float* logits, int vocab, const SamplingParams& p) {
  TokenDistribution d;
  thread_local std::vector<Weighted> w;
  w.clear();
  if (!p.greedy()) kept_tokens(logits, vocab, p, w);
  // Greedy; or every logit masked, which validate() leaves only past a request's end (where a
  // speculative draft may look ahead): the first maximum alone.
  if (w.empty()) w.push_back({greedy_token(logits, vocab), 1.0});
  d.tokens.reserve(w.size());
  d.weights.reserve(w.size());
  for (const Weighted& x : w) {
    d.tokens.push_back(x.token);
    d.weights.push_back(x.weight);
    d.total += x.weight;
  }
  return d;
}

double draw_uniform(std::uint64_t seed, std::uint64_t step, DrawPurpose purpose) {
  // The token draws keep the stream they always had; each other purpose mixes its own seed.
  std::uint64_t stream = mix(seed);
  if (purpose != DrawPurpose::token) stream = mix(stream + static_cast<std::uint64_t>(purpose));
  return static_cast<double>(mix(stream ^ step) >> 11) * 0x1.0p-53;
}

std::int32_t draw_token(const TokenDistribution& d, double u) {
  const double target = u * d.total;
  double cum = 0;
  for (std::size_t i = 0; i < d.tokens.size(); ++i) {
    cum += d.weights[i];
    if (target < cum) return d.tokens[i];
  }
  return d.tokens.back();  // rounding left target at the very end
}

DraftVerdict verify_draft(const TokenDistribution& target, const TokenDistribution& draft,
                          std::int32_t proposed, std::uint64_t seed, std::uint64_t step) {
  const double p = target.probability(proposed);
  const double q = draft.probability(proposed);
  // Kept with probability min(1, p / q): q > 0, as the draft drew it.
  if (draw_uniform(seed, step, DrawPurpose::acceptance) * q < p) return {true, proposed};
  // The replacement: a draw from max(0, p - q), nonzero only where p is.
  TokenDistribution excess;
  for (std::size_t i = 0; i < target.tokens.size(); ++i) {
    const double e = target.weights[i] / target.total - draft.probability(target.tokens[i]);
    if (!(e > 0)) continue;
    excess.tokens.push_back(target.tokens[i]);
    excess.weights.push_back(e);
    excess.total += e;
  }
  // Where p and q differ only in rounding the excess may be empty: p itself then.
  const double u = draw_uniform(seed, step, DrawPurpose::replacement);
  return {false, draw_token(excess.tokens.empty() ? target : excess, u)};
}

std::vector<double> sampling_distribution(const float* logits, int vocab,
                                          const SamplingParams& p) {
  std::vector<double> out(static_cast<std::size_t>(vocab), 0.0);
  const TokenDistribution d = token_distribution(logits, vocab, p);
  for (std::size_t i = 0; i < d.tokens.size(); ++i)
    out[static_cast<std::size_t>(d.tokens[i])] = d.weights[i] / d.total;
  return out;
}

StepLogprobs step_logprobs(const float* logits, int vocab, std::int32_t token, int top) {
  DCP_ARG_CHECK(token >= 0 && token < vocab, "token ", token, " is outside [0, ", vocab, ")");
  const float m = logits[greedy_token(logits, vocab)];
  const std::vector<double>& weights = exp_row(logits, vocab, m, 1.0);
  double sums[4] = {0, 0, 0, 0};  // four chains: one serial sum waits on each add
  std::size_t i = 0;
  for (; i + 4 <= weights.size(); i += 4)
    for (std::size_t j = 0; j < 4; ++j) sums[j] += weights[i + j];
  for (; i < weights.size(); ++i) sums[0] += weights[i];
  const double lse = m + std::log((sums[0] + sums[1]) + (sums[2] + sums[3]));
  StepLogprobs out;
  out.chosen = {token, static_cast<float>(logits[token] - lse)};
  out.rank = 1;
  for (int t = 0; t < vocab; ++t)
    out.rank += logits[t] > logits[token] || (logits[t] == logits[token] && t < token);
  // The k most likely (ties by id) in one pass: a later id enters only above the k-th.
  const auto k = static_cast<std::size_t>(std::clamp(top, 0, vocab));
  const auto before = [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<std::int32_t> best;
  best.reserve(k + 1);
  float kth = -std::numeric_limits<float>::infinity();  // the k-th's logit once there are k
  for (std::int32_t t = 0; t < vocab && k > 0; ++t) {
    if (best.size() == k && !(logits[t] > kth)) continue;
    best.insert(std::upper_bound(best.begin(), best.end(), t, before), t);
    if (best.size() > k) best.pop_back();
    if (best.size() == k) kth = logits[best.back()];
  }
  for (const std::int32_t t : best) out.top.push_back({t, static_cast<float>(logits[t] - lse)});
  return out;
}

}  // namespace dcp
