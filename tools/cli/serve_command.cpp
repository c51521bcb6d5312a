// `dcp serve`: the deployment of `dcp run`, kept running behind an OpenAI-compatible HTTP server.
// Ranks run as threads by default; under `mpirun --comm mpi` world rank 0 serves HTTP and the
// other processes follow its step decisions.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "cli/cli_checks.h"
#include "cli/commands.h"
#include "cli/run_workload.h"
#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/generation_config.h"
#include "dcp/serving.h"
#include "dcp/text_stream.h"
#include "dcp/tokenizer.h"
#include "dcp/tool_calls.h"
#include "serve/http_server.h"
#include "serve/openai_api.h"

namespace dcp::cli {
namespace {

volatile std::sig_atomic_t g_signals = 0;  // SIGINT and SIGTERM received

struct ServeFlags {
  RunOptions run;  // the model, parallel, KV and engine flags shared with `dcp run`
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string tokenizer_path;
  std::string chat_template;  // a file replacing the tokenizer's template
  std::string served_model_name;
  std::string api_key;  // empty: no key asked
  int max_queued = 256;
  int default_max_tokens = 128;
  std::string generation_config = "auto";  // auto: the checkpoint's sampling defaults; vllm: none
  std::int64_t max_model_len = 0;         // 0: the model's max_position_embeddings
  std::string tool_call_parser = "auto";  // how tool_choice "auto" reads the model's calls
  std::string reasoning_parser = "none";  // how a chat reply's thinking is told from its content
};

// "temperature 0.6, top_p 0.95": the defaults a checkpoint states, for the startup log.
std::string describe(const SamplingDefaults& d) {
  std::string out;
  const auto add = [&](const char* name, auto v) {
    if (v) out += str(out.empty() ? "" : ", ", name, " ", *v);
  };
  add("temperature", d.temperature);
  add("top_p", d.top_p);
  add("top_k", d.top_k);
  add("min_p", d.min_p);
  add("repetition_penalty", d.repetition_penalty);
  return out;
}

std::unique_ptr<Tokenizer> load_tokenizer(const ServeFlags& f, int model_vocab) {
  std::string dir = f.tokenizer_path;
  if (dir.empty()) {
    if (f.run.model_path.empty() || !Tokenizer::found_in(f.run.model_path)) {
      DCP_ARG_CHECK(f.chat_template.empty(),
                    "--chat-template needs a tokenizer: --tokenizer-path, "
                    "or a --model-path that has one");
      return nullptr;  // token ids only
    }
    dir = f.run.model_path;
  }
  const char* flag = f.tokenizer_path.empty() ? "--model-path" : "--tokenizer-path";
  auto tok = with_flag(flag, [&] { return std::make_unique<Tokenizer>(Tokenizer::from_dir(dir)); });
  DCP_ARG_CHECK(tok->vocab_size() <= model_vocab, flag, " ", dir, ": the tokenizer's ",
                tok->vocab_size(), " ids exceed the model's vocabulary of ", model_vocab);
  if (!f.chat_template.empty()) {
    use_chat_template_file(*tok, f.chat_template);
  } else if (tok->chat_template()) {
    // The server still serves completions and token ids; say now why chats will be refused.
    try {
      ChatTemplate parsed(*tok->chat_template());
    } catch (const Error& e) {
      std::fprintf(stderr,
                   "dcp serve: warning: the chat template of %s does not parse (%s); chat "
                   "requests will be refused: --chat-template FILE gives one that does\n",
                   dir.c_str(), e.what());
    }
  }
  return tok;
}

int serve(const ServeFlags& f) {
  RunOptions o = f.run;
  o.verify = false;
  // build_workload sizes and checks a deployment for a workload; a server's is one request of
  // one token, with the KV capacity --max-total-tokens asks for.
  o.batch = 1;
  o.prompt_len = 1;
  o.max_new_tokens = 1;
  DCP_ARG_CHECK(o.comm != "threads" || launcher_world_size() == 1, "--comm threads under mpirun "
                "with ", launcher_world_size(), " processes: each would serve the whole model on "
                "its own; pass --comm mpi for one rank per process");
  Workload w = build_workload(o);
  w.spec.requests.clear();
  resolve(w.spec.parallel);
  const bool frontend = w.spec.transport == RankTransport::threads || launcher_rank() == 0;

  // SIGINT/SIGTERM only count (any thread may run the handler: BLAS starts threads before
  // main); a watcher thread of the frontend acts on the count. This also takes the signals back
  // from SIG_IGN, which a shell gives background jobs.
  struct sigaction action {};
  action.sa_handler = [](int) { g_signals = g_signals + 1; };
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);

  // Every process loads the tokenizer: guided requests mask tokens by their bytes on every rank.
  const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(f, w.spec.model.config.vocab_size);
  if (tokenizer)
    w.spec.engine.guide_vocabulary = guide_vocabulary(*tokenizer, w.spec.model.config.vocab_size);
  ServeOptions so;
  so.max_queued_requests = f.max_queued;
  const int positions = w.spec.model.config.max_position_embeddings;
  DCP_ARG_CHECK(f.max_model_len <= positions, "--max-model-len ", f.max_model_len,
                " passes the model's context, max_position_embeddings = ", positions,
                " (legal: 1 to ", positions, ")");
  so.max_model_len = f.max_model_len;
  so.prefill_dcp_size = o.disaggregate ? o.prefill_dcp_size : 0;
  ServingDeployment deployment(w.spec, so);
  if (!frontend) {  // follows rank 0's decisions until it shuts down
    deployment.run();
    return 0;
  }
  serve::ApiOptions ao;
  ao.model_name = f.served_model_name.empty() ? w.model_label : f.served_model_name;
  ao.model_path = f.run.model_path;
  if (tokenizer) ao.tokenizer_path = f.tokenizer_path.empty() ? f.run.model_path : f.tokenizer_path;
  if (!f.run.model_path.empty())
    ao.eos_token_ids = with_flag("--model-path", [&] {
      return checkpoint_eos_token_ids(f.run.model_path, w.spec.model.config.vocab_size);
    });
  ao.default_max_tokens = f.default_max_tokens;
  if (f.generation_config == "auto" && !f.run.model_path.empty()) {
    ao.sampling_defaults = with_flag(
        "--generation-config", [&] { return checkpoint_sampling_defaults(f.run.model_path); });
    const std::string stated = describe(ao.sampling_defaults);
    if (!stated.empty())
      std::fprintf(stderr,
                   "dcp serve: requests that leave them out sample with the checkpoint's "
                   "generation_config.json: %s (--generation-config vllm: the API's defaults)\n",
                   stated.c_str());
  }
  ao.reasoning_parser = f.reasoning_parser == "deepseek_r1"   ? serve::ReasoningParser::deepseek_r1
                        : f.reasoning_parser == "deepseek_v3" ? serve::ReasoningParser::deepseek_v3
                        : f.reasoning_parser == "kimi_k2"     ? serve::ReasoningParser::kimi_k2
                        : f.reasoning_parser == "minicpm3"    ? serve::ReasoningParser::minicpm3
                                                              : serve::ReasoningParser::none;
  DCP_ARG_CHECK(ao.reasoning_parser == serve::ReasoningParser::none || tokenizer,
                "--reasoning-parser ", f.reasoning_parser,
                " needs a tokenizer: --tokenizer-path, or a --model-path that has one");
  if (f.tool_call_parser == "auto") {
    if (tokenizer) ao.tool_call_format = tool_call_format_of(*tokenizer);
  } else {
    DCP_ARG_CHECK(tokenizer, "--tool-call-parser ", f.tool_call_parser,
                  " needs a tokenizer: --tokenizer-path, or a --model-path that has one");
    ao.tool_call_format = tool_call_format_named(f.tool_call_parser);
  }
  serve::OpenAiApi api(deployment, tokenizer.get(), ao);
  serve::HttpServer http(api, {f.api_key});
  const int port = http.bind(f.host, f.port);  // before loading: a taken port fails at once
  std::thread listener([&] { http.listen(); });

  std::atomic<bool> done{false};
  std::thread watcher([&] {
    int seen = 0;
    while (!done) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (g_signals <= seen) continue;
      // First signal: stop taking requests, let those in flight finish. Second: cancel them.
      std::fprintf(stderr, "dcp serve: %s\n",
                   seen == 0 ? "signal: finishing the requests in flight (again to cancel them)"
                             : "signal: cancelling the requests in flight");
      deployment.shutdown(seen == 0);
      seen = g_signals;
    }
  });
  try {
    deployment.run([&] {
      // What tool_choice "auto" reads (auto-detected or asked for) and the reasoning parser.
      const std::string readers =
          tokenizer ? str(", tool calls: ",
                          ao.tool_call_format ? tool_call_format_name(*ao.tool_call_format)
                                              : "required or named only",
                          ", reasoning: ", f.reasoning_parser)
                    : "";
      const std::string prefill =
          so.prefill_dcp_size > 0 ? str("prefill DCP ", so.prefill_dcp_size, " + decode ") : "";
      const std::string speculative =
          f.run.spec_tokens > 0
              ? str(", speculative: ", f.run.spec_tokens, " draft tokens from ", f.run.spec_draft)
              : "";
      std::printf(
          "dcp serve: listening on http://%s:%d (model '%s', %d ranks, %sTP %d, DCP %d, "
          "KV %lld tokens, context %lld%s, %s%s)\n",
          f.host.c_str(), port, ao.model_name.c_str(),
          w.spec.parallel.world_size() + so.prefill_dcp_size, prefill.c_str(),
          w.spec.parallel.tp_size, w.spec.parallel.dcp_size,
          static_cast<long long>(deployment.kv_capacity_tokens()),
          static_cast<long long>(deployment.context_tokens()), speculative.c_str(),
          tokenizer ? "text and token ids" : "token ids only: no tokenizer", readers.c_str());
      std::fflush(stdout);
    });
  } catch (...) {
    done = true;
    http.stop();
    listener.join();
    watcher.join();
    throw;
  }
  done = true;
  http.stop();
  listener.join();
  watcher.join();
  std::printf("dcp serve: stopped\n");
  return 0;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  f->run.parallel.tp_size = 1;
  f->run.parallel.dcp_size = 1;
  f->run.max_total_tokens = 65536;
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve the model over HTTP: OpenAI-compatible /v1/completions and "
      "/v1/chat/completions, SGLang's /generate, vLLM's /tokenize and /detokenize, "
      "/v1/models, /health, /metrics");
  RunOptions& o = f->run;
  add_parallel_flags(cmd, o.parallel);
  add_deployment_flags(cmd, o);
  cmd->add_option("--tokenizer-path", f->tokenizer_path,
                  "folder with tokenizer.json, or Kimi's tiktoken.model, and the chat template "
                  "(chat_template.jinja, else tokenizer_config.json's) (default: --model-path "
                  "when it has one)");
  cmd->add_option("--chat-template", f->chat_template, kChatTemplateHelp)->type_name("FILE");
  cmd->add_option("--tool-call-parser", f->tool_call_parser,
                  "how replies to tool_choice \"auto\" are read for tool calls: deepseek_v3 "
                  "(DeepSeek V3 and V3.1), kimi_k2, minicpm3 (Python calls between "
                  "<|tool_call_start|> and <|tool_call_end|>), or auto (the format whose tokens "
                  "the tokenizer holds; none: \"auto\" is refused)")
      ->check(CLI::IsMember({"auto", "deepseek_v3", "kimi_k2", "minicpm3"}))
      ->capture_default_str();
  cmd->add_option("--reasoning-parser", f->reasoning_parser,
                  "how chat replies' thinking is returned apart (reasoning_content): deepseek_r1 "
                  "(every reply starts with it, closed by </think>), deepseek_v3 (the same where "
                  "chat_template_kwargs.thinking is true: V3.1), kimi_k2 (the same unless it is "
                  "false: Kimi-K2-Thinking; a tool-call section also ends the thinking), minicpm3 "
                  "(a reply that opens with <|thought_start|> thinks up to <|thought_end|>), or "
                  "none")
      ->check(CLI::IsMember({"none", "deepseek_r1", "deepseek_v3", "kimi_k2", "minicpm3"}))
      ->capture_default_str();
  cmd->add_option("--host", f->host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", f->port, "port to listen on (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->add_option("--served-model-name", f->served_model_name,
                  "the model's name in the API (default: the path or preset:NAME)");
  cmd->add_option(
         "--api-key", f->api_key,
         "require 'Authorization: Bearer KEY' on every request but GET /health and "
         "/metrics (or from $DCP_API_KEY when not empty, which keeps it out of the process "
         "list)")
      ->envname("DCP_API_KEY")
      ->check(CLI::Validator(
          [](std::string& key) { return key.empty() ? std::string("must not be empty") : ""; },
          "KEY"));
  cmd->add_option("--max-total-tokens", o.max_total_tokens,
                  "KV capacity in tokens: the longest prompt + completion, and what running "
                  "requests share")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-queued-requests", f->max_queued,
                  "requests that may wait for KV; beyond, HTTP 503")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-model-len", f->max_model_len,
                  "a request's prompt + completion at most (default: the model's "
                  "max_position_embeddings, its most)")
      ->check(at_least(1));
  cmd->add_option("--default-max-tokens", f->default_max_tokens,
                  "new tokens when a request sets no max_tokens (capped by the context)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--generation-config", f->generation_config,
                  "auto: a request that leaves out temperature, top_p, top_k, min_p or "
                  "repetition_penalty takes the checkpoint's generation_config.json value (as "
                  "vLLM); vllm: the API's defaults")
      ->check(CLI::IsMember({"auto", "vllm"}))
      ->capture_default_str();
  cmd->callback([f] { set_exit_code(serve(*f)); });
}

}  // namespace dcp::cli
