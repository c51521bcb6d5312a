#include "engine/serving_wire.h"

#include "dcp/prefix_cache.h"
#include "engine/logprobs_bytes.h"

namespace dcp {

void write_spec(ByteWriter& w, const RequestSpec& r) {
  w.i64(r.id);
  w.vec(r.prompt);
  w.i64(r.max_new_tokens);
  w.f64(r.sampling.temperature);
  w.f64(r.sampling.top_p);
  w.i64(r.sampling.top_k);
  w.f64(r.sampling.min_p);
  w.i64(static_cast<std::int64_t>(r.sampling.seed));
  w.f64(r.sampling.repetition_penalty);
  w.f64(r.sampling.presence_penalty);
  w.f64(r.sampling.frequency_penalty);
  w.i64(static_cast<std::int64_t>(r.sampling.logit_bias.size()));
  for (const auto& [token, bias] : r.sampling.logit_bias) {
    w.i64(token);
    w.f64(bias);
  }
  w.vec(r.sampling.allowed_token_ids);
  w.i64(static_cast<std::int64_t>(r.sampling.bad_words.size()));
  for (const auto& word : r.sampling.bad_words) w.vec(word);
  w.i64(static_cast<std::int64_t>(r.sampling.choices.size()));
  for (const auto& choice : r.sampling.choices) w.vec(choice);
  w.str(r.sampling.regex);
  w.i64(r.sampling.json_object ? 1 : 0);
  w.str(r.sampling.grammar);
  w.vec(r.sampling.guide_after);
  w.vec(r.stop_token_ids);
  w.i64(r.min_tokens);
  w.i64(r.logprobs);
  w.i64(r.prompt_logprobs);
  w.i64(r.prompt_logprobs_start);
}

RequestSpec read_spec(ByteReader& in) {
  RequestSpec r;
  r.id = in.i64();
  r.prompt = in.vec<std::int32_t>();
  r.max_new_tokens = static_cast<int>(in.i64());
  r.sampling.temperature = in.f64();
  r.sampling.top_p = in.f64();
  r.sampling.top_k = static_cast<int>(in.i64());
  r.sampling.min_p = in.f64();
  r.sampling.seed = static_cast<std::uint64_t>(in.i64());
  r.sampling.repetition_penalty = in.f64();
  r.sampling.presence_penalty = in.f64();
  r.sampling.frequency_penalty = in.f64();
  for (std::int64_t n = in.i64(); n > 0; --n) {
    const auto token = static_cast<std::int32_t>(in.i64());
    r.sampling.logit_bias[token] = in.f64();
  }
  r.sampling.allowed_token_ids = in.vec<std::int32_t>();
  for (std::int64_t n = in.i64(); n > 0; --n)
    r.sampling.bad_words.push_back(in.vec<std::int32_t>());
  for (std::int64_t n = in.i64(); n > 0; --n) r.sampling.choices.push_back(in.vec<std::int32_t>());
  r.sampling.regex = in.str();
  r.sampling.json_object = in.i64() != 0;
  r.sampling.grammar = in.str();
  r.sampling.guide_after = in.vec<std::int32_t>();
  r.stop_token_ids = in.vec<std::int32_t>();
  r.min_tokens = static_cast<int>(in.i64());
  r.logprobs = static_cast<int>(in.i64());
  r.prompt_logprobs = static_cast<int>(in.i64());
  r.prompt_logprobs_start = in.i64();
  return r;
}

RankLoad current_load(MlaModel& model, const Engine& engine, int page_size) {
  RankLoad load;
  for (const RequestId id : model.allocator().requests())
    load.kv_rows += model.kv_shard(0).local_length(id);
  load.kv_capacity_rows = model.allocator().num_pages() * page_size;
  load.running = engine.running();
  load.waiting = engine.waiting();
  load.spec_verifications = engine.stats().spec_verifications;
  load.spec_proposed = engine.stats().spec_proposed;
  load.spec_accepted = engine.stats().spec_accepted;
  if (const PrefixCache* cache = engine.prefix_cache()) {
    const PrefixCacheStats& s = cache->stats();
    const std::int64_t page = model.allocator().virtual_page_size();
    load.cache = {s.lookup_tokens,
                  s.hit_tokens,
                  cache->device_pages() * page,
                  cache->host_pages() * page,
                  s.pages_offloaded * page,
                  s.pages_reloaded * page,
                  s.pages_dropped * page};
  }
  return load;
}

void write_split_news(ByteWriter& w, const RequestResult& r, std::size_t from,
                      std::size_t logprobs_from, RequestState state,
                      std::int64_t cached_prompt_tokens) {
  w.i64(r.id);
  w.i64(static_cast<std::int64_t>(state));
  w.i64(static_cast<std::int64_t>(r.finish_reason));
  w.vec(std::vector<std::int32_t>(r.output_tokens.begin() + static_cast<std::ptrdiff_t>(from),
                                  r.output_tokens.end()));
  write_logprobs(w, r.logprobs, logprobs_from);
  write_logprobs(w, r.prompt_logprobs, from == 0 ? 0 : r.prompt_logprobs.size());
  w.vec(std::vector<char>(r.error.begin(), r.error.end()));
  w.i64(cached_prompt_tokens);
  w.i64(r.spec_verify_steps);
}

void write_news(ByteWriter& w, const RequestResult& r, std::size_t from) {
  write_split_news(w, r, from, from, r.state, r.cached_prompt_tokens);
}

}  // namespace dcp
