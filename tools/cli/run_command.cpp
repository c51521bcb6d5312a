// `dcp run`: the main job. Loads a model (preset or checkpoint), runs requests through the
// library deployment with DCP, prints a summary, and with --verify checks the result against
// DCP 1 (same TP).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include "cli/cli_checks.h"
#include "cli/commands.h"
#include "cli/run_report.h"
#include "cli/run_workload.h"
#include "dcp/disagg.h"
#include "dcp/error.h"

namespace dcp::cli {
namespace {

void print_progress(const Engine& e, int dcp_size) {
  const std::int64_t done = e.prompt_tokens_done(), total = e.prompt_tokens_total();
  std::fprintf(
      stderr,
      "\r\033[K[dcp %d] prefill %lld/%lld tokens | decode steps %zu | running %lld | queued %lld",
      dcp_size, static_cast<long long>(done), static_cast<long long>(total),
      e.stats().decode_step_ms.size(), static_cast<long long>(e.running()),
      static_cast<long long>(e.waiting()));
  std::fflush(stderr);
}

Launched<DeploymentReport> deploy(const Workload& w, std::optional<int> first_active_rank = {}) {
  return w.disaggregate ? run_disaggregated_deployment(w.spec, w.prefill_dcp_size)
                        : run_deployment(w.spec, first_active_rank);
}

// The --verify reference: the same requests at the same TP with DCP 1, EP 1 (and DP 1 when the run
// used DP attention), monolithic, no draft or prefix cache, fed the DCP run's tokens (teacher
// forcing).
Workload reference_of(const Workload& w, const DeploymentReport& report) {
  Workload ref = w;
  DeploymentSpec& s = ref.spec;
  if (s.parallel.enable_dp_attention) {  // the same world: one attention group over all of TP
    s.parallel.dp_size = 1;
    s.parallel.enable_dp_attention = false;
  }
  s.parallel.dcp_size = 1;
  s.parallel.ep_size = 1;  // experts sliced over TP, as the reference layout
  s.parallel.dcp_comm_backend.reset();
  s.parallel.replicate_q_proj = false;
  s.engine.record_logits = true;
  s.engine.num_draft_tokens = 0;
  s.engine.ngram_draft = 0;
  s.draft.reset();
  s.engine.enable_prefix_cache = false;
  s.engine.host_kv_capacity_tokens = 0;
  s.on_step = nullptr;
  ref.disaggregate = false;
  for (std::size_t i = 0; i < s.requests.size(); ++i)
    s.requests[i].forced_outputs = report.results[i].output_tokens;
  return ref;
}

int run(const RunOptions& o) {
  if (!o.json_path.empty() && !o.dump_logits.empty()) {
    std::error_code ec;
    DCP_ARG_CHECK(!std::filesystem::equivalent(o.json_path, o.dump_logits, ec) &&
                      std::filesystem::weakly_canonical(o.json_path, ec) !=
                          std::filesystem::weakly_canonical(o.dump_logits, ec),
                  "--json and --dump-logits name the same file, ", o.json_path);
  }
  if (o.comm == "threads" && launcher_world_size() > 1) {  // each process would run the whole job
    std::fprintf(stderr,
                 "dcp: warning: started by mpirun with %d processes but --comm threads: every "
                 "process runs the whole job on its own; pass --comm mpi for one rank per "
                 "process\n",
                 launcher_world_size());
  }
  Workload w = build_workload(o);
  resolve(w.spec.parallel);  // validate before any work
  const bool progress = isatty(STDERR_FILENO) != 0;
  if (progress) {
    const int n = w.spec.parallel.dcp_size;
    w.spec.on_step = [n](const Engine& e) { print_progress(e, n); };
  }
  const Launched<DeploymentReport> run = deploy(w);
  if (progress && run.reporting) std::fprintf(stderr, "\n");
  const DeploymentReport& report = run.report;
  Verify v;
  if (o.verify) {
    // A disaggregated run's reference runs on its decode processes only.
    const std::optional<int> first = w.disaggregate && w.spec.transport == RankTransport::mpi
                                         ? std::optional<int>(w.prefill_dcp_size)
                                         : std::nullopt;
    const Launched<DeploymentReport> ref = run_deployment(reference_of(w, report).spec, first);
    // The printing process must hold the reference's results (it is among the active ones).
    if (run.reporting && ref.report.results.size() != report.results.size()) {
      throw Error(ErrorCategory::internal,
                  "the --verify reference did not run on the printing rank");
    }
    if (run.reporting) v = compare(report, ref.report, w.spec.model.config.vocab_size);
    // Rounding x to bf16 before every paired weight product turns the two runs' fp32-level
    // differences (the merge's order) into whole bf16 steps of some of x's values, and those
    // flip a MoE layer's near-tie expert choices far more often than fp32 rounding does (2 layers
    // of V2-Lite at TP 4 x DCP 4: 2.7e-2; its dense first layer alone: 1.7e-3).
    if (w.spec.model_options.weight_kernel == KernelPath::avx512_bf16) v.tolerance = 5e-2;
  }
  if (!run.reporting) return 0;
  const nlohmann::ordered_json j = report_json(o, w, report, v);
  print_summary(j);
  if (!o.json_path.empty()) {
    std::ofstream out(o.json_path);
    out << j.dump(2) << "\n";
    DCP_CHECK(out.good(), io, "--json: cannot write ", o.json_path);
  }
  if (!o.dump_logits.empty()) dump_logits(o.dump_logits, report, w.spec.model.config.vocab_size);
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
  add_deployment_flags(cmd, *o);
  cmd->add_option("--max-total-tokens", o->max_total_tokens,
                  "KV capacity in tokens of each DP group (default, or 0: what the busiest "
                  "group's requests need)")
      ->check(at_least(0));
  CLI::Option* batch = cmd->add_option("--batch", o->batch, "synthetic requests")
                           ->check(at_least(1))
                           ->capture_default_str();
  CLI::Option* prompt_len =
      cmd->add_option("--prompt-len", o->prompt_len, "longest synthetic prompt")
          ->check(at_least(1))
          ->capture_default_str();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate per request")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "seed of the synthetic prompts")
      ->check(at_least(0))
      ->capture_default_str();
  // Two flags, so that --help shows what each does (a negated pair shows "{false}" beside the
  // default, which reads as "off").
  CLI::Option* verify = cmd->add_flag("--verify", o->verify,
                                      "compare with DCP 1 (same TP) under teacher forcing (on by "
                                      "default)");
  cmd->add_flag_callback("--no-verify", [o] { o->verify = false; },
                         "skip the comparison with DCP 1")
      ->excludes(verify);
  cmd->add_option("--json", o->json_path, "write the summary as JSON")->check(writable_file());
  CLI::Option* prompt_tokens = cmd->add_option(
      "--prompt-tokens", o->prompt_tokens,
      "token ids '1,2,3' (';' between prompts) or a file, one prompt per line");
  cmd->add_option("--dump-logits", o->dump_logits,
                  "write every step's logits (float32) with a JSON header")
      ->check(writable_file());
  CLI::Option* shared_prefix = cmd->add_option("--shared-prefix-len", o->shared_prefix_len,
                                               "synthetic prompts share their first N tokens")
                                   ->check(at_least(0))
                                   ->capture_default_str();
  // Given prompts leave nothing for the synthetic workload's flags to shape.
  prompt_tokens->excludes(batch)->excludes(prompt_len)->excludes(shared_prefix);
  cmd->callback([o] { set_exit_code(run(*o)); });
}

}  // namespace dcp::cli
