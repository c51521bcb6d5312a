#include "serve/openai_api.h"

#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>

#include "dcp/text_stream.h"
#include "serve/api_job.h"
#include "serve/chat_reply.h"
#include "serve/request_fields.h"

namespace dcp::serve {
namespace {

using namespace std::chrono_literals;

// Prompts one /v1/completions request may batch: each becomes n engine requests.
constexpr std::size_t kMaxPrompts = 256;
// Words one request may ban, and guided choices it may list (each is tokenized on the HTTP
// thread).
constexpr std::size_t kMaxBadWords = 256;

// Fields with a meaning this server does not implement: refused unless they ask for nothing.
// `prompt_logprobs` is vLLM's field of the OpenAI endpoints, `logprob_start_len` SGLang's of
// /generate: each is refused on the others.
void refuse_unsupported(const json& b, bool openai) {
  if (const json* v = field(b, "best_of");
      v && !(v->is_number_integer() && v->get<std::int64_t>() == 1))
    bad("best_of", "'best_of' is not supported (only 1)");
  if (const json* v = field(b, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
    bad("suffix", "'suffix' is not supported");
  if (const json* v = field(b, "functions"); v && !(v->is_array() && v->empty()))
    bad("functions", "'functions' is not supported (send 'tools')");
  // vLLM's and SGLang's extensions that would change the result: refused rather than ignored.
  for (const char* key :
       {"structural_tag", "custom_logit_processor", "logits_processors", "token_ids_logprob"}) {
    if (field(b, key)) bad(key, str("'", key, "' is not supported"));
  }
  // Inputs and adapters this engine has no place for (embeddings instead of ids, images, audio,
  // video, LoRA adapters, SGLang's sessions and hidden states), and vLLM's JSON whitespace
  // pattern (JSON is guided with at most one space between tokens): refused unless empty.
  for (const char* key :
       {"prompt_embeds", "input_embeds", "image_data", "video_data", "audio_data", "lora_path",
        "session_params", "return_hidden_states", "guided_whitespace_pattern"}) {
    const json* v = field(b, key);
    if (v && !(*v == false || ((v->is_string() || v->is_array() || v->is_object()) && v->empty())))
      bad(key, str("'", key, "' is not supported"));
  }
  if (!openai && field(b, "prompt_logprobs"))
    bad("prompt_logprobs", "'prompt_logprobs' is not supported on /generate");
  if (openai && field(b, "logprob_start_len"))
    bad("logprob_start_len",
        "'logprob_start_len' is /generate's (SGLang's): send 'prompt_logprobs' or 'echo' with "
        "'logprobs'");
  if (const json* v = field(b, "priority");
      v && !(v->is_number_integer() && v->get<std::int64_t>() == 0))
    bad("priority", "'priority' is not supported (requests are served first come, first served)");
  if (const json* v = field(b, "use_beam_search"); v && !(v->is_boolean() && !v->get<bool>()))
    bad("use_beam_search", "'use_beam_search' (beam search) is not supported");
  if (const json* v = field(b, "response_format");
      v &&
      !(v->is_object() && v->contains("type") && (*v)["type"].is_string() &&
        ((*v)["type"] == "text" || (*v)["type"] == "json_object" || (*v)["type"] == "json_schema")))
    bad("response_format",
        "'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
        "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}");
}

// Whether a chat reply starts with the model's thinking: always for DeepSeek-R1 (and MiniCPM3,
// whose split finds whether it did); for V3.1 when
// the request turns its template's thinking mode on (chat_template_kwargs.thinking), for
// Kimi-K2-Thinking unless it turns it off.
bool reasoning_reply(ReasoningParser parser, const json& b) {
  if (parser == ReasoningParser::none) return false;
  if (parser == ReasoningParser::deepseek_r1 || parser == ReasoningParser::minicpm3) return true;
  const json* kwargs = field(b, "chat_template_kwargs");
  const bool kimi = parser == ReasoningParser::kimi_k2;
  return kwargs && kwargs->is_object() ? kwargs->value("thinking", json(kimi)) == json(true) : kimi;
}

}  // namespace

OpenAiApi::OpenAiApi(ServingDeployment& deployment, const Tokenizer* tokenizer, ApiOptions options)
    : deployment_(deployment),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      created_(std::chrono::duration_cast<std::chrono::seconds>(
                   std::chrono::system_clock::now().time_since_epoch())
                   .count()) {}

HttpReply OpenAiApi::error(int status, const std::string& message, const std::string& param) {
  const char* type = status == 404   ? "not_found_error"
                     : status == 413 ? "request_too_large"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json e = {{"message", message}, {"type", type}, {"param", nullptr}, {"code", status}};
  if (!param.empty()) e["param"] = param;
  return {status, "application/json", text_of(json{{"error", e}})};
}

std::string OpenAiApi::token_bytes(std::int32_t id) const {
  // A model whose vocabulary is larger than its tokenizer's may emit ids with no text.
  return tokenizer_ && tokenizer_->contains(id) ? tokenizer_->token_bytes(id) : "";
}

std::string OpenAiApi::token_text(std::int32_t id) const { return utf8_lossy(token_bytes(id)); }

void OpenAiApi::need_tokenizer_for(const char* field_name) const {
  if (!tokenizer_)
    bad(field_name, str("this server has no tokenizer (serve a checkpoint with one, or pass "
                        "--tokenizer-path): send token ids instead of text"));
}

OpenAiApi::Job OpenAiApi::parse(const std::string& body, Kind kind) const {
  const json b = parse_object(body);
  const int vocab = deployment_.config().vocab_size;
  Job job;
  job.kind = kind;
  check_model(b, options_.model_name);
  refuse_unsupported(b, kind != Kind::generate);
  // The prompt.
  std::vector<std::int32_t>& prompt = job.request.prompt;
  if (kind == Kind::completion) {
    const json* p = field(b, "prompt");
    if (!p) bad("prompt", "'prompt' is required");
    const bool add_special = boolean(b, "add_special_tokens").value_or(true);  // the BOS
    // A string, a list of token ids, or a list of either (a batch of prompts).
    const bool batch =
        p->is_array() && !p->empty() && (p->front().is_string() || p->front().is_array());
    if (batch && p->size() > kMaxPrompts)
      bad("prompt", str("'prompt' holds ", p->size(), " prompts; at most ", kMaxPrompts));
    for (const json& one : batch ? *p : json::array({*p})) {
      if (one.is_string()) {
        need_tokenizer_for("prompt");
        job.prompts.push_back(tokenizer_->encode(one.get<std::string>(), add_special));
        job.prompt_texts.push_back(one.get<std::string>());
      } else {
        job.prompts.push_back(token_ids(one, "prompt", vocab));
        job.prompt_texts.emplace_back();
      }
      if (job.prompts.back().empty()) bad("prompt", "the prompt must hold at least one token");
    }
    prompt = job.prompts.front();
  } else if (kind == Kind::chat) {
    need_tokenizer_for("messages");
    job.prompt_field = "messages";
    // The template writes the special tokens: none are added unless asked for (vLLM's default).
    prompt = tokenizer_->encode(chat_prompt_text(*tokenizer_, b),
                                boolean(b, "add_special_tokens").value_or(false));
  } else {  // SGLang /generate
    const json* text = field(b, "text");
    const json* ids = field(b, "input_ids");
    if (!text == !ids) bad("text", "give exactly one of 'text' and 'input_ids'");
    job.prompt_field = text ? "text" : "input_ids";
    if (text) {
      if (!text->is_string()) bad("text", "'text' must be a string or a list of strings (a batch)");
      need_tokenizer_for("text");
      prompt = tokenizer_->encode(text->get<std::string>(), true);
    } else {
      if (ids->is_array() && !ids->empty() && (*ids)[0].is_array())
        bad("input_ids",
            "'input_ids' must be a list of token ids or a list of such lists (a batch)");
      prompt = token_ids(*ids, "input_ids", vocab);
    }
  }
  if (prompt.empty()) bad("prompt", "the prompt must hold at least one token");
  if (job.prompts.empty()) job.prompts.push_back(prompt);

  // Sampling: the body's fields, or SGLang's sampling_params.
  const json empty = json::object();
  const json* src = &b;
  if (kind == Kind::generate) {
    src = field(b, "sampling_params");
    if (src && !src->is_object()) bad("sampling_params", "'sampling_params' must be an object");
    if (!src) src = &empty;
    refuse_unsupported(*src, false);
    for (const char* key : {"return_logprob", "logprob_start_len", "top_logprobs_num"}) {
      if (field(*src, key))
        bad(key, str("'", key, "' belongs in the request, not in sampling_params"));
    }
    job.n = static_cast<int>(integer(*src, "n", 1, 16).value_or(1));  // SGLang's parallel samples
  }
  ServeRequest& r = job.request;
  // A field the request leaves out: the checkpoint's recommendation, else the API's default.
  const SamplingDefaults& d = options_.sampling_defaults;
  r.sampling.temperature =
      number(*src, "temperature", 0, 100).value_or(d.temperature.value_or(1.0));
  r.sampling.top_p = number(*src, "top_p", 0, 1).value_or(d.top_p.value_or(1.0));
  if (r.sampling.top_p == 0) bad("top_p", "'top_p' = 0 must be in (0, 1]");
  const std::int64_t k =
      integer(*src, "top_k", -1, std::int64_t{1} << 30).value_or(d.top_k.value_or(0));
  r.sampling.top_k = k < 0 ? 0 : static_cast<int>(k);
  r.sampling.min_p = number(*src, "min_p", 0, 1).value_or(d.min_p.value_or(0.0));
  r.sampling.presence_penalty = number(*src, "presence_penalty", -2, 2).value_or(0.0);
  r.sampling.frequency_penalty = number(*src, "frequency_penalty", -2, 2).value_or(0.0);
  r.sampling.repetition_penalty =
      number(*src, "repetition_penalty", 0, std::numeric_limits<double>::max())
          .value_or(d.repetition_penalty.value_or(1.0));
  if (r.sampling.repetition_penalty == 0)
    bad("repetition_penalty", "'repetition_penalty' = 0 must be > 0 (1: off)");
  r.sampling.logit_bias = logit_bias(*src, vocab);
  if (const json* ids = field(*src, "allowed_token_ids")) {
    r.sampling.allowed_token_ids = token_ids(*ids, "allowed_token_ids", vocab);
    if (r.sampling.allowed_token_ids.empty())
      bad("allowed_token_ids", "'allowed_token_ids' must not be empty (leave it out to allow all)");
  }
  if (const json* words = field(*src, "bad_words");
      words && !(words->is_array() && words->empty())) {
    if (!words->is_array() || words->size() > kMaxBadWords)
      bad("bad_words", str("'bad_words' must be a list of at most ", kMaxBadWords, " strings"));
    std::vector<std::string> list;
    for (const json& w : *words) {
      if (!w.is_string()) bad("bad_words", "'bad_words' must be a list of strings");
      list.push_back(w.get<std::string>());
    }
    need_tokenizer_for("bad_words");
    try {
      r.sampling.bad_words = bad_word_token_ids(*tokenizer_, list);
    } catch (const Error& e) {
      bad("bad_words", e.what());
    }
  }
  parse_guides(*src, src == &b ? "" : "sampling_params", body, r.sampling);
  if (kind == Kind::chat) {
    job.tools = parse_tools(b, body, r.sampling);
    job.reasoning = reasoning_reply(options_.reasoning_parser, b);
    // Kimi-K2-Thinking may go from its thinking straight to a tool call.
    if (options_.reasoning_parser == ReasoningParser::kimi_k2)
      job.reasoning_markers.opens_content = "<|tool_calls_section_begin|>";
    if (options_.reasoning_parser == ReasoningParser::minicpm3)
      job.reasoning_markers = ReasoningMarkers::minicpm3();
    job.include_reasoning = boolean(b, "include_reasoning").value_or(true);
    // A guide holds only the content: it starts after the thinking closes (vLLM's). Where the
    // reply need not think (MiniCPM3), the guide holds the whole reply, which then has none.
    if (job.reasoning && r.sampling.guided() && job.reasoning_markers.starts_inside)
      r.sampling.guide_after = tokenizer_->encode(job.reasoning_markers.close, false);
  } else {
    for (const char* key : {"tools", "tool_choice"}) {
      if (const json* v = field(*src, key); v && !(v->is_array() && v->empty()))
        bad(key, str("'", key, "' (tool calling) is for chat completions"));
    }
  }
  // vLLM's truncate_prompt_tokens: keep each prompt's last k tokens (-1: the context's worth).
  if (const auto keep =
          integer(*src, "truncate_prompt_tokens", -1, std::numeric_limits<int>::max())) {
    if (*keep == 0)
      bad("truncate_prompt_tokens",
          "'truncate_prompt_tokens' = 0 must be >= 1 or -1 (the context)");
    const auto last = static_cast<std::ptrdiff_t>(*keep < 0 ? deployment_.context_tokens() : *keep);
    for (std::size_t i = 0; i < job.prompts.size(); ++i) {
      std::vector<std::int32_t>& p = job.prompts[i];
      if (static_cast<std::ptrdiff_t>(p.size()) <= last) continue;
      p.erase(p.begin(), p.end() - last);
      if (i < job.prompt_texts.size()) job.prompt_texts[i].reset();  // echo shows what was kept
    }
    prompt = job.prompts.front();
  }
  const char* seed_key =
      kind == Kind::generate && field(*src, "sampling_seed") ? "sampling_seed" : "seed";
  if (const auto seed = integer(*src, seed_key, 0, std::numeric_limits<std::int64_t>::max())) {
    r.sampling.seed = static_cast<std::uint64_t>(*seed);
    job.seeded = true;
  }
  job.stop = stop_strings(*src);
  // vLLM's include_stop_str_in_output; SGLang's no_stop_trim.
  job.include_stop =
      boolean(*src, kind == Kind::generate ? "no_stop_trim" : "include_stop_str_in_output")
          .value_or(false);
  if (!job.stop.empty() && !tokenizer_) need_tokenizer_for("stop");
  if (const json* ids = field(*src, "stop_token_ids"))
    r.stop_token_ids = token_ids(*ids, "stop_token_ids", vocab);
  job.skip_special = boolean(*src, "skip_special_tokens").value_or(true);
  // The calls' markers are special tokens: the text that is read for them keeps them.
  if (job.tools.mode == ToolUse::Mode::read_auto) job.skip_special = false;
  if (!boolean(*src, "ignore_eos").value_or(false)) {
    if (tokenizer_ && tokenizer_->eos_id()) r.stop_token_ids.push_back(*tokenizer_->eos_id());
    for (std::int32_t id : options_.eos_token_ids)
      if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), id) == r.stop_token_ids.end())
        r.stop_token_ids.push_back(id);
  }
  const char* max_key = kind == Kind::generate ? "max_new_tokens"
                        : kind == Kind::chat && field(b, "max_completion_tokens")
                            ? "max_completion_tokens"
                            : "max_tokens";
  // vLLM's min_tokens, SGLang's min_new_tokens: checked against max_tokens on submission.
  r.min_tokens =
      static_cast<int>(integer(*src, kind == Kind::generate ? "min_new_tokens" : "min_tokens", 0,
                               std::numeric_limits<int>::max())
                           .value_or(0));
  const std::int64_t context = deployment_.context_tokens();
  std::size_t longest = 0;
  for (const auto& p : job.prompts) longest = std::max(longest, p.size());
  const std::int64_t room = context - static_cast<std::int64_t>(longest);
  job.max_field = max_key;
  const bool echo = kind == Kind::completion && boolean(b, "echo").value_or(false);
  const int least = kind == Kind::completion ? 0 : 1;  // 0: OpenAI's echo of the prompt alone
  if (const auto max = integer(*src, max_key, least, std::numeric_limits<int>::max())) {
    job.echo_only = *max == 0;
    // Beyond the context: submit() says so.
    r.max_new_tokens = job.echo_only ? 1 : static_cast<int>(*max);
    if (job.echo_only && !echo)
      bad(max_key,
          "'max_tokens' = 0 returns the prompt alone and needs 'echo': true (else it "
          "must be >= 1)");
    if (job.echo_only && r.min_tokens > 0)
      bad("min_tokens", str("'min_tokens' = ", r.min_tokens,
                            " with 'max_tokens' = 0 (the prompt alone) must be 0"));
    if (job.echo_only && room < 1)
      bad(job.prompt_field, str("a prompt of ", longest, " tokens fills the context of ", context,
                                " tokens: 'max_tokens' = 0 still samples one token it does not "
                                "return, which needs room for one"));
  } else {
    r.max_new_tokens =
        static_cast<int>(std::clamp<std::int64_t>(room, 1, options_.default_max_tokens));
  }
  if (kind != Kind::generate) {
    job.n = static_cast<int>(integer(b, "n", 1, 16).value_or(1));
    job.stream = boolean(b, "stream").value_or(false);
    if (const json* so = field(b, "stream_options")) {
      if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
      job.include_usage = boolean(*so, "include_usage").value_or(false);
      // vLLM's: every chunk carries its choice's usage so far (with include_usage only).
      job.continuous_usage =
          job.include_usage && boolean(*so, "continuous_usage_stats").value_or(false);
    }
  } else {
    job.stream = boolean(b, "stream").value_or(false);
  }
  if (kind == Kind::completion) {
    if (const auto lp = integer(b, "logprobs", 0, 20)) job.top_logprobs = static_cast<int>(*lp);
    // The prompt's logprobs come with the echo when logprobs are asked for.
    job.echo = echo;
    if (job.echo) r.prompt_logprobs = job.top_logprobs;
    for (std::size_t i = 0; job.echo && i < job.prompts.size(); ++i) {
      if (!job.prompt_texts[i]) {  // ids beyond the tokenizer's (a larger model vocabulary) have no
                                   // text
        std::string bytes;
        for (std::int32_t id : job.prompts[i]) bytes += token_bytes(id);
        job.prompt_texts[i] = utf8_lossy(bytes);
      }
    }
  } else if (kind == Kind::chat) {
    if (boolean(b, "echo").value_or(false))
      bad("echo", "'echo' is not supported on chat completions");
    const auto top = integer(b, "top_logprobs", 0, 20);
    if (boolean(b, "logprobs").value_or(false)) {
      job.top_logprobs = static_cast<int>(top.value_or(0));
    } else if (top) {
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
  }
  // vLLM's prompt_logprobs: each prompt token's logprob and rank, with that many alternatives, in
  // the whole reply (vLLM refuses it on a stream, whose chunks have no place for it).
  if (const auto top = integer(b, "prompt_logprobs", 0, 20); top && kind != Kind::generate) {
    if (job.stream)
      bad("prompt_logprobs", "'prompt_logprobs' is not available with 'stream': true");
    job.prompt_top = static_cast<int>(*top);
    r.prompt_logprobs = std::max(r.prompt_logprobs, job.prompt_top);
  }
  if (kind == Kind::generate) parse_sglang_fields(b, job);  // after truncate_prompt_tokens
  r.logprobs = job.top_logprobs;
  job.tokens_as_ids = boolean(b, "return_tokens_as_token_ids").value_or(false);
  return job;
}

Handled OpenAiApi::completions(const std::string& body, const ClientGone& gone) {
  return handle(body, Kind::completion, gone);
}
Handled OpenAiApi::chat_completions(const std::string& body, const ClientGone& gone) {
  return handle(body, Kind::chat, gone);
}

std::string OpenAiApi::new_id(const std::string& prefix) const {
  static std::atomic<std::int64_t> serial{0};
  return prefix + std::to_string(created_) + "-" + std::to_string(serial++);
}

std::optional<HttpReply> OpenAiApi::too_many_samples(std::int64_t samples, std::size_t prompts,
                                                     const Job& job) const {
  // A request with more choices than the queue may hold would be refused as "retry later" on an
  // idle server too, every time: refused as too large instead.
  if (samples <= deployment_.max_queued_requests()) return std::nullopt;
  return error(400,
               str("this request asks for ", samples, " completions (", prompts,
                   " prompt(s), n samples each); the server queues at most ",
                   deployment_.max_queued_requests(),
                   " (--max-queued-requests): send fewer prompts or a smaller n"),
               job.n > 1 ? "n" : job.prompt_field);
}

Choice OpenAiApi::submit_choice(const Job& job, const std::vector<std::int32_t>& prompt,
                                std::size_t index) {
  ServeRequest r = job.request;
  r.prompt = prompt;
  static thread_local std::random_device entropy;
  r.sampling.seed = job.seeded ? job.request.sampling.seed + static_cast<std::uint64_t>(index)
                               : (static_cast<std::uint64_t>(entropy()) << 32) ^ entropy();
  return {deployment_.submit(r),
          TextStream(tokenizer_, job.stop, job.skip_special, r.min_tokens, job.include_stop),
          {},
          {},
          {},
          false,
          FinishReason::none,
          {}};
}

HttpReply OpenAiApi::refused(const RefusedError& e, const Job& job) {
  const int status = e.why() == Refusal::too_long                                      ? 413
                     : e.why() == Refusal::invalid || e.why() == Refusal::past_context ? 400
                                                                                       : 503;
  const std::string param = e.why() == Refusal::invalid        ? job.max_field
                            : e.why() == Refusal::past_context ? job.prompt_field
                                                               : "";
  return error(status, e.what(), param);
}

Handled OpenAiApi::handle(const std::string& body, Kind kind, const ClientGone& gone) {
  Job job;
  try {
    job = parse(body, kind);
  } catch (const BadRequest& e) {
    return {error(e.status, e.what(), e.param), {}};
  }
  const std::string prefix = kind == Kind::chat ? "chatcmpl-" : "cmpl-";
  job.id = new_id(prefix);
  const std::int64_t samples = static_cast<std::int64_t>(job.prompts.size()) * job.n;
  if (std::optional<HttpReply> refusal = too_many_samples(samples, job.prompts.size(), job))
    return {*refusal, {}};
  // Submit every choice (n of each prompt); a refusal withdraws the ones already in.
  auto choices = std::make_shared<std::vector<Choice>>();
  std::int64_t prompt_tokens = 0;
  for (std::size_t k = 0; k < job.prompts.size() * static_cast<std::size_t>(job.n); ++k) {
    const std::size_t i = k % static_cast<std::size_t>(job.n);
    const std::vector<std::int32_t>& prompt = job.prompts[k / static_cast<std::size_t>(job.n)];
    if (i == 0) prompt_tokens += static_cast<std::int64_t>(prompt.size());
    try {
      choices->push_back(submit_choice(job, prompt, i));
    } catch (const RefusedError& e) {
      for (Choice& c : *choices) c.stream->cancel();
      return {refused(e, job), {}};
    }
  }
  const std::string model = options_.model_name;
  const std::int64_t created = created_;

  // How logprobs name a token: its text, or (vLLM's return_tokens_as_token_ids) "token_id:N",
  // which stays exact where a token's bytes are not a whole character.
  const auto label = [this, as_ids = job.tokens_as_ids](std::int32_t id) {
    return as_ids ? "token_id:" + std::to_string(id) : token_text(id);
  };
  // The JSON of one choice's logprobs over tokens [from, to).
  const auto logprobs_json = [this, kind, label](const Choice& c, std::size_t from, std::size_t to,
                                                 std::int64_t offset) {
    if (kind == Kind::chat) {
      json content = json::array();
      for (std::size_t k = from; k < to && k < c.logprobs.size(); ++k) {
        const auto entry = [&](const TokenLogprob& t) {
          const std::string raw = token_bytes(t.token);
          return json{{"token", label(t.token)},
                      {"logprob", t.logprob},
                      {"bytes", std::vector<unsigned char>(raw.begin(), raw.end())}};
        };
        json e = entry(c.logprobs[k].chosen);
        e["top_logprobs"] = json::array();
        for (const TokenLogprob& t : c.logprobs[k].top) e["top_logprobs"].push_back(entry(t));
        content.push_back(e);
      }
      return json{{"content", content}};
    }
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    for (std::size_t k = from; k < to && k < c.logprobs.size(); ++k) {
      const std::string t = token_text(c.logprobs[k].chosen.token);
      tokens.push_back(label(c.logprobs[k].chosen.token));
      lps.push_back(c.logprobs[k].chosen.logprob);
      json top = json::object();
      for (const TokenLogprob& a : c.logprobs[k].top) top[label(a.token)] = a.logprob;
      tops.push_back(top);
      offsets.push_back(offset);
      offset += static_cast<std::int64_t>(t.size());
    }
    return json{{"tokens", tokens},
                {"token_logprobs", lps},
                {"top_logprobs", tops},
                {"text_offset", offsets}};
  };
  // With echo: the prompt's tokens (the first without a logprob, as OpenAI gives it), their text
  // offsets from 0; the completion's follow them (`join`), offsets running on. (Captures by value:
  // a stream runs it after this function has returned.)
  const auto prompt_logprobs_json = [this, label, top = job.top_logprobs](
                                        const Choice& c, const std::vector<std::int32_t>& prompt) {
    json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
    std::int64_t offset = 0;
    for (std::size_t p = 0; p < prompt.size(); ++p) {
      const std::string t = token_text(prompt[p]);
      tokens.push_back(label(prompt[p]));
      offsets.push_back(offset);
      offset += static_cast<std::int64_t>(t.size());
      if (p == 0 || p > c.prompt_logprobs.size()) {
        lps.push_back(nullptr);
        tops.push_back(nullptr);
        continue;
      }
      const StepLogprobs& lp = c.prompt_logprobs[p - 1];
      lps.push_back(lp.chosen.logprob);
      json alternatives = json::object();
      for (std::size_t i = 0; i < lp.top.size() && i < static_cast<std::size_t>(top); ++i)
        alternatives[label(lp.top[i].token)] = lp.top[i].logprob;
      tops.push_back(alternatives);
    }
    return std::pair{json{{"tokens", tokens},
                          {"token_logprobs", lps},
                          {"top_logprobs", tops},
                          {"text_offset", offsets}},
                     offset};
  };
  // vLLM's prompt_logprobs: null for the first token, then for each an object keyed by token id
  // holding the prompt's token and the `prompt_top` most likely, each with its logprob (-inf
  // written as vLLM's -9999), rank and text.
  const auto vllm_prompt_logprobs = [this, k = job.prompt_top](const Choice& c,
                                                               std::size_t prompt_length) {
    const auto entry = [this](std::int32_t token, float logprob, std::int64_t rank) {
      return json{{"logprob", logprob > -9999.0f ? logprob : -9999.0f},
                  {"rank", rank},
                  {"decoded_token", token_text(token)}};
    };
    json list = json::array({nullptr});
    for (std::size_t p = 0; p + 1 < prompt_length && p < c.prompt_logprobs.size(); ++p) {
      const StepLogprobs& lp = c.prompt_logprobs[p];
      json at = json::object();
      at[std::to_string(lp.chosen.token)] = entry(lp.chosen.token, lp.chosen.logprob, lp.rank);
      for (std::size_t i = 0; i < lp.top.size() && i < static_cast<std::size_t>(k); ++i)
        at[std::to_string(lp.top[i].token)] =
            entry(lp.top[i].token, lp.top[i].logprob, static_cast<std::int64_t>(i) + 1);
      list.push_back(std::move(at));
    }
    return list;
  };
  const auto join = [](json head, json tail) {
    for (const char* key : {"tokens", "token_logprobs", "top_logprobs", "text_offset"}) {
      for (json& x : tail[key]) head[key].push_back(std::move(x));
    }
    return head;
  };
  // Each prompt counts once (its first choice's), as do the tokens of it the prefix cache held.
  const auto cached = [n = static_cast<std::size_t>(job.n)](const std::vector<Choice>& cs) {
    std::int64_t tokens = 0;
    for (std::size_t k = 0; k < cs.size(); k += n) tokens += cs[k].cached_tokens;
    return tokens;
  };
  const auto usage = [prompt_tokens, cached](const std::vector<Choice>& cs) {
    std::int64_t completion = 0;
    for (const Choice& c : cs) completion += static_cast<std::int64_t>(c.text.tokens().size());
    return json{{"prompt_tokens", prompt_tokens},
                {"completion_tokens", completion},
                {"total_tokens", prompt_tokens + completion},
                {"prompt_tokens_details", {{"cached_tokens", cached(cs)}}}};
  };
  const auto reason = [](const Choice& c) { return finish_text(c.reason, c.text.stopped()); };
  // The ids of choice i's tool calls where the model writes none: "call-<request>-<i>-<k>".
  const auto call_id = [id = job.id.substr(prefix.size())](std::size_t i) {
    return str("call-", id, "-", i);
  };
  if (!job.stream) {
    const auto stops = [&job](std::size_t) -> const std::vector<std::int32_t>& {
      return job.request.stop_token_ids;
    };
    if (std::optional<HttpReply> ended = wait_for_all(*choices, stops, job.echo_only, gone))
      return {*ended, {}};
    json list = json::array();
    for (std::size_t i = 0; i < choices->size(); ++i) {
      const Choice& c = (*choices)[i];
      json choice = {{"index", i}, {"finish_reason", reason(c)}, {"token_ids", c.text.tokens()}};
      const std::size_t prompt_of = i / static_cast<std::size_t>(job.n);
      const std::size_t kept = c.text.tokens().size();
      if (job.top_logprobs < 0) {
        choice["logprobs"] = nullptr;
      } else if (job.echo) {
        auto [head, end] = prompt_logprobs_json(c, job.prompts[prompt_of]);
        choice["logprobs"] = join(std::move(head), logprobs_json(c, 0, kept, end));
      } else {
        choice["logprobs"] = logprobs_json(c, 0, kept, 0);
      }
      if (kind == Kind::chat) {
        ChatReply said(job.tools, call_id(i), job.reasoning, job.include_reasoning,
                       job.reasoning_markers);
        choice["message"] = said.message(c.shown);
        if (said.ends_in_tool_calls() && c.reason != FinishReason::length)
          choice["finish_reason"] = "tool_calls";
      } else {
        choice["text"] = job.echo ? *job.prompt_texts[prompt_of] + c.shown : c.shown;
        if (job.prompt_top >= 0)
          choice["prompt_logprobs"] = vllm_prompt_logprobs(c, job.prompts[prompt_of].size());
      }
      list.push_back(choice);
    }
    json reply = {{"id", job.id},
                  {"object", kind == Kind::chat ? "chat.completion" : "text_completion"},
                  {"created", created},
                  {"model", model},
                  {"choices", list},
                  {"usage", usage(*choices)}};
    // Chat: one prompt, its logprobs beside the choices (vLLM's place for them).
    if (kind == Kind::chat && job.prompt_top >= 0)
      reply["prompt_logprobs"] = vllm_prompt_logprobs(choices->front(), job.prompts.front().size());
    return {HttpReply{200, "application/json", text_of(reply)}, {}};
  }

  // Streaming: server-sent events as tokens arrive, then data: [DONE].
  Handled h;
  h.stream = [=, this](const ChunkWriter& write) {
    const char* object = kind == Kind::chat ? "chat.completion.chunk" : "text_completion";
    // A chunk of choices; with continuous_usage_stats, the usage of the prompt and `completion`
    // tokens so far (those of the chunk's choice).
    const auto chunk = [&](json choice_list, std::size_t prompt, std::size_t completion) {
      json j = {{"id", job.id},
                {"object", object},
                {"created", created},
                {"model", model},
                {"choices", std::move(choice_list)}};
      if (job.continuous_usage)
        j["usage"] = {{"prompt_tokens", prompt},
                      {"completion_tokens", completion},
                      {"total_tokens", prompt + completion}};
      return sse(j);
    };
    const auto abandon = [&] {  // the client went away: free its KV now
      for (Choice& c : *choices) c.stream->cancel();
    };
    if (kind == Kind::chat) {
      json first = json::array();
      for (std::size_t i = 0; i < choices->size(); ++i)
        first.push_back({{"index", i},
                         {"delta", {{"role", "assistant"}, {"content", ""}}},
                         {"finish_reason", nullptr}});
      if (!write(chunk(first, job.prompts.front().size(), 0))) return abandon();
    }
    std::vector<ChatReply> replies;  // chat: what each choice's text says
    for (std::size_t i = 0; i < choices->size(); ++i)
      replies.emplace_back(job.tools, call_id(i), job.reasoning, job.include_reasoning,
                           job.reasoning_markers);
    std::vector<std::size_t> sent_lp(choices->size(), 0);
    std::vector<std::int64_t> offsets(choices->size(), 0);
    std::vector<bool> closed(choices->size(), false), echoed(choices->size(), false);
    std::size_t open = choices->size();
    while (open > 0) {
      for (std::size_t i = 0; i < choices->size(); ++i) {
        Choice& c = (*choices)[i];
        if (closed[i]) continue;
        const std::string text = pull_news(
            c, job.request.stop_token_ids,
            choices->size() == 1 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(5),
            job.echo_only);
        const std::size_t kept = c.text.tokens().size();
        // A token that completes no character (or is held back for a stop string) sends nothing,
        // unless the client follows ids or logprobs.
        const bool ids_matter = job.top_logprobs >= 0;
        if (text.empty() && !c.finished && (kept == sent_lp[i] || !ids_matter)) continue;
        if (!c.error.empty()) {
          write(sse({{"error", json::parse(error(500, c.error).body)["error"]}}));
          return abandon();
        }
        // Chat: the delta (the thinking apart; tool calls read at the end: text may wait).
        json delta;
        if (kind == Kind::chat) {
          delta = replies[i].delta(text, c.finished);
          if (delta.is_null() && job.top_logprobs < 0) continue;
        }
        json choice = {{"index", i},
                       {"finish_reason", !c.finished ? json(nullptr)
                                         : kind == Kind::chat && replies[i].ends_in_tool_calls() &&
                                                 c.reason != FinishReason::length
                                             ? json("tool_calls")
                                             : json(reason(c))}};
        // echo: the choice's first chunk leads with its prompt (and the prompt's logprobs).
        const bool lead = job.echo && !echoed[i];
        const std::size_t prompt_of = i / static_cast<std::size_t>(job.n);
        json head;
        if (lead && job.top_logprobs >= 0)
          std::tie(head, offsets[i]) = prompt_logprobs_json(c, job.prompts[prompt_of]);
        choice["logprobs"] = job.top_logprobs < 0 ? json(nullptr)
                             : lead ? join(head, logprobs_json(c, sent_lp[i], kept, offsets[i]))
                                    : logprobs_json(c, sent_lp[i], kept, offsets[i]);
        for (std::size_t k = sent_lp[i]; k < kept && k < c.logprobs.size(); ++k)
          offsets[i] += static_cast<std::int64_t>(token_text(c.logprobs[k].chosen.token).size());
        if (kind == Kind::chat) {
          choice["delta"] = delta.is_null() ? json{{"content", ""}} : delta;
        } else {
          choice["text"] = lead ? *job.prompt_texts[prompt_of] + text : text;
        }
        if (lead) echoed[i] = true;
        const std::string out = chunk(json::array({choice}), job.prompts[prompt_of].size(), kept);
        sent_lp[i] = kept;
        if (!write(out)) return abandon();
        if (c.finished) {
          closed[i] = true;
          --open;
        }
      }
    }
    if (job.include_usage) {
      json u = {{"id", job.id}, {"object", object}, {"created", created}, {"model", model},
                {"choices", json::array()}, {"usage", usage(*choices)}};
      if (!write(sse(u))) return;
    }
    write("data: [DONE]\n\n");
  };
  return h;
}

namespace {

json model_object(const std::string& name, std::int64_t created, std::int64_t context) {
  return {{"id", name},
          {"object", "model"},
          {"created", created},
          {"owned_by", "dcp"},
          {"max_model_len", context}};
}

}  // namespace

HttpReply OpenAiApi::models() const {
  const json m = model_object(options_.model_name, created_, deployment_.context_tokens());
  return {200, "application/json", text_of(json{{"object", "list"}, {"data", json::array({m})}})};
}

HttpReply OpenAiApi::model(const std::string& id) const {
  if (id != options_.model_name)
    return error(
        404,
        str("the model '", id, "' does not exist; this server serves '", options_.model_name, "'"),
        "model");
  return {200, "application/json",
          text_of(model_object(options_.model_name, created_, deployment_.context_tokens()))};
}

HttpReply OpenAiApi::reset_prefix_cache() {
  if (!deployment_.prefix_cache_enabled())
    return error(400, "the prefix cache is off: start dcp serve with --enable-prefix-cache");
  deployment_.reset_prefix_cache();
  return {200, "application/json", "{}"};
}

HttpReply OpenAiApi::health() const {
  if (!deployment_.ready()) return error(503, "the model is loading");
  return {200, "application/json", "{}"};
}

HttpReply OpenAiApi::metrics() const {
  const ServeMetrics m = deployment_.metrics();
  std::ostringstream o;
  const auto metric = [&](const char* name, const char* type, const char* help) {
    o << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  };
  // A series of one value, unlabelled: its name is written once.
  const auto single = [&](const char* name, const char* type, const char* help,
                          std::int64_t value) {
    metric(name, type, help);
    o << name << " " << value << "\n";
  };
  single("dcp_num_running_reqs", "gauge", "Requests in a running batch.", m.running);
  single("dcp_num_queued_reqs", "gauge", "Requests waiting for KV.", m.queued);
  metric("dcp_kv_rows_used", "gauge", "KV rows held per layer on each rank (its DCP shard).");
  for (std::size_t r = 0; r < m.kv_rows_used.size(); ++r)
    o << "dcp_kv_rows_used{rank=\"" << r << "\"} " << m.kv_rows_used[r] << "\n";
  metric("dcp_kv_rows_capacity", "gauge", "KV rows per layer each rank can hold.");
  for (std::size_t r = 0; r < m.kv_rows_capacity.size(); ++r)
    o << "dcp_kv_rows_capacity{rank=\"" << r << "\"} " << m.kv_rows_capacity[r] << "\n";
  single("dcp_prompt_tokens_total", "counter", "Prompt tokens of accepted requests.",
         m.prompt_tokens);
  single("dcp_generation_tokens_total", "counter", "Tokens generated.", m.generation_tokens);
  metric("dcp_requests_total", "counter", "Requests ended, by outcome.");
  o << "dcp_requests_total{outcome=\"finished\"} " << m.requests_finished << "\n"
    << "dcp_requests_total{outcome=\"cancelled\"} " << m.requests_cancelled << "\n"
    << "dcp_requests_total{outcome=\"rejected\"} " << m.requests_rejected << "\n";
  const PrefixCacheTokens& pc = m.prefix_cache;
  single("dcp_prefix_cache_lookup_tokens_total", "counter",
         "Prompt tokens looked up in the prefix cache.", pc.lookup);
  single("dcp_prefix_cache_hit_tokens_total", "counter",
         "Prompt tokens served from the prefix cache.", pc.hit);
  metric("dcp_prefix_cache_tokens", "gauge",
         "Tokens of the pages the prefix cache holds, by tier.");
  o << "dcp_prefix_cache_tokens{tier=\"device\"} " << pc.on_device << "\n"
    << "dcp_prefix_cache_tokens{tier=\"host\"} " << pc.on_host << "\n";
  single("dcp_prefix_cache_offloaded_tokens_total", "counter",
         "Tokens of cached pages evicted from the device to the host tier.", pc.offloaded);
  single("dcp_prefix_cache_reloaded_tokens_total", "counter",
         "Tokens of cached pages brought back from the host tier for a hit.", pc.reloaded);
  single("dcp_prefix_cache_dropped_tokens_total", "counter",
         "Tokens of cached pages evicted for good (from either tier).", pc.dropped);
  if (deployment_.disaggregated()) {
    single("dcp_disagg_kv_transfers_total", "counter",
           "Requests whose prompt KV moved from the prefill group to the decode side.",
           m.kv_transfers);
    single("dcp_disagg_kv_transfer_bytes_total", "counter",
           "Bytes of prompt KV the decode ranks received (headers included).", m.kv_transfer_bytes);
    single("dcp_disagg_awaiting_transfer", "gauge",
           "Computed prompts waiting for the decode side's KV (counted in the queue too).",
           m.awaiting_transfer);
  }
  if (deployment_.spec().engine.num_draft_tokens > 0) {
    single("dcp_spec_decode_drafts_total", "counter",
           "Request steps that verified draft tokens (speculative decoding).",
           m.spec_verifications);
    single("dcp_spec_decode_draft_tokens_total", "counter", "Draft tokens proposed.",
           m.spec_proposed);
    single("dcp_spec_decode_accepted_tokens_total", "counter", "Draft tokens the target kept.",
           m.spec_accepted);
  }
  const auto histogram = [&](const char* name, const char* help, const LatencyHistogram& h) {
    metric(name, "histogram", help);
    std::int64_t cum = 0;
    for (std::size_t b = 0; b < std::size(LatencyHistogram::kBounds); ++b) {
      cum += h.counts[b];
      o << name << "_bucket{le=\"" << LatencyHistogram::kBounds[b] << "\"} " << cum << "\n";
    }
    o << name << "_bucket{le=\"+Inf\"} " << h.count << "\n"
      << name << "_sum " << h.sum_s << "\n" << name << "_count " << h.count << "\n";
  };
  histogram("dcp_time_to_first_token_seconds", "Time from arrival to the first token.",
            m.time_to_first_token);
  histogram("dcp_inter_token_latency_seconds", "Time between a request's tokens.",
            m.inter_token_latency);
  histogram("dcp_e2e_request_latency_seconds",
            "Time from arrival to the last token, of the requests that finished.",
            m.request_latency);
  return {200, "text/plain; version=0.0.4", o.str()};
}

}  // namespace dcp::serve
