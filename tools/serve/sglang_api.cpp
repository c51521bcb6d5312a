// SGLang's native endpoints. /generate runs over the parsing and engine streams the OpenAI
// endpoints use: one prompt, or a batch (`text` or `input_ids` as a list), each answered with its
// text, output_ids and meta_info (SGLang's fields, with the logprobs when asked). Beside it: the
// model's and the server's description, and a health check that generates.
#include <algorithm>
#include <chrono>
#include <limits>

#include "dcp/version.h"
#include "serve/api_job.h"
#include "serve/openai_api.h"
#include "serve/request_fields.h"

namespace dcp::serve {
namespace {

using namespace std::chrono_literals;

// Prompts one batch may hold (as /v1/completions).
constexpr std::size_t kMaxBatch = 256;
// The fields a batch may give per prompt (a list as long as the batch) instead of once for all.
constexpr const char* kPerPrompt[] = {"sampling_params",         "return_logprob",
                                      "logprob_start_len",       "top_logprobs_num",
                                      "return_text_in_logprobs", "rid"};
// The longest id a client may give a request.
constexpr std::size_t kMaxRid = 256;

// The request bodies of a /generate body: itself, or one per prompt of a batch (its keys kept in
// the client's order: a JSON Schema's properties are read in that order).
std::vector<std::string> generate_bodies(const std::string& body, bool& batch) {
  const json b = parse_object(body);  // BadRequest on bad JSON
  const char* key = field(b, "text") ? "text" : "input_ids";
  const json* prompts = field(b, key);
  batch = prompts && prompts->is_array() &&
          (*key == 't' || (!prompts->empty() && (*prompts)[0].is_array()));
  if (!batch) return {body};
  if (prompts->empty()) bad(key, str("'", key, "' holds no prompt"));
  if (prompts->size() > kMaxBatch)
    bad(key, str("'", key, "' holds ", prompts->size(), " prompts; at most ", kMaxBatch));
  const auto all = nlohmann::ordered_json::parse(body);
  std::vector<std::string> bodies;
  for (std::size_t i = 0; i < prompts->size(); ++i) {
    nlohmann::ordered_json one = all;
    one[key] = all[key][i];
    for (const char* k : kPerPrompt) {
      if (!one.contains(k) || !one[k].is_array()) continue;
      if (one[k].size() != prompts->size())
        bad(k, str("'", k, "' lists ", one[k].size(), " values for ", prompts->size(),
                   " prompts (give one for all, or one per prompt)"));
      one[k] = all[k][i];
    }
    bodies.push_back(one.dump());
  }
  return bodies;
}

}  // namespace

void OpenAiApi::parse_sglang_fields(const json& b, Job& job) const {
  if (const json* rid = field(b, "rid")) {  // read here: the fields only /generate has
    if (!rid->is_string() || rid->get<std::string>().empty() ||
        rid->get<std::string>().size() > kMaxRid)
      bad("rid", str("'rid' must be a non-empty string of at most ", kMaxRid,
                     " bytes (a list of them for a batch)"));
    job.rid = rid->get<std::string>();
  }
  const bool wanted = boolean(b, "return_logprob").value_or(false);
  const auto start = integer(b, "logprob_start_len", -1, std::numeric_limits<std::int64_t>::max());
  const auto top = integer(b, "top_logprobs_num", 0, 20);
  const bool texts = boolean(b, "return_text_in_logprobs").value_or(false);
  if (!wanted) {  // SGLang ignores them then; here a field that would be ignored is refused
    if (start && *start >= 0)
      bad("logprob_start_len", "'logprob_start_len' needs 'return_logprob': true");
    if (top && *top > 0) bad("top_logprobs_num", "'top_logprobs_num' needs 'return_logprob': true");
    if (texts)
      bad("return_text_in_logprobs", "'return_text_in_logprobs' needs 'return_logprob': true");
    return;
  }
  if (texts) need_tokenizer_for("return_text_in_logprobs");
  const auto length = static_cast<std::int64_t>(job.request.prompt.size());
  if (start && *start > length)
    bad("logprob_start_len", str("'logprob_start_len' = ", *start, " is past the prompt's ", length,
                                 " tokens (-1: none of the prompt, 0 to ", length, ")"));
  job.top_logprobs = static_cast<int>(top.value_or(0));
  job.logprob_start = start.value_or(-1);
  job.logprob_texts = texts;
  // The engine scores the prompt from the start on (a cached prefix before it is not computed).
  if (job.logprob_start >= 0 && job.logprob_start < length) {
    job.request.prompt_logprobs = job.top_logprobs;
    job.request.prompt_logprobs_start = job.logprob_start;
  }
}

void OpenAiApi::add_sglang_logprobs(const Job& job, const Choice& c, json& meta) const {
  // Each entry: [logprob, token id, text or null]; the prompt's from logprob_start_len on (its
  // first token has none), the output's, and with top_logprobs_num the most likely tokens at each
  // (none at the prompt's first).
  const std::int64_t start = job.logprob_start;
  const auto k = static_cast<std::size_t>(std::max(job.top_logprobs, 0));
  const std::vector<std::int32_t>& prompt = job.prompts.front();
  const auto entry = [&](std::optional<float> logprob, std::int32_t token) {
    return json::array({logprob ? json(std::max(*logprob, -9999.0f)) : json(nullptr), token,
                        job.logprob_texts ? json(token_text(token)) : json(nullptr)});
  };
  const auto tops = [&](const StepLogprobs& lp) {
    json list = json::array();
    for (std::size_t i = 0; i < lp.top.size() && i < k; ++i)
      list.push_back(entry(lp.top[i].logprob, lp.top[i].token));
    return list;
  };
  json in = json::array(), in_top = json::array(), out = json::array(), out_top = json::array();
  const auto first = static_cast<std::size_t>(std::max<std::int64_t>(start, 0));
  for (std::size_t p = first; start >= 0 && p < prompt.size(); ++p) {
    if (p == 0) {
      in.push_back(entry(std::nullopt, prompt[0]));
      in_top.push_back(nullptr);
    } else if (const std::size_t i = p - std::max<std::size_t>(first, 1);
               i < c.prompt_logprobs.size()) {  // they start at the first scored position
      in.push_back(entry(c.prompt_logprobs[i].chosen.logprob, prompt[p]));
      in_top.push_back(tops(c.prompt_logprobs[i]));
    }
  }
  for (std::size_t t = 0; t < c.text.tokens().size() && t < c.logprobs.size(); ++t) {
    out.push_back(entry(c.logprobs[t].chosen.logprob, c.logprobs[t].chosen.token));
    out_top.push_back(tops(c.logprobs[t]));
  }
  meta["input_token_logprobs"] = std::move(in);
  meta["output_token_logprobs"] = std::move(out);
  if (k > 0) {
    meta["input_top_logprobs"] = std::move(in_top);
    meta["output_top_logprobs"] = std::move(out_top);
  }
}

json OpenAiApi::generate_reply(const Job& job, const Choice& c, const std::string& id) const {
  json meta = {{"id", id},
               {"prompt_tokens", job.prompts.front().size()},
               {"completion_tokens", c.text.tokens().size()},
               {"cached_tokens", c.cached_tokens}};
  meta["finish_reason"] =
      c.finished ? json{{"type", finish_text(c.reason, c.text.stopped())}} : json(nullptr);
  // SGLang's count of the target steps that verified drafts, once the request has finished.
  if (c.finished && deployment_.spec().engine.num_draft_tokens > 0)
    meta["spec_verify_ct"] = c.spec_verify_steps;
  if (job.top_logprobs >= 0) add_sglang_logprobs(job, c, meta);
  return {{"text", c.shown}, {"output_ids", c.text.tokens()}, {"meta_info", meta}};
}

Handled OpenAiApi::generate(const std::string& body, const ClientGone& gone) {
  // Each prompt is a request of its own (its own id and fields), each of its n samples a choice;
  // a batch's (or n's) replies come as a list, prompt by prompt and sample by sample, its
  // stream's events each name their place in that list.
  std::vector<Job> jobs;
  bool batch = false;
  try {
    const std::vector<std::string> bodies = generate_bodies(body, batch);
    for (std::size_t i = 0; i < bodies.size(); ++i) {
      try {
        jobs.push_back(parse(bodies[i], Kind::generate));
      } catch (const BadRequest& e) {
        if (!batch) throw;
        throw BadRequest(e.status, e.param, str("prompt ", i, ": ", e.what()));
      }
    }
  } catch (const BadRequest& e) {
    return {error(e.status, e.what(), e.param), {}};
  }
  // Each prompt's n samples (sampling_params.n), in order: sample j seeded seed + j.
  std::int64_t samples = 0;
  for (const Job& job : jobs) samples += job.n;
  if (std::optional<HttpReply> refusal = too_many_samples(samples, jobs.size(), jobs.front()))
    return {*refusal, {}};
  const bool listed = batch || samples > 1;  // a list of replies, events naming their index
  auto choices = std::make_shared<std::vector<Choice>>();
  std::vector<std::size_t> job_of;  // each choice's prompt
  std::vector<std::string> ids;     // each choice's id
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    Job& job = jobs[i];
    job.id = job.rid.empty() ? new_id("") : job.rid;
    for (int j = 0; j < job.n; ++j) {
      try {
        choices->push_back(submit_choice(job, job.prompts.front(), static_cast<std::size_t>(j)));
      } catch (const RefusedError& e) {  // the batch is withdrawn whole
        for (Choice& c : *choices) c.stream->cancel();
        return {refused(e, job), {}};
      }
      job_of.push_back(i);
      ids.push_back(job.n > 1 ? str(job.id, "-", j) : job.id);
    }
  }
  // Each request by its id, for /abort_request; an id still running refuses the request.
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    std::vector<std::weak_ptr<RequestStream>> streams;
    for (std::size_t k = 0; k < choices->size(); ++k)
      if (job_of[k] == i) streams.push_back((*choices)[k].stream);
    if (!register_id(jobs[i].id, std::move(streams))) {
      for (Choice& c : *choices) c.stream->cancel();
      return {
          error(400, str("'rid' = '", jobs[i].id, "' is the id of a request still running"), "rid"),
          {}};
    }
  }
  if (!jobs.front().stream) {
    const auto stops = [&](std::size_t i) -> const std::vector<std::int32_t>& {
      return jobs[job_of[i]].request.stop_token_ids;
    };
    if (std::optional<HttpReply> ended = wait_for_all(*choices, stops, false, gone))
      return {*ended, {}};
    json reply = json::array();
    for (std::size_t i = 0; i < choices->size(); ++i)
      reply.push_back(generate_reply(jobs[job_of[i]], (*choices)[i], ids[i]));
    return {HttpReply{200, "application/json", text_of(listed ? reply : reply.front())}, {}};
  }
  // Streamed: an event per prompt whenever it has news, each with everything so far (SGLang's
  // text, logprobs included), then data: [DONE].
  Handled h;
  h.stream = [this, jobs = std::move(jobs), choices, listed, job_of = std::move(job_of),
              ids = std::move(ids)](const ChunkWriter& write) {
    const auto abandon = [&] {  // the client went away: free its KV now
      for (Choice& c : *choices) c.stream->cancel();
    };
    std::vector<std::size_t> sent(choices->size(), 0);
    std::vector<bool> closed(choices->size(), false);
    std::size_t open = choices->size();
    while (open > 0) {
      for (std::size_t i = 0; i < choices->size(); ++i) {
        Choice& c = (*choices)[i];
        if (closed[i]) continue;
        const std::string text = pull_news(c, jobs[job_of[i]].request.stop_token_ids,
                                           choices->size() == 1 ? 1000ms : 5ms, false);
        if (text.empty() && !c.finished && c.text.tokens().size() == sent[i]) continue;
        if (!c.error.empty()) {
          write(sse({{"error", json::parse(error(500, c.error).body)["error"]}}));
          return abandon();
        }
        json event = generate_reply(jobs[job_of[i]], c, ids[i]);
        if (listed) event["index"] = i;
        sent[i] = c.text.tokens().size();
        if (!write(sse(event))) return abandon();
        if (c.finished) {
          closed[i] = true;
          --open;
        }
      }
    }
    write("data: [DONE]\n\n");
  };
  return h;
}

HttpReply OpenAiApi::model_info() const {
  const auto path_or_null = [](const std::string& p) {
    return p.empty() ? json(nullptr) : json(p);
  };
  // The sampling defaults of a request that leaves them out (generation_config.json's).
  json preferred = json::object();
  const SamplingDefaults& d = options_.sampling_defaults;
  if (d.temperature) preferred["temperature"] = *d.temperature;
  if (d.top_p) preferred["top_p"] = *d.top_p;
  if (d.top_k) preferred["top_k"] = *d.top_k;
  if (d.min_p) preferred["min_p"] = *d.min_p;
  if (d.repetition_penalty) preferred["repetition_penalty"] = *d.repetition_penalty;
  const json info = {
      {"model_path", options_.model_path.empty() ? options_.model_name : options_.model_path},
      {"tokenizer_path", path_or_null(options_.tokenizer_path)},
      {"served_model_name", options_.model_name},
      {"is_generation", true},
      {"preferred_sampling_params", preferred.empty() ? json(nullptr) : preferred}};
  return {200, "application/json", text_of(info)};
}

HttpReply OpenAiApi::server_info() const {
  const DeploymentSpec& spec = deployment_.spec();
  const ParallelConfig& p = spec.parallel;
  const EngineOptions& e = deployment_.engine_options();
  const ServeMetrics m = deployment_.metrics();
  json info = {
      {"model_path", options_.model_path.empty() ? options_.model_name : options_.model_path},
      {"served_model_name", options_.model_name},
      {"version", kVersion},
      {"tp_size", p.tp_size},
      {"dp_size", p.dp_size},
      {"enable_dp_attention", p.enable_dp_attention},
      {"dcp_size", p.dcp_size},
      {"ep_size", p.ep_size},
      {"page_size", spec.model_options.page_size},
      {"kv_cache_dtype", std::string(to_string(spec.model_options.kv_dtype))},
      {"context_length", deployment_.context_tokens()},
      {"chunked_prefill_size", e.chunked_prefill_size},
      {"max_running_requests", e.max_running_requests},
      {"max_queued_requests", deployment_.max_queued_requests()},
      {"disable_radix_cache", !e.enable_prefix_cache},
      {"speculative_num_draft_tokens", e.num_draft_tokens},
      // SGLang's names: prompt lookup, or a draft model of its own.
      {"speculative_algorithm", e.num_draft_tokens == 0 ? json(nullptr)
                                : e.ngram_draft > 0     ? json("NGRAM")
                                                        : json("STANDALONE")},
      {"disaggregation_prefill_dcp_size", deployment_.options().prefill_dcp_size},
      // What the scheduler holds now, over every replica.
      {"internal_states",
       json::array({{{"num_running_reqs", m.running}, {"num_queued_reqs", m.queued}}})}};
  // Known once the ranks have loaded.
  if (deployment_.ready()) info["max_total_num_tokens"] = deployment_.kv_capacity_tokens();
  return {200, "application/json", text_of(info)};
}

HttpReply OpenAiApi::health_generate(std::chrono::milliseconds timeout) {
  if (!deployment_.ready()) return error(503, "the model is loading");
  ServeRequest probe;
  probe.prompt = {0};
  probe.max_new_tokens = 1;
  std::shared_ptr<RequestStream> stream;
  try {
    stream = deployment_.submit(probe);
  } catch (const RefusedError& e) {
    return error(503, str("the health check's request was refused: ", e.what()));
  }
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    const std::optional<StreamUpdate> u = stream->next(100ms);
    if (!u || !u->finished) continue;
    if (!u->error.empty()) return error(503, str("the health check's request failed: ", u->error));
    return {200, "application/json", "{}"};
  }
  stream->cancel();
  return error(503, str("the health check's one-token request was not served within ",
                        timeout.count(), " ms"));
}

bool OpenAiApi::register_id(const std::string& id,
                            std::vector<std::weak_ptr<RequestStream>> streams) {
  // Running until the loop has ended it: a handler may still hold a finished stream (a reply
  // being written) after its client has read the end and sent the id again.
  const auto running = [](const std::vector<std::weak_ptr<RequestStream>>& held) {
    return std::any_of(held.begin(), held.end(), [](const auto& w) {
      const std::shared_ptr<RequestStream> s = w.lock();
      return s && !s->timing().finished;
    });
  };
  std::lock_guard lock(ids_mutex_);
  std::erase_if(generate_ids_, [&](const auto& entry) { return !running(entry.second); });
  return generate_ids_.emplace(id, std::move(streams)).second;
}

HttpReply OpenAiApi::abort_request(const std::string& body) {
  std::vector<std::shared_ptr<RequestStream>> targets;
  try {
    const json b = parse_object(body);
    const bool all = boolean(b, "abort_all").value_or(false);
    const json* rid = field(b, "rid");
    if (!all && !(rid && rid->is_string()))
      bad("rid", "give 'rid' (a /generate request's id) or \"abort_all\": true");
    std::lock_guard lock(ids_mutex_);
    for (const auto& [id, streams] : generate_ids_) {
      if (!all && id != rid->get<std::string>()) continue;
      for (const auto& w : streams)
        if (auto s = w.lock()) targets.push_back(std::move(s));
    }
    if (!all && targets.empty())
      return error(404,
                   str("no /generate request with rid '", rid->get<std::string>(), "' is running"),
                   "rid");
  } catch (const BadRequest& e) {
    return error(e.status, e.what(), e.param);
  }
  for (const auto& s : targets) s->cancel();
  return {200, "application/json", "{}"};
}

HttpReply OpenAiApi::version() const {
  return {200, "application/json", text_of(json{{"version", kVersion}})};
}

}  // namespace dcp::serve
