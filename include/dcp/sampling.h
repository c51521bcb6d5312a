// Choosing the next token from a step's logits: greedy, or a seeded draw after temperature,
// top-k, top-p and min-p truncation; the penalties and biases applied to the logits first; and
// the log-probabilities a client may ask for.
//
// A draw is a pure function of (logits, params, tokens so far, seed, step): every rank of a group
// computes the same logits and so the same token with no extra collective, and the same seed and
// request give the same text on every run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace dcp {

struct SamplingParams {
  double temperature = 0;  // 0: greedy (argmax; the first maximum on ties)
  double top_p = 1;        // (0, 1]: the smallest most-likely set whose mass reaches top_p
  int top_k = 0;           // 0: off; else only the k most likely tokens
  double min_p = 0;        // [0, 1]: drop tokens below min_p x the most likely one's probability
  std::uint64_t seed = 0;  // the draw for step s is a function of (seed, s)
  // Logit adjustments, applied before temperature and truncation (greedy chooses the maximum of
  // the adjusted logits), in vLLM's order and with its meaning:
  // logit_bias: added to its token's logit; [-100, 100] each (OpenAI's range).
  std::map<std::int32_t, double> logit_bias;
  // repetition_penalty > 0: the logit of every token of the prompt or the output so far is
  // divided by it where positive and multiplied by it where not (1: off).
  double repetition_penalty = 1;
  // [-2, 2]: subtracted once from the logit of every token the output holds so far (presence)
  // and once per occurrence (frequency); the prompt does not count.
  double presence_penalty = 0;
  double frequency_penalty = 0;
  // Masks (a masked token's logit becomes -inf): every token outside allowed_token_ids when it is
  // not empty; and the last token of each bad word whose other tokens end the output so far (a
  // one-token bad word is never chosen). Only the output counts, not the prompt.
  std::vector<std::int32_t> allowed_token_ids;
  std::vector<std::vector<std::int32_t>> bad_words;
  // Guided choice: when not empty, the output is one of these token sequences (none may begin
  // another): each step allows only the tokens that continue one of them, and the engine ends the
  // request (finish_reason stop) once the output is one. Not combined with the masks above.
  std::vector<std::vector<std::int32_t>> choices;
  // Guided regex (RegexDfa's syntax): when not empty, the output's bytes must match it whole.
  // Each step allows only the tokens whose bytes keep the output a prefix of a match (the stop
  // tokens too once it is a match), and the engine ends the request once nothing may extend the
  // match. Needs the vocabulary's bytes (EngineOptions::guide_vocabulary); not combined with
  // the masks or choices above.
  std::string regex;
  // JSON mode (OpenAI's response_format json_object): the output is one JSON object (JsonGrammar),
  // guided as a regex is. Not combined with a regex, choices or the masks.
  bool json_object = false;
  // Guided grammar (GbnfGrammar's GBNF): when not empty, the output's bytes are a whole text of
  // it, guided as a regex is. Not combined with a regex, JSON mode, choices or the masks.
  std::string grammar;
  // When not empty, the guide (choices, regex, JSON mode or grammar) holds only the output after
  // the first occurrence of this token sequence, and nothing before it: a reasoning model's
  // thinking, closed by "</think>", stays free. Needs a guide.
  std::vector<std::int32_t> guide_after;
  bool greedy() const noexcept { return temperature == 0; }
  // Whether a guide (choices, regex, JSON mode or grammar) constrains the output.
  bool guided() const noexcept {
    return !choices.empty() || !regex.empty() || json_object || !grammar.empty();
  }
  bool adjusts_logits() const noexcept {
    return !logit_bias.empty() || repetition_penalty != 1 || presence_penalty != 0 ||
           frequency_penalty != 0 || !allowed_token_ids.empty() || !bad_words.empty() ||
           !choices.empty();
  }
  // Whether `output` (its guided part) is one of `choices` (never true without choices).
  bool completes_choice(std::span<const std::int32_t> output) const;
  // Where the guided part of `output` begins: 0 without guide_after, just past its first
  // occurrence with it; nullopt while it has not occurred (nothing is guided yet).
  std::optional<std::size_t> guide_start(std::span<const std::int32_t> output) const;
};

// The first pair (i, j) of token sequences where sequence j begins with sequence i (i != j, equal
// sequences included), if any: such guided choices cannot be told apart when one is complete.
std::optional<std::pair<std::size_t, std::size_t>> prefix_pair(
    const std::vector<std::vector<std::int32_t>>& sequences);

// Throws dcp::Error(invalid_argument) naming the field and its legal range (tokens in [0, vocab)).
// `maskable` are tokens the caller may also mask (a request's stop tokens during min_tokens): p is
// refused when its masks and those could leave no token to choose.
void validate(const SamplingParams& p, int vocab, std::span<const std::int32_t> maskable = {});

// The logits the choice is made from: `logits` with p's bias, penalties and masks applied, given
// the request's prompt and the tokens it has emitted so far.
std::vector<float> adjusted_logits(const float* logits, int vocab, const SamplingParams& p,
                                   std::span<const std::int32_t> prompt,
                                   std::span<const std::int32_t> output);

struct TokenLogprob {
  std::int32_t token = 0;
  float logprob = 0;  // natural log of the unmodified softmax (temperature 1, no truncation)
};

// The chosen token's logprob and the `top` most likely alternatives (descending; ties by id).
struct StepLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;
  // The chosen token's place in that order over the whole vocabulary (1 = the most likely), as
  // vLLM reports it beside a prompt token's logprob.
  std::int64_t rank = 0;
};

// The most likely token (the first on ties): the greedy choice, and what speculative
// verification compares drafts with.
std::int32_t greedy_token(const float* logits, int vocab);

// The token chosen at generation step `step` (0 = the first new token).
std::int32_t sample_token(const float* logits, int vocab, const SamplingParams& p,
                          std::uint64_t step);

// The tokens a draw may pick, in ascending id order, with their unnormalised weights (all > 0);
// greedy keeps the argmax alone, as does a draw whose every logit is masked (validate() leaves
// that only past a request's end, where speculative drafts may look). sample_token draws from it;
// speculative sampling compares two.
struct TokenDistribution {
  std::vector<std::int32_t> tokens;
  std::vector<double> weights;
  double total = 0;  // the weights' sum
  // `token`'s probability (0 outside the kept tokens).
  double probability(std::int32_t token) const;
};
TokenDistribution token_distribution(const float* logits, int vocab, const SamplingParams& p);

// What a draw at one step uses its uniform number for. Each (seed, step, purpose) has its own
// number; `token` is the one sample_token uses.
enum class DrawPurpose : std::uint8_t { token, acceptance, replacement };
double draw_uniform(std::uint64_t seed, std::uint64_t step, DrawPurpose purpose);
// The token a uniform u in [0, 1) picks: the first whose cumulative weight passes u x total.
std::int32_t draw_token(const TokenDistribution& d, double u);

// Speculative sampling (Leviathan et al. 2023; Chen et al. 2023). At output step `step` the draft
// proposed `proposed`, drawn from `draft` with draw_uniform(seed, step, token). The target keeps it
// with probability min(1, p/q) (p from `target`, q from `draft`) and otherwise replaces it by a
// draw from max(0, p - q) renormalised, so that the token emitted is distributed as `target`
// whatever the draft. With greedy distributions (one token each) the draft is kept exactly when
// it is the target's argmax, which replaces it otherwise.
struct DraftVerdict {
  bool accepted = false;
  std::int32_t token = 0;  // the draft when accepted, else its replacement
};
DraftVerdict verify_draft(const TokenDistribution& target, const TokenDistribution& draft,
                          std::int32_t proposed, std::uint64_t seed, std::uint64_t step);

// Log-softmax of the raw logits at `token`, its rank, plus the `top` (>= 0) most likely tokens.
StepLogprobs step_logprobs(const float* logits, int vocab, std::int32_t token, int top);

// The distribution sample_token draws from, in float64 (zero outside the kept set); for tests and
// for clients that want to see it. Greedy puts all mass on the argmax.
std::vector<double> sampling_distribution(const float* logits, int vocab, const SamplingParams& p);

}  // namespace dcp
