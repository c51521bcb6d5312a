#include "dcp/engine.h"

#include <algorithm>
#include <chrono>

#include "dcp/error.h"

namespace dcp {
namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::int32_t argmax(const float* x, int n) {
  return static_cast<std::int32_t>(std::max_element(x, x + n) - x);  // first maximum: deterministic
}

}  // namespace

Engine::Engine(MlaModel& model, const EngineOptions& options) : model_(model), options_(options) {
  DCP_ARG_CHECK(options.chunked_prefill_size >= 1, "--chunked-prefill-size ", options.chunked_prefill_size,
                " must be >= 1");
  DCP_ARG_CHECK(options.max_running_requests >= 1, "max_running_requests must be >= 1");
}

void Engine::submit(const RequestSpec& spec) {
  DCP_ARG_CHECK(!spec.prompt.empty(), "request ", spec.id, ": the prompt must hold >= 1 token");
  DCP_ARG_CHECK(spec.max_new_tokens >= 1, "request ", spec.id, ": --max-new-tokens ", spec.max_new_tokens,
                " must be >= 1");
  for (std::int32_t t : spec.prompt) {
    DCP_ARG_CHECK(t >= 0 && t < model_.config().vocab_size, "request ", spec.id, ": token id ", t,
                  " is outside the vocabulary [0, ", model_.config().vocab_size, ")");
  }
  for (const RequestResult& r : results_) {
    DCP_ARG_CHECK(r.id != spec.id, "request id ", spec.id, " was already submitted");
  }
  RequestResult result;
  result.id = spec.id;
  results_.push_back(result);
  waiting_.push_back({spec, results_.size() - 1, 0});
  prompt_total_ += static_cast<std::int64_t>(spec.prompt.size());
}

std::int64_t Engine::waiting() const noexcept { return static_cast<std::int64_t>(waiting_.size()); }
std::int64_t Engine::running() const noexcept { return static_cast<std::int64_t>(running_.size()); }

std::int64_t Engine::pages_for(std::int64_t tokens) const {
  const std::int64_t vp = model_.allocator().virtual_page_size();
  return (tokens + vp - 1) / vp;
}

std::int64_t Engine::reserved_pages() const {
  // Pages running requests will still take before they finish.
  std::int64_t r = 0;
  for (const Live& l : running_) {
    const std::int64_t final_len = static_cast<std::int64_t>(l.spec.prompt.size()) + l.spec.max_new_tokens;
    r += pages_for(final_len) - static_cast<std::int64_t>(model_.allocator().pages(l.spec.id).size());
  }
  return r;
}

void Engine::admit() {
  KvAllocator& alloc = model_.allocator();
  std::int64_t budget = alloc.free_pages() - reserved_pages();
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    const std::int64_t need = pages_for(static_cast<std::int64_t>(it->spec.prompt.size()) + it->spec.max_new_tokens);
    if (need > alloc.num_pages()) {  // can never fit: reject, keep serving the others
      RequestResult& r = results_[it->result];
      r.state = RequestState::rejected;
      r.error = str("needs ", it->spec.prompt.size() + it->spec.max_new_tokens, " tokens of KV; the cache holds ",
                    alloc.capacity_tokens(), " (raise --max-total-tokens)");
      it = waiting_.erase(it);
      continue;
    }
    if (need > budget || static_cast<int>(running_.size()) >= options_.max_running_requests) break;  // FIFO
    alloc.allocate(it->spec.id, 0);
    budget -= need;
    results_[it->result].state = RequestState::prefill;
    running_.push_back(std::move(*it));
    it = waiting_.erase(it);
  }
  stats_.max_queue = std::max(stats_.max_queue, static_cast<std::int64_t>(waiting_.size()));
}

void Engine::emit(Live& l, const float* logits) {
  RequestResult& r = results_[l.result];
  const int vocab = model_.config().vocab_size;
  if (options_.record_logits) r.step_logits.insert(r.step_logits.end(), logits, logits + vocab);
  r.output_tokens.push_back(argmax(logits, vocab));
}

void Engine::finish(std::size_t i) {
  model_.allocator().free(running_[i].spec.id);
  results_[running_[i].result].state = RequestState::finished;
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool Engine::run_prefill() {
  ForwardBatch batch;
  batch.mode = ForwardMode::extend;
  std::vector<std::size_t> members;
  std::int64_t budget = options_.chunked_prefill_size;
  for (std::size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Live& l = running_[i];
    if (results_[l.result].state != RequestState::prefill) continue;
    const std::int64_t left = static_cast<std::int64_t>(l.spec.prompt.size()) - l.prefilled;
    const std::int64_t chunk = std::min(left, budget);
    model_.allocator().extend(l.spec.id, chunk);  // admission reserved these pages
    batch.entries.push_back({l.spec.id, static_cast<std::int32_t>(chunk)});
    batch.tokens.insert(batch.tokens.end(), l.spec.prompt.begin() + l.prefilled,
                        l.spec.prompt.begin() + l.prefilled + chunk);
    members.push_back(i);
    budget -= chunk;
  }
  if (members.empty()) return false;
  const auto t0 = Clock::now();
  const std::vector<float> logits = model_.forward(batch);
  stats_.prefill_ms += ms_since(t0);
  const int vocab = model_.config().vocab_size;
  for (std::size_t k = 0; k < members.size(); ++k) {
    Live& l = running_[members[k]];
    l.prefilled += batch.entries[k].q_len;
    prompt_done_ += batch.entries[k].q_len;
    if (l.prefilled == static_cast<std::int64_t>(l.spec.prompt.size())) {
      emit(l, logits.data() + k * vocab);  // the prompt's last logits give the first new token
      results_[l.result].state = RequestState::decode;
    }
  }
  for (std::size_t i = running_.size(); i-- > 0;) {  // max_new_tokens == 1 ends here
    const Live& l = running_[i];
    if (results_[l.result].output_tokens.size() >= static_cast<std::size_t>(l.spec.max_new_tokens)) finish(i);
  }
  return true;
}

bool Engine::run_decode() {
  ForwardBatch batch;
  batch.mode = ForwardMode::decode;
  std::vector<std::size_t> members;
  for (std::size_t i = 0; i < running_.size(); ++i) {
    Live& l = running_[i];
    RequestResult& r = results_[l.result];
    if (r.state != RequestState::decode) continue;
    const std::size_t k = r.output_tokens.size() - 1;  // feed the last emitted token
    const std::int32_t token = k < l.spec.forced_outputs.size() ? l.spec.forced_outputs[k] : r.output_tokens[k];
    model_.allocator().extend(l.spec.id, 1);
    batch.entries.push_back({l.spec.id, 1});
    batch.tokens.push_back(token);
    members.push_back(i);
  }
  if (members.empty()) return false;
  ForwardTimings t;
  const auto t0 = Clock::now();
  const std::vector<float> logits = model_.forward(batch, &t);
  stats_.decode_step_ms.push_back(ms_since(t0));
  stats_.decode_timings.push_back(t);
  stats_.decode_tokens += static_cast<std::int64_t>(members.size());
  const int vocab = model_.config().vocab_size;
  for (std::size_t k = 0; k < members.size(); ++k) emit(running_[members[k]], logits.data() + k * vocab);
  for (std::size_t i = running_.size(); i-- > 0;) {
    const Live& l = running_[i];
    if (results_[l.result].output_tokens.size() >= static_cast<std::size_t>(l.spec.max_new_tokens)) finish(i);
  }
  return true;
}

bool Engine::step() {
  admit();
  const bool prefilled = run_prefill();
  const bool decoded = run_decode();
  ++stats_.steps;
  if (!prefilled && !decoded && running_.empty()) {
    DCP_CHECK(waiting_.empty(), internal, waiting_.size(), " requests wait but nothing runs");
    return false;
  }
  return true;
}

void Engine::run(const std::function<void(const Engine&)>& progress) {
  while (step()) {
    if (progress) progress(*this);
  }
}

}  // namespace dcp
