// `dcp run`: the main job. Loads a model (preset or checkpoint), runs requests through the engine
// with DCP, prints a summary, and with --verify checks the result against DCP 1 (same TP).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "cli_checks.h"
#include "commands.h"
#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/weights.h"
#include "parallel_flags.h"
#include "run_workload.h"

namespace dcp::cli {
namespace {

using json = nlohmann::ordered_json;

struct RunOptions {
  ParallelFlags parallel;
  std::string model_path;
  std::string preset = "tiny";
  int num_layers = 0;
  int page_size = 64;
  std::string kv_cache_dtype = "bf16";
  std::string attention_kernel = "automatic";
  int chunked_prefill_size = 2048;
  std::int64_t max_total_tokens = 0;  // 0: enough for the workload
  int batch = 4;
  int prompt_len = 4000;
  int max_new_tokens = 32;
  std::uint64_t seed = 1;
  std::string comm = "threads";
  bool verify = true;
  std::string json_path;
  std::string prompt_tokens;
  std::string dump_logits;
  int spec_tokens = 0;
  std::string spec_draft = "target:1";
  std::string dcp_extend = "gather";
  bool disaggregate = false;
  int prefill_dcp_size = 1;
  bool prefix_cache = false;
  std::int64_t host_kv_tokens = 0;
  int shared_prefix_len = 0;
  int max_running = 64;
};

std::vector<std::int32_t> parse_ids(const std::string& text, const std::string& where) {
  std::vector<std::int32_t> ids;
  std::string cleaned = text;
  std::replace(cleaned.begin(), cleaned.end(), ',', ' ');
  std::istringstream in(cleaned);
  std::string tok;
  while (in >> tok) {
    try {
      std::size_t used = 0;
      const long v = std::stol(tok, &used);
      if (used != tok.size() || v < 0 || v > INT32_MAX) throw std::invalid_argument(tok);
      ids.push_back(static_cast<std::int32_t>(v));
    } catch (const std::exception&) {
      throw Error(ErrorCategory::invalid_argument,
                  str("--prompt-tokens: '", tok, "' in ", where,
                      " is not a token id (an integer in [0, 2^31))"));
    }
  }
  return ids;
}

// One prompt per ';'-separated list, or per line of a file.
std::vector<std::vector<std::int32_t>> read_prompts(const std::string& arg) {
  std::vector<std::vector<std::int32_t>> prompts;
  if (std::filesystem::is_regular_file(arg)) {
    std::ifstream in(arg);
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      auto ids = parse_ids(line, str(arg, " line ", n));
      if (!ids.empty()) prompts.push_back(std::move(ids));
    }
  } else {
    std::istringstream in(arg);
    std::string part;
    while (std::getline(in, part, ';')) {
      auto ids = parse_ids(part, "the list");
      if (!ids.empty()) prompts.push_back(std::move(ids));
    }
  }
  DCP_ARG_CHECK(!prompts.empty(), "--prompt-tokens '", arg, "' holds no token ids");
  return prompts;
}

// --attention-kernel: a path this CPU runs, checked before any rank starts. amx_bf16 reads bf16 KV.
KernelPath parse_attention_kernel(const std::string& name, KvDtype kv_dtype) {
  KernelPath k = KernelPath::automatic;
  try {
    k = parse_kernel_path(name);
    if (k == KernelPath::amx_bf16) {
      DCP_CHECK(amx_bf16_available(), unsupported, "this CPU or OS offers no AMX-BF16");
      DCP_ARG_CHECK(kv_dtype == KvDtype::bf16, "amx_bf16 needs --kv-cache-dtype bf16");
    } else {
      resolve_exact_path(k);
    }
  } catch (const Error& e) {
    throw Error(e.category(), str("--attention-kernel ", name, ": ", e.what()));
  }
  return k;
}

// The path that runs: automatic resolved to this CPU's fastest exact path.
std::string kernel_name(KernelPath k) {
  return std::string(to_string(k == KernelPath::amx_bf16 ? k : resolve_exact_path(k)));
}

Workload build_workload(const RunOptions& o) {
  Workload w;  // single flags' ranges and names are checked as they parse (add_run_command)
  if (!o.model_path.empty()) {
    w.model = with_flag("--model-path", [&] { return read_checkpoint_config(o.model_path); });
    if (o.num_layers > 0) {
      DCP_ARG_CHECK(o.num_layers <= w.model.num_hidden_layers, "--num-layers ", o.num_layers,
                    " exceeds the checkpoint's ", w.model.num_hidden_layers, " layers");
      w.model.num_hidden_layers = o.num_layers;
    }
    w.model_path = o.model_path;
  } else {
    w.model = preset_config(o.preset, o.num_layers);
  }
  w.parallel = o.parallel.to_config();
  // Checked again by every rank's model; here it fails before any rank thread starts.
  check_divides_heads(w.model, w.parallel.tp_size, "--tp-size");
  w.comm = o.comm;
  w.model_options.replicate_q_proj = w.parallel.replicate_q_proj;
  w.model_options.kv_dtype = parse_kv_dtype(o.kv_cache_dtype);
  w.model_options.page_size = o.page_size;
  w.model_options.attention_kernel =
      parse_attention_kernel(o.attention_kernel, w.model_options.kv_dtype);
  w.engine.chunked_prefill_size = o.chunked_prefill_size;
  w.engine.record_logits = o.verify || !o.dump_logits.empty();

  w.engine.enable_prefix_cache = o.prefix_cache;
  w.engine.host_kv_capacity_tokens = o.host_kv_tokens;
  w.engine.max_running_requests = o.max_running;
  DCP_ARG_CHECK(o.shared_prefix_len < o.prompt_len, "--shared-prefix-len ", o.shared_prefix_len,
                " must be below --prompt-len ", o.prompt_len);
  DCP_ARG_CHECK(!o.prefix_cache || !o.disaggregate,
                "--enable-prefix-cache does not combine with --disaggregate yet");
  w.disaggregate = o.disaggregate;
  w.prefill_dcp_size = o.prefill_dcp_size;
  DCP_ARG_CHECK(!o.disaggregate || o.spec_tokens == 0,
                "--disaggregate does not combine with --speculative-num-draft-tokens yet");
  if (o.disaggregate) {  // refuse an unsupported pair before any rank starts
    const KvDtype dtype = w.model_options.kv_dtype;
    make_transfer_plan({o.prefill_dcp_size, o.page_size, dtype},
                       {w.parallel.dcp_size, o.page_size, dtype}, 0, 0);
  }
  w.engine.extend_mode =
      o.dcp_extend == "native" ? ForwardMode::extend_native : ForwardMode::extend;
  if (o.spec_tokens > 0) {
    w.engine.num_draft_tokens = o.spec_tokens;
    if (o.spec_draft.rfind("target:", 0) == 0) {  // the target's first layers, its weights
      int layers = 0;
      try {
        layers = std::stoi(o.spec_draft.substr(7));
      } catch (const std::exception&) {
      }
      DCP_ARG_CHECK(layers >= 1 && layers <= w.model.num_hidden_layers, "--speculative-draft '",
                    o.spec_draft, "': target:N needs 1 <= N <= ", w.model.num_hidden_layers);
      w.draft_model = w.model;
      w.draft_model->num_hidden_layers = layers;
      w.draft_path = w.model_path;
      w.draft_seed = w.weight_seed;
    } else if (std::filesystem::is_directory(o.spec_draft)) {
      w.draft_model =
          with_flag("--speculative-draft", [&] { return read_checkpoint_config(o.spec_draft); });
      w.draft_path = o.spec_draft;
    } else {
      w.draft_model = preset_config(o.spec_draft);
      w.draft_seed = o.seed + 1;
    }
    DCP_ARG_CHECK(w.draft_model->vocab_size == w.model.vocab_size, "--speculative-draft '",
                  o.spec_draft, "' has a vocabulary of ", w.draft_model->vocab_size,
                  ", the target ", w.model.vocab_size);
  }
  // Prompt lengths first: a workload too large for this machine is refused before its prompts
  // are generated (gigabytes of tokens for --prompt-len 2000000000) or its KV pools allocated.
  std::vector<std::vector<std::int32_t>> prompts;
  std::vector<std::int64_t> lengths;
  if (!o.prompt_tokens.empty()) {
    prompts = read_prompts(o.prompt_tokens);
    for (const auto& p : prompts) lengths.push_back(static_cast<std::int64_t>(p.size()));
  } else {
    for (int i = 0; i < o.batch; ++i) {  // mixed lengths, not multiples of N or of the page size
      lengths.push_back(std::max<std::int64_t>(
          1, o.prompt_len - static_cast<std::int64_t>(i) * (o.prompt_len / (2 * o.batch)) - 7 * i));
    }
  }
  std::int64_t total = 0;
  for (const std::int64_t len : lengths) total += len + o.max_new_tokens;
  const std::int64_t vp = static_cast<std::int64_t>(o.page_size) * w.parallel.dcp_size;
  const std::int64_t capacity = o.max_total_tokens > 0
                                    ? o.max_total_tokens
                                    : total + static_cast<std::int64_t>(lengths.size()) * vp;
  w.model_options.kv_capacity_tokens = capacity;
  {
    // Every rank of this process holds capacity / N rows per layer; the --verify reference, run
    // afterwards at DCP 1, holds all of them on every rank.
    const double ranks_here = o.comm == "mpi" ? 1.0 : w.parallel.world_size();
    const double row_bytes = static_cast<double>(w.model.latent_width()) *
                             dtype_size(w.model_options.kv_dtype) * w.model.num_hidden_layers;
    const double rows = static_cast<double>(capacity) / (o.verify ? 1 : w.parallel.dcp_size);
    const bool asked = o.max_total_tokens > 0;
    check_fits_in_memory(
        ranks_here * rows * row_bytes,
        str("a KV cache of ", capacity, " tokens",
            asked ? " (--max-total-tokens)" : " (the prompts and --max-new-tokens)", " over ",
            w.model.num_hidden_layers, " layers"),
        asked ? "lower --max-total-tokens" : "lower --prompt-len, --batch or --max-new-tokens");
  }
  if (o.prompt_tokens.empty()) {
    std::mt19937_64 gen(o.seed);
    std::uniform_int_distribution<std::int32_t> token(0, w.model.vocab_size - 1);
    std::vector<std::int32_t> shared(static_cast<std::size_t>(o.shared_prefix_len));
    for (auto& t : shared) t = token(gen);
    for (const std::int64_t len : lengths) {
      std::vector<std::int32_t> p(static_cast<std::size_t>(len));
      for (auto& t : p) t = token(gen);
      std::copy_n(shared.begin(), std::min<std::size_t>(shared.size(), p.size()),
                  p.begin());  // a common prefix
      prompts.push_back(std::move(p));
    }
  }
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    RequestSpec r;
    r.id = static_cast<RequestId>(i);
    r.prompt = prompts[i];
    r.max_new_tokens = o.max_new_tokens;
    w.requests.push_back(std::move(r));
  }
  w.progress = isatty(STDERR_FILENO) != 0;
  return w;
}

struct Verify {
  bool ran = false;
  int requests = 0;        // requests both runs finished: the ones compared
  std::int64_t steps = 0;  // decode steps compared
  bool tokens_match = true;
  bool near_tie = false;  // a mismatch where the reference's top two were within the logit error
  double max_abs = 0;
  double max_rel = 0;
  double tolerance = 1e-3;  // relative to the largest |logit|
  // A verification that compared nothing fails: it cannot vouch for anything.
  bool passed() const {
    return !ran || (steps > 0 && max_rel <= tolerance && (tokens_match || near_tie));
  }
};

Verify compare(const RunReport& dcp, const RunReport& ref, int vocab) {
  Verify v;
  v.ran = true;
  double max_ref = 0;
  for (std::size_t i = 0; i < dcp.results.size(); ++i) {
    const RequestResult& a = dcp.results[i];
    const RequestResult& b = ref.results[i];
    if (a.state != RequestState::finished || b.state != RequestState::finished) continue;
    const std::size_t steps = std::min(a.output_tokens.size(), b.output_tokens.size());
    v.requests += 1;
    v.steps += static_cast<std::int64_t>(steps);
    for (std::size_t k = 0; k < steps; ++k) {
      const float* la = a.step_logits.data() + k * vocab;
      const float* lb = b.step_logits.data() + k * vocab;
      for (int j = 0; j < vocab; ++j) {
        v.max_abs = std::max(v.max_abs, std::abs(static_cast<double>(la[j]) - lb[j]));
        max_ref = std::max(max_ref, std::abs(static_cast<double>(lb[j])));
      }
      // The reference fed the DCP run's tokens (teacher forcing): its greedy choice at every step
      // must equal the DCP run's, else free-running decoding would diverge there.
      if (b.output_tokens[k] != a.output_tokens[k]) {
        v.tokens_match = false;
        const double gap =
            std::abs(static_cast<double>(lb[b.output_tokens[k]]) - lb[a.output_tokens[k]]);
        if (gap <= 2 * v.max_abs + 1e-6) v.near_tie = true;
      }
    }
  }
  v.max_rel = max_ref > 0 ? v.max_abs / max_ref : v.max_abs;
  return v;
}

double median(std::vector<double> x) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  return x.size() % 2 ? x[x.size() / 2] : 0.5 * (x[x.size() / 2 - 1] + x[x.size() / 2]);
}

json report_json(const RunOptions& o, const Workload& w, const RunReport& r, const Verify& v) {
  const EngineStats& s = r.stats;
  std::vector<double> attn, dcp_comm, tp_comm, other;
  double dcp_calls = 0, dcp_bytes = 0, tp_calls = 0;
  for (std::size_t i = 0; i < s.decode_timings.size(); ++i) {
    const ForwardTimings& t = s.decode_timings[i];
    attn.push_back(t.attention_ms);
    dcp_comm.push_back(t.dcp_comm_ms);
    tp_comm.push_back(t.tp_comm_ms);
    other.push_back(s.decode_step_ms[i] - t.attention_ms - t.dcp_comm_ms - t.tp_comm_ms);
    dcp_calls += static_cast<double>(t.dcp_comm.total_calls());
    dcp_bytes += static_cast<double>(t.dcp_comm.total_bytes());
    tp_calls += static_cast<double>(t.tp_comm.total_calls());
  }
  const double steps = static_cast<double>(std::max<std::size_t>(1, s.decode_timings.size()));
  const double layers = w.model.num_hidden_layers;
  double decode_total = 0;
  for (double ms : s.decode_step_ms) decode_total += ms;
  json j;
  j["config"] = {{"model", w.model_path.empty() ? "preset:" + o.preset : w.model_path},
                 {"num_layers", w.model.num_hidden_layers},
                 {"num_attention_heads", w.model.num_attention_heads},
                 {"tp_size", w.parallel.tp_size},
                 {"dp_size", w.parallel.dp_size},
                 {"dcp_size", w.parallel.dcp_size},
                 {"dcp_comm_backend", std::string(to_string(r.backend))},
                 {"dcp_replicate_q_proj", r.replicated_q},
                 {"page_size", o.page_size},
                 {"kv_cache_dtype", o.kv_cache_dtype},
                 {"attention_kernel", kernel_name(w.model_options.attention_kernel)},
                 {"chunked_prefill_size", o.chunked_prefill_size},
                 {"comm", o.comm},
                 {"requests", w.requests.size()},
                 {"max_new_tokens", o.max_new_tokens},
                 {"seed", o.seed}};
  json ranks = json::array();
  for (const RankKv& k : r.ranks) {
    ranks.push_back({{"rank", k.rank},
                     {"dcp_rank", k.dcp_rank},
                     {"kv_rows_used", k.kv_rows_used},
                     {"kv_bytes", k.kv_bytes},
                     {"kv_bytes_used", k.kv_bytes_used}});
  }
  j["kv"] = {{"logical_capacity_tokens", r.logical_capacity_tokens}, {"ranks", ranks}};
  j["timing"] = {
      {"model_load_ms", r.model_load_ms},
      {"prefill_ms", s.prefill_ms},
      {"decode_steps", s.decode_step_ms.size()},
      {"decode_ms_per_step", median(s.decode_step_ms)},
      {"decode_attention_ms", median(attn)},
      {"decode_dcp_comm_ms", median(dcp_comm)},
      {"decode_tp_comm_ms", median(tp_comm)},
      {"decode_other_ms", median(other)},
      {"decode_tokens_per_s",
       decode_total > 0 ? 1000.0 * static_cast<double>(s.decode_tokens) / decode_total : 0.0}};
  j["speculative"] = {{"num_draft_tokens", o.spec_tokens},
                      {"draft", o.spec_tokens > 0 ? o.spec_draft : ""},
                      {"acceptance_rate", s.acceptance_rate()},
                      {"tokens_per_target_step", s.tokens_per_target_step()}};
  j["config"]["dcp_extend"] = o.dcp_extend;
  if (!r.cache.empty()) {
    json ranks_tiers = json::array();
    for (std::size_t k = 0; k < r.cache.size(); ++k) {
      const PrefixCacheStats& c = r.cache[k];
      ranks_tiers.push_back({{"rank", k},
                             {"bytes_to_host", c.bytes_to_host},
                             {"bytes_to_device", c.bytes_to_device},
                             {"pages_offloaded", c.pages_offloaded},
                             {"pages_reloaded", c.pages_reloaded},
                             {"pages_dropped", c.pages_dropped}});
    }
    j["prefix_cache"] = {{"hit_rate", r.cache[0].hit_rate()},
                         {"hit_tokens", r.cache[0].hit_tokens},
                         {"lookup_tokens", r.cache[0].lookup_tokens},
                         {"host_kv_capacity_tokens", o.host_kv_tokens},
                         {"ranks", ranks_tiers}};
  }
  if (r.disaggregated) {
    int failed = 0;
    for (const RequestResult& q : r.results) failed += q.state == RequestState::rejected;
    j["disagg"] = {{"prefill_dcp_size", o.prefill_dcp_size},
                   {"decode_dcp_size", w.parallel.dcp_size},
                   {"bytes_per_decode_rank", r.bytes_per_decode_rank},
                   {"transfer_ms", r.transfer_ms},
                   {"failed_requests", failed}};
  }
  j["comm"] = {{"collectives_per_layer", dcp_calls / steps / layers},
               {"bytes_per_layer_per_rank", dcp_bytes / steps / layers},
               {"tp_collectives_per_step", tp_calls / steps}};
  json reqs = json::array();
  for (std::size_t i = 0; i < r.results.size(); ++i) {
    const RequestResult& q = r.results[i];
    json e = {{"id", q.id},
              {"prompt_len", w.requests[i].prompt.size()},
              {"output_tokens", q.output_tokens},
              {"state", q.state == RequestState::finished ? "finished" : "rejected"}};
    if (!q.error.empty()) e["error"] = q.error;
    reqs.push_back(e);
  }
  j["requests"] = reqs;
  j["verify"] = {{"ran", v.ran},
                 {"requests_compared", v.requests},
                 {"steps_compared", v.steps},
                 {"tokens_match", v.tokens_match},
                 {"near_tie", v.near_tie},
                 {"max_abs_logit_diff", v.max_abs},
                 {"max_rel_logit_diff", v.max_rel},
                 {"tolerance_rel", v.tolerance},
                 {"passed", v.passed()}};
  return j;
}

void print_summary(const json& j) {
  const json& c = j["config"];
  std::printf(
      "dcp run: %s, %d layers, %d heads | tp %d, dcp %d, backend %s%s | KV %s, page %d, kernel %s "
      "| comm %s\n",
      c["model"].get<std::string>().c_str(), c["num_layers"].get<int>(),
      c["num_attention_heads"].get<int>(), c["tp_size"].get<int>(), c["dcp_size"].get<int>(),
      c["dcp_comm_backend"].get<std::string>().c_str(),
      c["dcp_replicate_q_proj"].get<bool>() ? " (replicated q)" : "",
      c["kv_cache_dtype"].get<std::string>().c_str(), c["page_size"].get<int>(),
      c["attention_kernel"].get<std::string>().c_str(), c["comm"].get<std::string>().c_str());
  if (j.contains("prefix_cache")) {
    const json& pc = j["prefix_cache"];
    std::printf(
        "prefix cache: hit rate %.1f%% (%lld of %lld prompt tokens); host tier %lld tokens\n",
        100 * pc["hit_rate"].get<double>(), pc["hit_tokens"].get<long long>(),
        pc["lookup_tokens"].get<long long>(), pc["host_kv_capacity_tokens"].get<long long>());
    for (const json& r : pc["ranks"]) {
      std::printf(
          "  rank %lld: %lld B to host, %lld B back (%lld pages offloaded, %lld reloaded, %lld "
          "dropped)\n",
          r["rank"].get<long long>(), r["bytes_to_host"].get<long long>(),
          r["bytes_to_device"].get<long long>(), r["pages_offloaded"].get<long long>(),
          r["pages_reloaded"].get<long long>(), r["pages_dropped"].get<long long>());
    }
  }
  if (j.contains("disagg")) {
    const json& d = j["disagg"];
    std::string bytes;
    for (const json& b : d["bytes_per_decode_rank"]) {
      if (!bytes.empty()) bytes += ", ";
      bytes += std::to_string(b.get<long long>());
    }
    std::printf(
        "disaggregated: prefill DCP %d -> decode DCP %d, KV moved in %.1f ms; bytes received per "
        "decode rank: %s\n",
        d["prefill_dcp_size"].get<int>(), d["decode_dcp_size"].get<int>(),
        d["transfer_ms"].get<double>(), bytes.c_str());
  }
  const json& kv = j["kv"];
  std::printf("KV: logical capacity %lld tokens\n", kv["logical_capacity_tokens"].get<long long>());
  for (const json& r : kv["ranks"]) {
    std::printf(
        "  rank %lld (dcp rank %lld): peak %lld rows/layer, %.2f MiB used of %.2f MiB allocated\n",
        r["rank"].get<long long>(), r["dcp_rank"].get<long long>(),
        r["kv_rows_used"].get<long long>(), r["kv_bytes_used"].get<double>() / 1048576.0,
        r["kv_bytes"].get<double>() / 1048576.0);
  }
  const json& t = j["timing"];
  std::printf(
      "prefill %.1f ms | decode %lld steps, median %.2f ms/step (attention %.2f, dcp comm %.2f, tp "
      "comm %.2f, other %.2f) | %.1f tokens/s\n",
      t["prefill_ms"].get<double>(), t["decode_steps"].get<long long>(),
      t["decode_ms_per_step"].get<double>(), t["decode_attention_ms"].get<double>(),
      t["decode_dcp_comm_ms"].get<double>(), t["decode_tp_comm_ms"].get<double>(),
      t["decode_other_ms"].get<double>(), t["decode_tokens_per_s"].get<double>());
  std::printf("comm per MLA layer per rank (decode): %.2f collectives, %.0f bytes sent\n",
              j["comm"]["collectives_per_layer"].get<double>(),
              j["comm"]["bytes_per_layer_per_rank"].get<double>());
  for (const json& r : j["requests"]) {
    std::string toks;
    for (const json& x : r["output_tokens"]) {
      if (!toks.empty()) toks += ' ';
      toks += std::to_string(x.get<int>());
    }
    const bool finished = r["state"].get<std::string>() == "finished";
    const std::string why = r.contains("error") ? ": " + r["error"].get<std::string>() : "";
    std::printf("  request %lld (prompt %lld): %s\n", r["id"].get<long long>(),
                r["prompt_len"].get<long long>(),
                finished ? toks.c_str() : ("REJECTED" + why).c_str());
  }
  if (j["speculative"]["num_draft_tokens"].get<int>() > 0) {
    std::printf(
        "speculative: %d draft tokens from %s, acceptance %.1f%%, %.2f tokens per target step\n",
        j["speculative"]["num_draft_tokens"].get<int>(),
        j["speculative"]["draft"].get<std::string>().c_str(),
        100 * j["speculative"]["acceptance_rate"].get<double>(),
        j["speculative"]["tokens_per_target_step"].get<double>());
  }
  const json& v = j["verify"];
  if (v["ran"].get<bool>() && v["steps_compared"].get<long long>() == 0) {
    std::printf("verify vs dcp 1: nothing to compare, no request finished in both runs: FAIL\n");
  } else if (v["ran"].get<bool>()) {
    std::printf(
        "verify vs dcp 1 (%d requests, %lld steps): tokens %s, max |dlogit| %.3g (relative %.3g, "
        "tolerance %.0e): %s\n",
        v["requests_compared"].get<int>(), v["steps_compared"].get<long long>(),
        v["tokens_match"].get<bool>()
            ? "match"
            : (v["near_tie"].get<bool>() ? "differ at a near tie" : "DIFFER"),
        v["max_abs_logit_diff"].get<double>(), v["max_rel_logit_diff"].get<double>(),
        v["tolerance_rel"].get<double>(), v["passed"].get<bool>() ? "PASS" : "FAIL");
  }
}

void dump_logits(const std::string& path, const RunReport& r, int vocab) {
  json header;
  header["dtype"] = "float32";
  header["layout"] = "rows are (request, step) in the order of 'rows'; each row holds vocab logits";
  json rows = json::array();
  std::int64_t total = 0;
  for (const RequestResult& q : r.results) {
    const std::int64_t steps = static_cast<std::int64_t>(q.step_logits.size()) / vocab;
    rows.push_back({{"request", q.id}, {"steps", steps}});
    total += steps;
  }
  header["shape"] = {total, vocab};
  header["rows"] = rows;
  const std::string text = header.dump();
  std::ofstream out(path, std::ios::binary);
  DCP_CHECK(out.good(), io, "--dump-logits: cannot write ", path);
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  out.write(reinterpret_cast<const char*>(len),
            8);  // like safetensors: u64 header length, header, data
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const RequestResult& q : r.results) {
    out.write(reinterpret_cast<const char*>(q.step_logits.data()),
              static_cast<std::streamsize>(q.step_logits.size() * 4));
  }
  DCP_CHECK(out.good(), io, "--dump-logits: failed writing ", path);
}

// The process count of the mpirun that started us (OpenMPI, or MPICH's Hydra), else 1.
int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  }
  return 1;
}

int run(const RunOptions& o) {
  if (o.comm == "threads" && launcher_world_size() > 1) {  // each process would run the whole job
    std::fprintf(stderr,
                 "dcp: warning: started by mpirun with %d processes but --comm threads: every "
                 "process runs the whole job on its own; pass --comm mpi for one rank per "
                 "process\n",
                 launcher_world_size());
  }
  Workload w = build_workload(o);
  resolve(w.parallel);  // validate before any work
  bool root = false;
  const RunReport report = run_workload(w, &root);
  Verify v;
  if (o.verify) {
    Workload ref = w;  // same TP, DCP 1, fed the DCP run's tokens
    ref.parallel.dcp_size = 1;
    ref.parallel.dcp_comm_backend.reset();
    ref.parallel.replicate_q_proj = false;
    ref.model_options.replicate_q_proj = false;
    ref.model_options.kv_capacity_tokens = w.model_options.kv_capacity_tokens;
    ref.engine.record_logits = true;
    ref.engine.num_draft_tokens = 0;  // the reference decodes plainly
    ref.draft_model.reset();
    ref.disaggregate = false;                // the reference runs monolithically
    ref.engine.enable_prefix_cache = false;  // and computes every prefix itself
    ref.engine.host_kv_capacity_tokens = 0;
    ref.allow_idle_ranks = w.disaggregate;
    ref.first_active_rank = w.disaggregate ? w.prefill_dcp_size : 0;  // the decode processes
    for (std::size_t i = 0; i < ref.requests.size(); ++i)
      ref.requests[i].forced_outputs = report.results[i].output_tokens;
    bool ref_root = false;
    const RunReport reference = run_workload(ref, &ref_root);
    // The printing rank must hold the reference's results (it is among the active ranks).
    if (root && reference.results.size() != report.results.size()) {
      throw Error(ErrorCategory::internal,
                  "the --verify reference did not run on the printing rank");
    }
    if (root)
      v = compare(report, reference,
                  w.model.vocab_size);  // only the printing rank holds every logit
  }
  if (!root) return 0;
  const json j = report_json(o, w, report, v);
  print_summary(j);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    DCP_CHECK(out.good(), io, "--json: cannot write ", o.json_path);
  }
  if (!o.dump_logits.empty()) dump_logits(o.dump_logits, report, w.model.vocab_size);
  return v.passed() ? 0 : 1;
}

}  // namespace

void add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  o->parallel.tp_size = 4;
  o->parallel.dcp_size = 4;
  CLI::App* cmd =
      app.add_subcommand("run", "Run requests through the MLA model with DCP (the main job)");
  add_parallel_flags(cmd, o->parallel);
  cmd->add_option("--model-path", o->model_path,
                  "Hugging Face DeepSeek-V2/V3 checkpoint directory");
  cmd->add_option("--preset", o->preset, "synthetic model: tiny, deepseek-v3, kimi-k3")
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers, "layers to run (default: the model's)")
      ->check(at_least(1));
  cmd->add_option("--page-size", o->page_size, "KV rows per physical page")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o->kv_cache_dtype, "fp32 or bf16")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--attention-kernel", o->attention_kernel,
                  "local attention kernel: automatic (fastest exact path), portable, avx2, avx512, "
                  "or amx_bf16 (bf16 KV; rounds q and P to bf16)")
      ->capture_default_str();
  cmd->add_option("--chunked-prefill-size", o->chunked_prefill_size,
                  "prompt tokens per prefill step")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-total-tokens", o->max_total_tokens,
                  "KV capacity in tokens (default, or 0: what the workload needs)")
      ->check(at_least(0));
  cmd->add_option("--batch", o->batch, "synthetic requests")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--prompt-len", o->prompt_len, "longest synthetic prompt")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per request")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the synthetic prompts")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--comm", o->comm, "threads (ranks as threads) or mpi (under mpirun)")
      ->check(one_of({"threads", "mpi"}))
      ->capture_default_str();
  cmd->add_flag("--verify,!--no-verify", o->verify,
                "compare with DCP 1 (same TP) under teacher forcing")
      ->capture_default_str();
  cmd->add_option("--json", o->json_path, "write the summary as JSON")->check(writable_file());
  cmd->add_option("--prompt-tokens", o->prompt_tokens,
                  "token ids '1,2,3' (';' between prompts) or a file, one prompt per line");
  cmd->add_option("--dump-logits", o->dump_logits,
                  "write every step's logits (float32) with a JSON header")
      ->check(writable_file());
  cmd->add_option("--speculative-num-draft-tokens", o->spec_tokens,
                  "draft tokens per step (0: off)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--speculative-draft", o->spec_draft,
                  "draft model: target:N (the target's first N layers), a preset, or a checkpoint")
      ->capture_default_str();
  cmd->add_flag("--enable-prefix-cache", o->prefix_cache,
                "reuse KV pages of shared prompt prefixes");
  cmd->add_option("--host-kv-capacity-tokens", o->host_kv_tokens,
                  "host-memory KV tier for evicted prefix pages (tokens)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--shared-prefix-len", o->shared_prefix_len,
                  "synthetic prompts share their first N tokens")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--max-running-requests", o->max_running,
                  "requests decoding at once (the rest queue)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_flag("--disaggregate", o->disaggregate,
                "prefill on its own group, move the KV, decode on the --dcp-size group");
  cmd->add_option("--prefill-dcp-size", o->prefill_dcp_size,
                  "DCP (= TP) size of the prefill group with --disaggregate")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--dcp-extend", o->dcp_extend, "prefill over a cached prefix: gather or native")
      ->check(one_of({"gather", "native"}))
      ->capture_default_str();
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace dcp::cli
