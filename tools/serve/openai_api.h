// The OpenAI-compatible API (and SGLang's /generate) over a ServingDeployment: request bodies in,
// JSON replies or server-sent events out. No sockets here: the HTTP server (http_server.h) hands
// bodies in and writes what comes back.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dcp/generation_config.h"
#include "dcp/serving.h"
#include "dcp/tokenizer.h"
#include "serve/request_fields.h"
#include "serve/tool_fields.h"

namespace dcp::serve {

struct Choice;  // api_job.h

struct HttpReply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Writes one piece of a streamed reply; false once the client is gone.
using ChunkWriter = std::function<bool(const std::string&)>;

// Whether the client of a request has gone away (closed its connection); a whole reply's wait
// asks it, and cancels the request's choices once it says so.
using ClientGone = std::function<bool()>;

// A handled request: a whole reply, or a stream to run with the connection's writer.
struct Handled {
  std::optional<HttpReply> reply;
  std::function<void(const ChunkWriter&)> stream;
};

// How a chat reply's reasoning is told from its content (vLLM's --reasoning-parser).
enum class ReasoningParser {
  none,
  deepseek_r1,  // the reply starts with thinking, closed by "</think>"
  deepseek_v3,  // the same where chat_template_kwargs.thinking is true (V3.1's thinking mode)
  kimi_k2,      // the same unless chat_template_kwargs.thinking is false (Kimi-K2-Thinking); the
                // thinking also ends where the reply opens its tool-call section
  minicpm3,     // a reply that opens with "<|thought_start|>" thinks up to "<|thought_end|>"
};

struct ApiOptions {
  std::string model_name;      // what /v1/models lists and requests must name (when they do)
  int default_max_tokens = 128;  // when a request gives none (capped by the context)
  // How the model writes tool calls (tool_choice "auto" reads them); none: "auto" is refused.
  std::optional<ToolCallFormat> tool_call_format;
  ReasoningParser reasoning_parser = ReasoningParser::none;
  // The checkpoint's end-of-generation ids (generation_config.json), which end a request unless
  // it sets ignore_eos, as the tokenizer's EOS does.
  std::vector<std::int32_t> eos_token_ids;
  // What a request that leaves a sampling field out gets (generation_config.json's), before the
  // API's own defaults.
  SamplingDefaults sampling_defaults;
  // Where the weights and the tokenizer came from (SGLang's /get_model_info); empty: generated
  // weights, or no tokenizer.
  std::string model_path, tokenizer_path;
};

class OpenAiApi {
 public:
  // `tokenizer` may be null: then prompts must be token ids and replies carry ids, no text.
  OpenAiApi(ServingDeployment& deployment, const Tokenizer* tokenizer, ApiOptions options);

  // POST /v1/completions, /v1/chat/completions and /generate (SGLang); `gone`, when given, is
  // asked while a whole reply is generated.
  Handled completions(const std::string& body, const ClientGone& gone = {});
  Handled chat_completions(const std::string& body, const ClientGone& gone = {});
  Handled generate(const std::string& body, const ClientGone& gone = {});
  // vLLM's: text or a chat (rendered by the template) to token ids, and token ids to text.
  HttpReply tokenize(const std::string& body) const;    // POST /tokenize
  HttpReply detokenize(const std::string& body) const;  // POST /detokenize
  HttpReply models() const;                           // GET /v1/models
  HttpReply model(const std::string& id) const;       // GET /v1/models/{id}
  HttpReply health() const;                           // GET /health
  HttpReply metrics() const;                          // GET /metrics (Prometheus text)
  // vLLM's: every DP replica's prefix cache forgets its pages before the next step (benchmarks
  // start cold without a restart); 400 naming --enable-prefix-cache when the cache is off.
  HttpReply reset_prefix_cache();  // POST /reset_prefix_cache (SGLang's /flush_cache too)
  // SGLang's (sglang_api.cpp): where the model came from; how it is served, with the queue now;
  // a one-token greedy request served within `timeout` (200) or not (503).
  HttpReply model_info() const;   // GET /get_model_info, /model_info
  HttpReply server_info() const;  // GET /get_server_info, /server_info
  HttpReply health_generate(std::chrono::milliseconds timeout = std::chrono::seconds(20));
  HttpReply version() const;  // GET /version (vLLM's)
  // SGLang's: {"rid": id} cancels that /generate request (its rid, or the meta_info.id it was
  // given), {"abort_all": true} every one; the reply then ends with finish_reason "abort".
  HttpReply abort_request(const std::string& body);  // POST /abort_request

  // An OpenAI-style error body.
  static HttpReply error(int status, const std::string& message, const std::string& param = "");

 private:
  struct Job;
  enum class Kind { completion, chat, generate };
  // Parse, submit, reply or stream.
  Handled handle(const std::string& body, Kind kind, const ClientGone& gone);
  Job parse(const std::string& body, Kind kind) const;
  // The fields that constrain the reply (guided_fields.cpp), read from `src`: the body, or its
  // `within` object (/generate's sampling_params); `body` is the raw text (a schema's key order).
  void parse_guides(const json& src, const char* within, const std::string& body,
                    SamplingParams& p) const;
  // Chat's tools, tool_choice and parallel_tool_calls (tool_fields.cpp): "required" and a named
  // function set `p`'s guide.
  ToolUse parse_tools(const json& b, const std::string& body, SamplingParams& p) const;
  // /generate's own fields (sglang_api.cpp): rid, return_logprob, logprob_start_len,
  // top_logprobs_num and return_text_in_logprobs.
  void parse_sglang_fields(const json& b, Job& job) const;
  // A /generate reply (or a streamed event) for `c` so far: text, output_ids, meta_info.
  json generate_reply(const Job& job, const Choice& c, const std::string& id) const;
  void add_sglang_logprobs(const Job& job, const Choice& c, json& meta) const;
  // A fresh request id: prefix, the server's start time, a serial number.
  std::string new_id(const std::string& prefix) const;
  // The 400 of a request whose choices exceed what the queue may hold (none when they fit).
  std::optional<HttpReply> too_many_samples(std::int64_t samples, std::size_t prompts,
                                            const Job& job) const;
  // Submits choice `index` of `prompt` (its seed: the request's + index, or a fresh one); throws
  // RefusedError as ServingDeployment::submit does.
  Choice submit_choice(const Job& job, const std::vector<std::int32_t>& prompt, std::size_t index);
  // The reply to a refused submission, naming the field at fault.
  static HttpReply refused(const RefusedError& e, const Job& job);
  void check_guide(const SamplingParams& p, const std::string& param,
                   const std::string& shown) const;
  void need_tokenizer_for(const char* field_name) const;  // BadRequest naming it without one
  std::string token_bytes(std::int32_t id) const;  // "" for an id the tokenizer lacks
  std::string token_text(std::int32_t id) const;   // as UTF-8 (lossy)

  ServingDeployment& deployment_;
  const Tokenizer* tokenizer_;
  ApiOptions options_;
  std::int64_t created_ = 0;
  // /generate's requests by id (their rid), for /abort_request: the streams of their samples,
  // held weakly (a finished request's reply lets them go).
  std::mutex ids_mutex_;
  std::map<std::string, std::vector<std::weak_ptr<RequestStream>>> generate_ids_;
  // Registers `id`'s streams; false when a request with that id is still running.
  bool register_id(const std::string& id, std::vector<std::weak_ptr<RequestStream>> streams);
};

}  // namespace dcp::serve
