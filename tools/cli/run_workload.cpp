// `dcp run`'s workload: flags in, a DeploymentSpec out.
#include "cli/run_workload.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>

#include "cli/cli_checks.h"
#include "cli/prompt_tokens.h"
#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp::cli {

std::string kernel_name(KernelPath k) {
  return std::string(to_string(is_bf16_pair_path(k) ? k : resolve_exact_path(k)));
}

Workload build_workload(const RunOptions& o) {
  // Single flags' ranges and names were checked as they parsed (add_run_command).
  Workload w;
  DeploymentSpec& s = w.spec;
  if (!o.model_path.empty()) {
    s.model.config =
        with_flag("--model-path", [&] { return read_checkpoint_config(o.model_path); });
    if (o.num_layers > 0) {
      DCP_ARG_CHECK(o.num_layers <= s.model.config.num_hidden_layers, "--num-layers ", o.num_layers,
                    " exceeds the checkpoint's ", s.model.config.num_hidden_layers, " layers");
      s.model.config.num_hidden_layers = o.num_layers;
    }
    s.model.path = o.model_path;
    w.model_label = o.model_path;
    if (s.model.config.num_nextn_predict_layers > 0) {
      std::fprintf(stderr,
                   "dcp: note: the checkpoint's %d multi-token-prediction layer(s) (layer %d on) "
                   "are not part of the main model and are not loaded\n",
                   s.model.config.num_nextn_predict_layers, s.model.config.num_hidden_layers);
    }
  } else {
    s.model.config = preset_config(o.preset, o.num_layers);
    s.model.synthetic_dtype = preset_weight_dtype(o.preset);
    w.model_label = "preset:" + o.preset;
  }
  s.parallel = o.parallel.to_config();
  // Kimi-K3 (its output gate marks the geometry) replicates the query projection over the DCP
  // group by default, as its upstream does, wherever that is legal: DCP > 1, an all-to-all
  // combine, 16-bit weights.
  if (!o.parallel.replicate_q_proj && s.model.config.attn_output_gate &&
      s.parallel.dcp_size > 1 && !s.model.config.quantized &&
      effective_backend(s.parallel) != CombineBackend::ag_rs) {
    s.parallel.replicate_q_proj = true;
  }
  check_runs_here(s.parallel);  // before any rank starts
  validate(s.parallel);          // the layout's own rules before the model's
  // Checked again by every rank's model; here it fails before any rank thread starts.
  check_divides_heads(s.model.config, s.parallel.tp_size, "--tp-size");
  if (s.parallel.ep_size > 1) {  // also checked by every rank's MoE layers
    const int ep = s.parallel.ep_size, experts = s.model.config.n_routed_experts;
    DCP_ARG_CHECK(experts > 0, "--ep-size ", ep, " needs a mixture-of-experts model; ",
                  w.model_label, " has no routed experts (legal: 1)");
    DCP_ARG_CHECK(experts % ep == 0, "--ep-size ", ep, " must divide the model's ", experts,
                  " routed experts");
  }
  s.transport = parse_rank_transport(o.comm);
  DCP_ARG_CHECK(o.comm_timeout_s >= 0 && o.comm_timeout_s <= 1e9, "--comm-timeout ",
                o.comm_timeout_s, " must be in [0, 1e9] seconds (0: wait forever)");
  s.comm_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(o.comm_timeout_s * 1000));
  s.model_options.kv_dtype = parse_kv_dtype(o.kv_cache_dtype);
  s.model_options.page_size = o.page_size;
  DCP_ARG_CHECK(o.page_size % o.kv_interleave == 0, "--dcp-kv-cache-interleave-size ",
                o.kv_interleave, " must divide --page-size ", o.page_size,
                " (a stripe may not straddle two pages); legal values: ", [&] {
                  std::string legal;
                  for (int d = 1; d <= o.page_size; ++d)
                    if (o.page_size % d == 0) legal += (legal.empty() ? "" : ", ") + str(d);
                  return legal;
                }());
  s.model_options.kv_interleave = o.kv_interleave;
  s.model_options.attention_kernel =
      parse_attention_kernel(o.attention_kernel, s.model_options.kv_dtype);
  s.model_options.weight_kernel = parse_weight_kernel(o.weight_kernel);
  s.model_options.threads = o.threads_per_rank;
  s.engine.chunked_prefill_size = o.chunked_prefill_size;
  s.engine.record_logits = o.verify || !o.dump_logits.empty();

  s.engine.enable_prefix_cache = o.prefix_cache;
  s.engine.host_kv_capacity_tokens = o.host_kv_tokens;
  s.engine.max_running_requests = o.max_running;
  DCP_ARG_CHECK(o.shared_prefix_len < o.prompt_len, "--shared-prefix-len ", o.shared_prefix_len,
                " must be below --prompt-len ", o.prompt_len);
  w.disaggregate = o.disaggregate;
  w.prefill_dcp_size = o.prefill_dcp_size;
  if (o.disaggregate)  // refuse an unsupported pair before any rank starts
    check_disaggregation(s.parallel, s.model_options, o.prefill_dcp_size);
  s.engine.extend_mode =
      o.dcp_extend == "native" ? ForwardMode::extend_native : ForwardMode::extend;
  if (o.spec_tokens > 0)
    set_speculation(s, o.spec_tokens, o.spec_draft, o.seed + 1, "--speculative-draft");
  if (s.transport == RankTransport::threads) {  // before anything is sized by the rank count
    DCP_ARG_CHECK(s.parallel.world_size() <= kMaxThreadRanks, "the configuration needs ",
                  s.parallel.world_size(), " ranks (--tp-size x --dp-size); --comm threads runs "
                  "at most ", kMaxThreadRanks, " in one process (use --comm mpi under mpirun)");
  }
  if (o.prompt_tokens.empty()) {
    // Every synthetic request holds at least one prompt token and its new tokens: a --batch too
    // large for this machine is refused here, before a length per request is stored.
    const double min_tokens = static_cast<double>(o.batch) * (1.0 + o.max_new_tokens);
    check_fits_in_memory(min_tokens * s.model.config.latent_width() *
                             dtype_size(s.model_options.kv_dtype) *
                             s.model.config.num_hidden_layers,
                         str("--batch ", o.batch, " requests of at least ", 1 + o.max_new_tokens,
                             " tokens each"),
                         "lower --batch or --max-new-tokens");
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
  // Default capacity: what the busiest DP group's requests need (each group has its own KV), a
  // virtual page per request for rounding.
  const std::int64_t vp = static_cast<std::int64_t>(o.page_size) * s.parallel.dcp_size;
  std::vector<std::int64_t> tokens;
  for (const std::int64_t len : lengths) tokens.push_back(len + o.max_new_tokens);
  const std::vector<int> group = deal_requests(tokens, s.parallel.dp_size);
  std::vector<std::int64_t> need(static_cast<std::size_t>(s.parallel.dp_size), 0);
  for (std::size_t i = 0; i < lengths.size(); ++i)
    need[static_cast<std::size_t>(group[i])] += lengths[i] + o.max_new_tokens + vp;
  std::int64_t busiest = *std::max_element(need.begin(), need.end());
  if (o.disaggregate) {  // the prefill group holds every prompt (and its first token) at once
    const std::int64_t prefill_vp = static_cast<std::int64_t>(o.page_size) * o.prefill_dcp_size;
    std::int64_t prompts_need = 0;
    for (const std::int64_t len : lengths) prompts_need += len + 1 + prefill_vp;
    busiest = std::max(busiest, prompts_need);
  }
  const std::int64_t capacity = o.max_total_tokens > 0 ? o.max_total_tokens : busiest;
  s.model_options.kv_capacity_tokens = capacity;
  {
    // Every rank of this process holds capacity / N rows per layer; the --verify reference, run
    // afterwards at DCP 1, holds all of them on every rank.
    const double ranks_here = o.comm == "mpi" ? 1.0 : s.parallel.world_size();
    const double row_bytes = static_cast<double>(s.model.config.latent_width()) *
                             dtype_size(s.model_options.kv_dtype) *
                             s.model.config.num_hidden_layers;
    const double rows = static_cast<double>(capacity) / (o.verify ? 1 : s.parallel.dcp_size);
    // Weights first: every rank of this process holds its TP slice (the --verify reference's
    // ranks the same slices again, one run after the other).
    const bool synthetic = s.model.path.empty();
    const double dtype_bytes =
        synthetic && s.model.synthetic_dtype == WeightDtype::f32 ? 4.0 : 2.0;
    const double weights =
        ranks_here * weight_bytes_per_rank(s.model.config, s.parallel.tp_size,
                                           checkpoint_element_bytes(s.model.config, dtype_bytes));
    check_fits_in_memory(weights,
                         str("loading the weights of ", s.model.config.num_hidden_layers,
                             " layers at TP ", s.parallel.tp_size,
                             synthetic ? str(" (synthetic, ", to_string(s.model.synthetic_dtype),
                                             s.model.config.quantized ? ", FP8 projections"
                                             : s.model.config.int4_group_size > 0 ? ", INT4 experts"
                                                                                  : "",
                                             ")")
                                       : ""),
                         synthetic ? "raise --tp-size or lower --num-layers"
                                   : "raise --tp-size or run one rank per process (--comm mpi)");
    const bool asked = o.max_total_tokens > 0;
    check_fits_in_memory(
        weights + ranks_here * rows * row_bytes,
        str("a KV cache of ", capacity, " tokens",
            asked ? " (--max-total-tokens)" : " (the prompts and --max-new-tokens)", " over ",
            s.model.config.num_hidden_layers, " layers, beside the weights,"),
        asked ? "lower --max-total-tokens" : "lower --prompt-len, --batch or --max-new-tokens");
  }
  if (o.prompt_tokens.empty()) {
    std::mt19937_64 gen(o.seed);
    std::uniform_int_distribution<std::int32_t> token(0, s.model.config.vocab_size - 1);
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
    s.requests.push_back(std::move(r));
  }
  return w;
}

void add_deployment_flags(CLI::App* cmd, RunOptions& o) {
  CLI::Option* model_path =
      cmd->add_option("--model-path", o.model_path,
                      "Hugging Face checkpoint directory (DeepSeek-V2/V3, Kimi-K2, MiniCPM3)");
  cmd->add_option("--preset", o.preset, std::string("synthetic model: ") + preset_names())
      ->capture_default_str()
      ->excludes(model_path);
  cmd->add_option("--num-layers", o.num_layers, "layers to run (default: the model's)")
      ->check(at_least(1));
  cmd->add_option("--page-size", o.page_size, "KV rows per physical page")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--dcp-kv-cache-interleave-size", o.kv_interleave,
                  "KV stripe: this many consecutive tokens per DCP rank (divides --page-size)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o.kv_cache_dtype, "fp32 or bf16")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--attention-kernel", o.attention_kernel, kAttentionKernelHelp)
      ->capture_default_str();
  cmd->add_option("--weight-kernel", o.weight_kernel, kWeightKernelHelp)->capture_default_str();
  cmd->add_option("--threads-per-rank", o.threads_per_rank,
                  "threads of each rank: the weight products split their rows over them, the "
                  "attention kernel its tokens and KV ranges")
      ->check(CLI::Range(1, kMaxRankThreads))
      ->capture_default_str();
  cmd->add_option("--chunked-prefill-size", o.chunked_prefill_size,
                  "prompt tokens per prefill step")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-running-requests", o.max_running,
                  "requests decoding at once (the rest queue)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--comm", o.comm, "threads (ranks as threads) or mpi (under mpirun)")
      ->check(one_of({"threads", "mpi"}))
      ->capture_default_str();
  cmd->add_option("--comm-timeout", o.comm_timeout_s,
                  "seconds a collective may wait for the other ranks before the job fails naming "
                  "it (a rank stalled or died); 0 waits forever")
      ->check(non_negative())
      ->capture_default_str();
  CLI::Option* draft_tokens = cmd->add_option("--speculative-num-draft-tokens", o.spec_tokens,
                                              "draft tokens per step (0: off)")
                                  ->check(at_least(0))
                                  ->capture_default_str();
  cmd->add_option(
         "--speculative-draft", o.spec_draft,
         "the draft: ngram:N (no draft model: the tokens that followed the latest earlier "
         "occurrence of the last n <= N tokens), target:N (the target's first N layers), a "
         "preset, or a checkpoint")
      ->capture_default_str()
      ->needs(draft_tokens);
  cmd->add_flag("--enable-prefix-cache", o.prefix_cache,
                "reuse KV pages of shared prompt prefixes");
  cmd->add_option("--host-kv-capacity-tokens", o.host_kv_tokens,
                  "host-memory KV tier for evicted prefix pages (tokens)")
      ->check(at_least(0))
      ->capture_default_str();
  cmd->add_option("--dcp-extend", o.dcp_extend, "prefill over a cached prefix: gather or native")
      ->check(one_of({"gather", "native"}))
      ->capture_default_str();
  CLI::Option* disaggregate = cmd->add_flag(
      "--disaggregate", o.disaggregate,
      "prefill on a group of its own (world ranks before the others), move the KV, decode on "
      "the --tp-size/--dcp-size group");
  cmd->add_option("--prefill-dcp-size", o.prefill_dcp_size,
                  "DCP (= TP) size of the prefill group with --disaggregate")
      ->check(at_least(1))
      ->capture_default_str()
      ->needs(disaggregate);
}

int launcher_world_size() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"}) {
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  }
  return 1;
}

int launcher_rank() {
  for (const char* var : {"OMPI_COMM_WORLD_RANK", "PMI_RANK"}) {
    if (const char* v = std::getenv(var)) return std::max(0, std::atoi(v));
  }
  return 0;
}

}  // namespace dcp::cli
