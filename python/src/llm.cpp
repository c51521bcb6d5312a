// The offline LLM: one served deployment whose ranks run as threads of this process, started
// once (the weights load once) and fed whole batches by generate(). Requests go through the same
// ServingDeployment as `dcp serve`, so scheduling, sampling and stop tokens behave alike.
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <future>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bindings.h"
#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/generation_config.h"
#include "dcp/json_schema.h"
#include "dcp/serving.h"
#include "dcp/text_stream.h"
#include "dcp/tokenizer.h"
#include "dcp/tool_calls.h"
#include "dcp/weights.h"

namespace dcp::python {
namespace {

struct LlmConfig {
  std::string model;  // a checkpoint folder, or a preset name (synthetic weights)
  std::string tokenizer;
  int num_layers = 0;
  int tp_size = 1, dcp_size = 1, dp_size = 1;
  bool enable_dp_attention = false;
  int ep_size = 1;
  std::string dcp_comm_backend;  // "" = auto
  bool dcp_replicate_q_proj = false;
  int page_size = 64;
  int dcp_kv_cache_interleave_size = 1;
  std::string kv_cache_dtype = "bf16";
  std::string attention_kernel = "automatic";
  std::string weight_kernel = "automatic";
  int threads_per_rank = 1;
  std::int64_t max_total_tokens = 65536;
  std::int64_t max_model_len = 0;  // 0: the model's max_position_embeddings
  int chunked_prefill_size = 2048;
  int max_running_requests = 64;
  bool enable_prefix_cache = false;
  std::int64_t host_kv_capacity_tokens = 0;  // needs enable_prefix_cache
  double comm_timeout_s = 300;
  int prefill_dcp_size = 0;  // > 0: disaggregated, a prefill group of this DCP size
  int speculative_num_draft_tokens = 0;  // > 0 needs speculative_draft
  std::string speculative_draft;         // draft_source's names
};

// One request as generate() receives it from the Python side.
struct GenerateRequest {
  std::vector<std::int32_t> prompt;
  int max_new_tokens = 16;
  SamplingParams sampling;
  std::vector<std::int32_t> stop_token_ids;
  int min_tokens = 0;             // neither stop tokens nor stop strings before this many tokens
  std::vector<std::string> stop;  // stop strings (need the tokenizer)
  std::vector<std::string> bad_words;  // tokenized into sampling.bad_words (need the tokenizer)
  std::vector<std::string> choice;     // tokenized into sampling.choices (need the tokenizer)
  bool include_stop_str_in_output = false;
  int prompt_logprobs = -1;
  bool skip_special_tokens = true;
  int logprobs = -1;
};

struct Generated {
  std::vector<std::int32_t> tokens;
  std::optional<std::string> text;  // with a tokenizer: the text, up to a stop string
  std::string finish_reason;  // "length", "stop", "cancelled"
  std::vector<StepLogprobs> logprobs;
  std::vector<StepLogprobs> prompt_logprobs;  // one per prompt token but the first, when asked
  std::int64_t cached_prompt_tokens = 0;      // whose KV the prefix cache held
  double time_to_first_token_s = 0, latency_s = 0;
};

// Per step [(token_id, logprob, rank)]: the chosen token (its rank over the vocabulary) first,
// then its alternatives ranked 1 to k (the chosen one not again); Python makes vLLM's
// {token_id: Logprob} of them.
py::list logprobs_list(const std::vector<StepLogprobs>& lps) {
  py::list steps;
  for (const StepLogprobs& s : lps) {
    py::list step;
    step.append(py::make_tuple(s.chosen.token, s.chosen.logprob, s.rank));
    for (std::size_t i = 0; i < s.top.size(); ++i) {
      if (s.top[i].token != s.chosen.token)
        step.append(py::make_tuple(s.top[i].token, s.top[i].logprob, i + 1));
    }
    steps.append(step);
  }
  return steps;
}

void check_positive(long long v, const char* name) {
  if (v < 1) throw py::value_error(std::string(name) + " = " + std::to_string(v) + " must be >= 1");
}

DeploymentSpec make_spec(const LlmConfig& c) {
  check_positive(c.max_total_tokens, "max_total_tokens");
  check_positive(c.chunked_prefill_size, "chunked_prefill_size");
  check_positive(c.max_running_requests, "max_running_requests");
  check_positive(c.page_size, "page_size");
  check_positive(c.dcp_kv_cache_interleave_size, "dcp_kv_cache_interleave_size");
  if (c.threads_per_rank < 1 || c.threads_per_rank > kMaxRankThreads) {
    throw py::value_error("threads_per_rank = " + std::to_string(c.threads_per_rank) +
                          " must be in [1, " + std::to_string(kMaxRankThreads) + "]");
  }
  if (c.page_size % c.dcp_kv_cache_interleave_size != 0) {
    throw py::value_error("dcp_kv_cache_interleave_size = " +
                          std::to_string(c.dcp_kv_cache_interleave_size) +
                          " must divide page_size = " + std::to_string(c.page_size));
  }
  if (c.num_layers < 0) {
    throw py::value_error("num_layers = " + std::to_string(c.num_layers) +
                          " must be >= 0 (0: the model's own count)");
  }
  if (!(c.comm_timeout_s >= 0 && c.comm_timeout_s <= 1e9)) {
    throw py::value_error("comm_timeout_s must be in [0, 1e9] seconds (0: wait forever)");
  }
  DeploymentSpec s;
  if (std::error_code ec; std::filesystem::is_directory(c.model, ec)) {
    s.model.config = read_checkpoint_config(c.model);
    if (c.num_layers > 0) {
      if (c.num_layers > s.model.config.num_hidden_layers) {
        throw py::value_error("num_layers = " + std::to_string(c.num_layers) +
                              " exceeds the checkpoint's " +
                              std::to_string(s.model.config.num_hidden_layers) + " layers");
      }
      s.model.config.num_hidden_layers = c.num_layers;
    }
    s.model.path = c.model;
  } else {
    try {
      s.model.config = preset_config(c.model, c.num_layers);
    } catch (const Error&) {
      throw py::value_error("model = '" + c.model +
                            "' is neither a checkpoint folder nor a preset (" + preset_names() +
                            ")");
    }
    s.model.synthetic_dtype = preset_weight_dtype(c.model);
  }
  ParallelConfig& p = s.parallel;
  p.tp_size = c.tp_size;
  p.dcp_size = c.dcp_size;
  p.dp_size = c.dp_size;
  p.enable_dp_attention = c.enable_dp_attention;
  p.ep_size = c.ep_size;
  if (!c.dcp_comm_backend.empty()) p.dcp_comm_backend = parse_combine_backend(c.dcp_comm_backend);
  p.replicate_q_proj = c.dcp_replicate_q_proj;
  validate(p);
  const int experts = s.model.config.n_routed_experts;
  if (p.ep_size > 1 && (experts == 0 || experts % p.ep_size != 0)) {
    throw py::value_error("ep_size = " + std::to_string(p.ep_size) +
                          " must divide the model's routed experts (" + std::to_string(experts) +
                          "; a model without experts takes ep_size = 1)");
  }
  if (c.prefill_dcp_size < 0)
    throw py::value_error("prefill_dcp_size = " + std::to_string(c.prefill_dcp_size) +
                          " must be >= 1");
  if (p.world_size() + c.prefill_dcp_size > kMaxThreadRanks) {
    throw py::value_error(
        "the configuration needs " + std::to_string(p.world_size() + c.prefill_dcp_size) +
        " ranks (tp_size x dp_size, and prefill_dcp_size); one process runs at most " +
        std::to_string(kMaxThreadRanks) + " as threads");
  }
  s.model_options.kv_dtype = parse_kv_dtype(c.kv_cache_dtype);
  s.model_options.page_size = c.page_size;
  s.model_options.kv_interleave = c.dcp_kv_cache_interleave_size;
  s.model_options.threads = c.threads_per_rank;
  s.model_options.attention_kernel = parse_kernel_path(c.attention_kernel);
  try {
    s.model_options.weight_kernel = parse_kernel_path(c.weight_kernel);
  } catch (const Error& e) {
    throw Error(e.category(), str("weight_kernel = '", c.weight_kernel, "': ", e.what()));
  }
  s.model_options.kv_capacity_tokens = c.max_total_tokens;
  s.engine.chunked_prefill_size = c.chunked_prefill_size;
  s.engine.max_running_requests = c.max_running_requests;
  if (c.host_kv_capacity_tokens < 0 || (c.host_kv_capacity_tokens > 0 && !c.enable_prefix_cache)) {
    throw py::value_error(
        "host_kv_capacity_tokens = " + std::to_string(c.host_kv_capacity_tokens) +
        (c.host_kv_capacity_tokens < 0 ? " must be >= 0" : " needs enable_prefix_cache=True"));
  }
  s.engine.enable_prefix_cache = c.enable_prefix_cache;
  s.engine.host_kv_capacity_tokens = c.host_kv_capacity_tokens;
  if (c.speculative_num_draft_tokens < 0 ||
      (c.speculative_num_draft_tokens > 0) != !c.speculative_draft.empty()) {
    throw py::value_error(
        c.speculative_num_draft_tokens < 0
            ? "speculative_num_draft_tokens = " + std::to_string(c.speculative_num_draft_tokens) +
                  " must be >= 0 (0: off)"
            : std::string(c.speculative_draft.empty()
                              ? "speculative_num_draft_tokens needs speculative_draft"
                              : "speculative_draft needs speculative_num_draft_tokens >= 1"));
  }
  if (c.speculative_num_draft_tokens > 0) {
    set_speculation(s, c.speculative_num_draft_tokens, c.speculative_draft,
                    s.model.synthetic_seed + 1, "speculative_draft");
  }
  s.transport = RankTransport::threads;
  s.comm_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(c.comm_timeout_s * 1000));
  return s;
}

class Llm {
 public:
  explicit Llm(const LlmConfig& c) {
    DeploymentSpec spec = make_spec(c);
    const int vocab = spec.model.config.vocab_size;
    std::string tokenizer_dir = c.tokenizer;
    if (tokenizer_dir.empty() && !spec.model.path.empty() && Tokenizer::found_in(spec.model.path))
      tokenizer_dir = spec.model.path;
    if (!tokenizer_dir.empty()) {
      tokenizer_ = std::make_unique<Tokenizer>(Tokenizer::from_dir(tokenizer_dir));
      if (tokenizer_->vocab_size() > vocab) {
        throw py::value_error("tokenizer " + tokenizer_dir + ": its " +
                              std::to_string(tokenizer_->vocab_size()) +
                              " ids exceed the model's vocabulary of " + std::to_string(vocab));
      }
    }
    vocab_ = vocab;
    // What ends a request besides the tokenizer's EOS: the checkpoint's own (Kimi's end of turn).
    if (tokenizer_ && tokenizer_->eos_id()) eos_token_ids_.push_back(*tokenizer_->eos_id());
    if (!spec.model.path.empty())
      sampling_defaults_ = checkpoint_sampling_defaults(spec.model.path);
    if (!spec.model.path.empty())
      for (std::int32_t id : checkpoint_eos_token_ids(spec.model.path, vocab))
        if (std::find(eos_token_ids_.begin(), eos_token_ids_.end(), id) == eos_token_ids_.end())
          eos_token_ids_.push_back(id);
    // Guided decoding masks tokens by their bytes.
    if (tokenizer_) spec.engine.guide_vocabulary = guide_vocabulary(*tokenizer_, vocab);
    ServeOptions serve;
    // Offline: every prompt of a generate() call waits in the queue; none is refused for it.
    serve.max_queued_requests = std::numeric_limits<int>::max();
    serve.max_model_len = c.max_model_len;
    serve.prefill_dcp_size = c.prefill_dcp_size;
    deployment_ = std::make_unique<ServingDeployment>(std::move(spec), serve);
    auto ready = std::make_shared<std::promise<void>>();
    std::future<void> loaded = ready->get_future();
    runner_ = std::thread([this, ready] {
      bool signalled = false;
      try {
        deployment_->run([&] {
          signalled = true;
          ready->set_value();
        });
      } catch (...) {
        {
          std::lock_guard lock(failure_mutex_);
          failure_ = std::current_exception();
        }
        if (!signalled) ready->set_exception(std::current_exception());
      }
    });
    try {
      py::gil_scoped_release unlocked;
      loaded.get();  // the weights are loaded on every rank, or a rank's error
    } catch (...) {
      runner_.join();
      throw;
    }
  }

  ~Llm() { close(); }

  void close() {
    if (!deployment_) return;
    {
      py::gil_scoped_release unlocked;
      deployment_->shutdown(/*drain=*/false);
      if (runner_.joinable()) runner_.join();
    }
    deployment_.reset();
  }

  void reset_prefix_cache() {
    if (!deployment_) throw py::value_error("this LLM was closed");
    if (!deployment_->prefix_cache_enabled())
      throw py::value_error("reset_prefix_cache: the prefix cache is off (enable_prefix_cache)");
    deployment_->reset_prefix_cache();
  }

  std::vector<Generated> generate(const std::vector<GenerateRequest>& requests) {
    if (!deployment_) throw py::value_error("this LLM was closed");
    rethrow_failure();
    std::vector<std::shared_ptr<RequestStream>> streams;
    // Each request's text as the server makes it: detokenized as tokens come, ended by the first
    // stop string (the request is then cancelled, its finish reason "stop").
    std::vector<std::optional<TextStream>> texts(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      if (!requests[i].stop.empty() && !tokenizer_) {
        throw py::value_error("request " + std::to_string(i) +
                              ": stop strings need a tokenizer (LLM(..., tokenizer=PATH))");
      }
      if (tokenizer_) {
        texts[i].emplace(tokenizer_.get(), requests[i].stop, requests[i].skip_special_tokens,
                         requests[i].min_tokens, requests[i].include_stop_str_in_output);
      }
    }
    std::vector<std::vector<std::vector<std::int32_t>>> bad_words(requests.size());
    std::vector<std::vector<std::vector<std::int32_t>>> choices(requests.size());
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const SamplingParams& p = requests[i].sampling;
      if ((!requests[i].choice.empty() || p.guided()) && !tokenizer_) {
        throw py::value_error("request " + std::to_string(i) +
                              ": guided decoding needs a tokenizer (LLM(..., tokenizer=PATH))");
      }
      for (const std::string& text : requests[i].choice)  // as dcp serve's guided_choice
        choices[i].push_back(tokenizer_->encode(text, false));
      if (requests[i].bad_words.empty()) continue;
      if (!tokenizer_) {
        throw py::value_error("request " + std::to_string(i) +
                              ": bad_words need a tokenizer (LLM(..., tokenizer=PATH))");
      }
      try {
        bad_words[i] = bad_word_token_ids(*tokenizer_, requests[i].bad_words);
      } catch (const Error& e) {
        throw py::value_error("request " + std::to_string(i) + ": " + e.what());
      }
    }
    auto cancel_all = [&] {
      for (auto& s : streams) s->cancel();
    };
    {
      py::gil_scoped_release unlocked;
      try {
        for (std::size_t i = 0; i < requests.size(); ++i) {
          const GenerateRequest& r = requests[i];
          ServeRequest q;
          q.prompt = r.prompt;
          q.max_new_tokens = r.max_new_tokens;
          q.sampling = r.sampling;
          q.sampling.bad_words = std::move(bad_words[i]);
          q.sampling.choices = std::move(choices[i]);
          q.stop_token_ids = r.stop_token_ids;
          q.min_tokens = r.min_tokens;
          q.prompt_logprobs = r.prompt_logprobs;
          q.logprobs = r.logprobs;
          streams.push_back(deployment_->submit(q));
        }
      } catch (...) {
        cancel_all();  // all or nothing: what was submitted before the refusal is dropped
        throw;
      }
    }
    std::string rejected;  // the first request the engine rejected
    std::vector<Generated> out(requests.size());
    std::vector<bool> done(requests.size(), false);
    std::size_t remaining = requests.size();
    while (remaining > 0) {
      {
        py::gil_scoped_release unlocked;
        for (std::size_t i = 0; i < streams.size(); ++i) {
          if (done[i]) continue;
          // A short wait per stream: this loop returns to Python often enough to see Ctrl-C.
          while (auto u = streams[i]->next(std::chrono::milliseconds(remaining == 1 ? 50 : 0))) {
            Generated& g = out[i];
            std::optional<TextStream>& text = texts[i];
            if (text && !g.text) g.text.emplace();
            std::move(u->prompt_logprobs.begin(), u->prompt_logprobs.end(),
                      std::back_inserter(g.prompt_logprobs));
            g.cached_prompt_tokens = u->cached_prompt_tokens;
            for (std::size_t k = 0; k < u->tokens.size() && !(text && text->stopped()); ++k) {
              g.tokens.push_back(u->tokens[k]);
              if (k < u->logprobs.size()) g.logprobs.push_back(std::move(u->logprobs[k]));
              if (text) *g.text += text->push(u->tokens[k]);
            }
            const bool stopped = text && text->stopped();
            if (stopped && !u->finished) streams[i]->cancel();  // its last update follows
            if (!u->error.empty() && rejected.empty()) {
              rejected = "request " + std::to_string(i) + " was rejected: " + u->error;
            }
            if (u->finished) {
              if (text) *g.text += text->finish();
              g.finish_reason = stopped ? "stop" : std::string(to_string(u->finish_reason));
              const StreamTiming t = streams[i]->timing();
              const auto secs = [&](auto at) {
                return std::chrono::duration<double>(at - t.submitted).count();
              };
              g.time_to_first_token_s = t.first_token ? secs(*t.first_token) : 0;
              g.latency_s = t.finished ? secs(*t.finished) : 0;
              done[i] = true;
              --remaining;
              break;
            }
          }
        }
        if (remaining > 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      rethrow_failure();  // a rank failed: the deployment has stopped
      if (PyErr_CheckSignals() != 0) {  // Ctrl-C: drop the batch, keep the LLM usable
        cancel_all();
        throw py::error_already_set();
      }
    }
    if (!rejected.empty()) throw py::value_error(rejected);
    return out;
  }

  bool has_tokenizer() const noexcept { return tokenizer_ != nullptr; }
  const Tokenizer& tokenizer() const {
    if (!tokenizer_) {
      throw py::value_error("this model has no tokenizer (a preset, or a checkpoint without "
                            "tokenizer.json / tiktoken.model): pass token ids, or tokenizer=PATH");
    }
    return *tokenizer_;
  }
  int vocab_size() const noexcept { return vocab_; }
  const std::vector<std::int32_t>& eos_token_ids() const noexcept { return eos_token_ids_; }
  // generation_config.json's sampling fields, by SamplingParams' names.
  py::dict sampling_defaults() const {
    py::dict d;
    const SamplingDefaults& s = sampling_defaults_;
    if (s.temperature) d["temperature"] = *s.temperature;
    if (s.top_p) d["top_p"] = *s.top_p;
    if (s.top_k) d["top_k"] = *s.top_k;
    if (s.min_p) d["min_p"] = *s.min_p;
    if (s.repetition_penalty) d["repetition_penalty"] = *s.repetition_penalty;
    return d;
  }
  std::int64_t kv_capacity_tokens() const {
    return deployment_ ? deployment_->kv_capacity_tokens() : 0;
  }
  std::int64_t context_tokens() const { return deployment_ ? deployment_->context_tokens() : 0; }

 private:
  void rethrow_failure() {
    std::lock_guard lock(failure_mutex_);
    if (failure_) std::rethrow_exception(failure_);
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<ServingDeployment> deployment_;
  std::thread runner_;
  std::mutex failure_mutex_;
  std::exception_ptr failure_;  // what stopped the ranks, set by the runner thread
  int vocab_ = 0;
  std::vector<std::int32_t> eos_token_ids_;  // the tokenizer's EOS, then the checkpoint's
  SamplingDefaults sampling_defaults_;
};

}  // namespace

void bind_llm(py::module_& m) {
  py::class_<LlmConfig>(m, "_LlmConfig")
      .def(py::init<>())
      .def_readwrite("model", &LlmConfig::model)
      .def_readwrite("tokenizer", &LlmConfig::tokenizer)
      .def_readwrite("num_layers", &LlmConfig::num_layers)
      .def_readwrite("tp_size", &LlmConfig::tp_size)
      .def_readwrite("dcp_size", &LlmConfig::dcp_size)
      .def_readwrite("dp_size", &LlmConfig::dp_size)
      .def_readwrite("enable_dp_attention", &LlmConfig::enable_dp_attention)
      .def_readwrite("ep_size", &LlmConfig::ep_size)
      .def_readwrite("dcp_comm_backend", &LlmConfig::dcp_comm_backend)
      .def_readwrite("dcp_replicate_q_proj", &LlmConfig::dcp_replicate_q_proj)
      .def_readwrite("page_size", &LlmConfig::page_size)
      .def_readwrite("dcp_kv_cache_interleave_size", &LlmConfig::dcp_kv_cache_interleave_size)
      .def_readwrite("threads_per_rank", &LlmConfig::threads_per_rank)
      .def_readwrite("kv_cache_dtype", &LlmConfig::kv_cache_dtype)
      .def_readwrite("attention_kernel", &LlmConfig::attention_kernel)
      .def_readwrite("weight_kernel", &LlmConfig::weight_kernel)
      .def_readwrite("max_total_tokens", &LlmConfig::max_total_tokens)
      .def_readwrite("max_model_len", &LlmConfig::max_model_len)
      .def_readwrite("chunked_prefill_size", &LlmConfig::chunked_prefill_size)
      .def_readwrite("max_running_requests", &LlmConfig::max_running_requests)
      .def_readwrite("enable_prefix_cache", &LlmConfig::enable_prefix_cache)
      .def_readwrite("host_kv_capacity_tokens", &LlmConfig::host_kv_capacity_tokens)
      .def_readwrite("prefill_dcp_size", &LlmConfig::prefill_dcp_size)
      .def_readwrite("speculative_num_draft_tokens", &LlmConfig::speculative_num_draft_tokens)
      .def_readwrite("speculative_draft", &LlmConfig::speculative_draft)
      .def_readwrite("comm_timeout_s", &LlmConfig::comm_timeout_s);

  py::class_<GenerateRequest>(m, "_GenerateRequest")
      .def(py::init(
               [](std::vector<std::int32_t> prompt, int max_new_tokens, double temperature,
                  double top_p, int top_k, double min_p, double presence_penalty,
                  double frequency_penalty, double repetition_penalty,
                  std::map<std::int32_t, double> logit_bias,
                  std::vector<std::int32_t> allowed_token_ids, std::vector<std::string> bad_words,
                  std::uint64_t seed, std::vector<std::int32_t> stop_token_ids, int min_tokens,
                  std::vector<std::string> stop, bool include_stop_str_in_output,
                  int prompt_logprobs, bool skip_special_tokens, int logprobs, std::string regex,
                  std::vector<std::string> choice, bool json_object, std::string grammar) {
                 GenerateRequest r;
                 r.prompt = std::move(prompt);
                 r.max_new_tokens = max_new_tokens;
                 r.sampling.temperature = temperature;
                 r.sampling.top_p = top_p;
                 r.sampling.top_k = top_k;
                 r.sampling.min_p = min_p;
                 r.sampling.presence_penalty = presence_penalty;
                 r.sampling.frequency_penalty = frequency_penalty;
                 r.sampling.repetition_penalty = repetition_penalty;
                 r.sampling.logit_bias = std::move(logit_bias);
                 r.sampling.allowed_token_ids = std::move(allowed_token_ids);
                 r.bad_words = std::move(bad_words);
                 r.sampling.seed = seed;
                 r.stop_token_ids = std::move(stop_token_ids);
                 r.min_tokens = min_tokens;
                 r.stop = std::move(stop);
                 r.include_stop_str_in_output = include_stop_str_in_output;
                 r.prompt_logprobs = prompt_logprobs;
                 r.skip_special_tokens = skip_special_tokens;
                 r.logprobs = logprobs;
                 r.sampling.regex = std::move(regex);
                 r.choice = std::move(choice);
                 r.sampling.json_object = json_object;
                 r.sampling.grammar = std::move(grammar);
                 return r;
               }),
           py::arg("prompt"), py::arg("max_new_tokens"), py::arg("temperature"), py::arg("top_p"),
           py::arg("top_k"), py::arg("min_p"), py::arg("presence_penalty"),
           py::arg("frequency_penalty"), py::arg("repetition_penalty"), py::arg("logit_bias"),
           py::arg("allowed_token_ids"), py::arg("bad_words"), py::arg("seed"),
           py::arg("stop_token_ids"), py::arg("min_tokens"), py::arg("stop"),
           py::arg("include_stop_str_in_output"), py::arg("prompt_logprobs"),
           py::arg("skip_special_tokens"), py::arg("logprobs"), py::arg("regex") = "",
           py::arg("choice") = std::vector<std::string>{}, py::arg("json_object") = false,
           py::arg("grammar") = "");

  py::class_<Generated>(m, "_Generated")
      .def_readonly("token_ids", &Generated::tokens)
      .def_readonly("text", &Generated::text)
      .def_readonly("finish_reason", &Generated::finish_reason)
      .def_readonly("cached_prompt_tokens", &Generated::cached_prompt_tokens)
      .def_readonly("time_to_first_token_s", &Generated::time_to_first_token_s)
      .def_readonly("latency_s", &Generated::latency_s)
      .def_property_readonly("logprobs",
                             [](const Generated& g) { return logprobs_list(g.logprobs); })
      .def_property_readonly("prompt_logprobs",
                             [](const Generated& g) { return logprobs_list(g.prompt_logprobs); });

  // A reply's tool calls, as `dcp serve` reads them for tool_choice "auto".
  m.def(
      "_parse_tool_calls",
      [](const std::string& text, const std::string& format) {
        const std::optional<ToolCallFormat> f = tool_call_format_named(format);
        DCP_ARG_CHECK(f, "format '", format,
                      "' is not a tool-call format (legal: deepseek_v3, kimi_k2, minicpm3)");
        const ParsedToolCalls parsed = parse_tool_calls(text, *f);
        py::list calls;
        for (const ToolCall& c : parsed.calls) {
          py::dict call;
          call["id"] = c.id;
          call["name"] = c.name;
          call["arguments"] = c.arguments;
          calls.append(call);
        }
        return py::make_tuple(parsed.content, calls);
      },
      py::arg("text"), py::arg("format"));

  // A chat template (Jinja source) rendered over a JSON context, and OpenAI's messages made the
  // form it reads: what `dcp serve` does with a chat request, without a model.
  m.def(
      "_render_chat_template",
      [](const std::string& chat_template, const std::string& context_json) {
        return ChatTemplate(chat_template).render(context_json);
      },
      py::arg("chat_template"), py::arg("context_json"));
  m.def("_openai_chat_messages", &openai_chat_messages, py::arg("messages_json"),
        py::arg("chat_template"));

  m.def(
      "_json_schema_regex",
      [](const std::string& schema) { return json_schema_regex(schema, "guided_decoding.json"); },
      py::arg("schema"));

  py::class_<Llm>(m, "_Llm")
      .def(py::init<const LlmConfig&>(), py::arg("config"))
      .def("generate", &Llm::generate, py::arg("requests"))
      .def("close", &Llm::close)
      .def("reset_prefix_cache", &Llm::reset_prefix_cache)
      .def_property_readonly("has_tokenizer", &Llm::has_tokenizer)
      .def_property_readonly("vocab_size", &Llm::vocab_size)
      .def_property_readonly("kv_capacity_tokens", &Llm::kv_capacity_tokens)
      .def_property_readonly("context_tokens", &Llm::context_tokens)
      .def(
          "encode",
          [](const Llm& l, const std::string& text, bool add_special_tokens) {
            return l.tokenizer().encode(text, add_special_tokens);
          },
          py::arg("text"), py::arg("add_special_tokens"))
      .def(
          "decode",
          [](const Llm& l, const std::vector<std::int32_t>& ids, bool skip_special) {
            return l.tokenizer().decode(ids, skip_special);
          },
          py::arg("ids"), py::arg("skip_special_tokens"))
      // Each token's text alone (lossy UTF-8); None without a tokenizer, or for an id past its
      // vocabulary (a model's may be larger).
      .def(
          "token_texts",
          [](const Llm& l, const std::vector<std::int32_t>& ids) {
            std::vector<std::optional<std::string>> texts;
            for (const std::int32_t id : ids) {
              if (l.has_tokenizer() && l.tokenizer().contains(id))
                texts.emplace_back(utf8_lossy(l.tokenizer().token_bytes(id)));
              else
                texts.emplace_back();
            }
            return texts;
          },
          py::arg("ids"))
      // The tokenizer's chat template (or `chat_template`, Jinja source) over a JSON context.
      .def(
          "apply_chat_template",
          [](const Llm& l, const std::string& context_json, bool add_generation_prompt,
             const std::optional<std::string>& chat_template) {
            return chat_template
                       ? apply_chat_template(l.tokenizer(), context_json, add_generation_prompt,
                                             *chat_template)
                       : apply_chat_template(l.tokenizer(), context_json, add_generation_prompt);
          },
          py::arg("context_json"), py::arg("add_generation_prompt"), py::arg("chat_template"))
      // OpenAI's messages (JSON) in the form the template reads, as dcp serve hands them to it.
      .def(
          "openai_chat_messages",
          [](const Llm& l, const std::string& messages_json,
             const std::optional<std::string>& chat_template) {
            return openai_chat_messages(
                messages_json,
                chat_template ? *chat_template : l.tokenizer().chat_template().value_or(""));
          },
          py::arg("messages_json"), py::arg("chat_template"))
      .def_static("continue_final_message", &continue_final_message, py::arg("rendered"),
                  py::arg("final_content"))
      .def_property_readonly("eos_token_ids", &Llm::eos_token_ids)
      .def_property_readonly("sampling_defaults", &Llm::sampling_defaults);
}

}  // namespace dcp::python
