// `dcp plan`: the cost model. A roofline per component of one MLA decode layer, for every
// candidate DCP size and combine backend, and a recommendation.
//   local attention   max(FLOPs / compute rate, KV bytes / bandwidth)    per rank
//   query + combine   collectives x latency + bytes sent / link bandwidth (the formulas of
//                     DcpAttention::expected_bytes_sent)
//   capacity          (memory - weights) / (layers x latent row bytes) rows per rank, x N tokens
//   weights           the bytes a decode step reads of them in their dtype (the routed experts
//                     the batch is expected to touch) over bandwidth, or their FLOPs over the
//                     compute rate; a step is layers x layer time + that
// DCP pays when T_attn(S) - T_attn(S/N) > T_comm, or when the KV does not fit without it.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli_checks.h"
#include "commands.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/model_config.h"
#include "dcp/weights.h"
#include "plan/plan_model.h"

namespace dcp::cli {
namespace {

struct PlanOptions {
  std::string preset = "deepseek-v3";
  std::string model_path;
  int num_layers = 0;
  std::string hardware = "h200-nvlink";
  int tp_size = 8;
  int batch = 16;
  std::string contexts = "32768,131072,1048576";
  std::string kv_dtype = "bf16";
  double compute_gflops = 0, bandwidth_gbps = 0, link_gbps = 0, link_latency_us = -1,
         memory_gib = 0;
  double weights_gib = -1;  // per rank; default: the config's weights as its checkpoint holds them
  bool json = false;
};

struct Row {
  std::int64_t context = 0;
  int dcp = 1;
  std::string backend;
  double attn_ms = 0, comm_ms = 0, total_ms = 0, step_ms = 0;
  double kv_bytes = 0, comm_bytes = 0;
  int collectives = 0;
  double replicated_weight_bytes = 0, replicated_gemm_ms = 0;
  double capacity_tokens = 0;
  bool fits = false;
};

void plan(const PlanOptions& o) {
  ModelConfig c =
      o.model_path.empty()
          ? preset_config(o.preset, o.num_layers)
          : with_flag("--model-path", [&] { return read_checkpoint_config(o.model_path); });
  if (o.num_layers > 0) c.num_hidden_layers = o.num_layers;
  Hardware hw = hardware_preset(o.hardware);
  if (o.compute_gflops > 0) hw.compute_flops = o.compute_gflops * 1e9;
  if (o.bandwidth_gbps > 0) hw.bandwidth = o.bandwidth_gbps * 1e9;
  if (o.link_gbps > 0) hw.link_bandwidth = o.link_gbps * 1e9;
  if (o.link_latency_us >= 0) hw.link_latency = o.link_latency_us * 1e-6;
  if (o.memory_gib > 0) hw.memory_bytes = o.memory_gib * (1ull << 30);
  check_divides_heads(c, o.tp_size, "--tp-size");
  const KvDtype dtype = parse_kv_dtype(o.kv_dtype);
  const int h_loc = c.num_attention_heads / o.tp_size;
  const double row_bytes = static_cast<double>(c.latent_width()) * dtype_size(dtype);
  const double weights =
      o.weights_gib >= 0 ? o.weights_gib * (1ull << 30)
                         : weight_bytes_per_rank(c, o.tp_size, checkpoint_element_bytes(c, 2.0));
  const std::vector<std::int64_t> contexts = parse_list(o.contexts, "--contexts");
  // The weights a decode step reads on a rank (the same for every DCP size), in their dtype.
  const WeightTraffic traffic =
      weight_traffic(c, o.tp_size, o.batch, checkpoint_element_bytes(c, 2.0));
  const double weight_ms =
      std::max(traffic.bytes / hw.bandwidth, 2.0 * o.batch * traffic.params / hw.compute_flops) *
      1e3;

  std::vector<Row> rows;
  for (std::int64_t s : contexts) {
    for (int n = 1; n <= o.tp_size; ++n) {
      if (o.tp_size % n) continue;
      struct Mode {
        const char* name;
        CombineBackend b;
        bool rq;
      };
      const Mode modes[] = {{"ag_rs", CombineBackend::ag_rs, false},
                            {"a2a", CombineBackend::a2a, false},
                            {"a2a+replicated-q", CombineBackend::a2a, true}};
      for (const Mode& m : modes) {
        if (n == 1 && m.b != CombineBackend::ag_rs) continue;
        if (m.rq && c.quantized) continue;  // the model gathers the query for FP8 weights
        Row r;
        r.context = s;
        r.dcp = n;
        r.backend = n == 1 ? "none" : m.name;
        const LayerPrediction pr = predict_layer(c, hw, h_loc, n, m.b, m.rq, o.batch, s, dtype);
        r.kv_bytes = pr.kv_bytes;
        r.attn_ms = pr.attn_ms;
        r.comm_bytes = pr.comm_bytes;
        r.collectives = pr.collectives;
        r.comm_ms = pr.comm_ms;
        r.replicated_weight_bytes = pr.replicated_weight_bytes;
        r.replicated_gemm_ms = pr.replicated_gemm_ms;
        r.total_ms = r.attn_ms + r.comm_ms + r.replicated_gemm_ms;
        r.step_ms = c.num_hidden_layers * r.total_ms + weight_ms;
        const double free_bytes = std::max(
            0.0, hw.memory_bytes - weights - r.replicated_weight_bytes * c.num_hidden_layers);
        r.capacity_tokens = free_bytes / (row_bytes * c.num_hidden_layers) * n;
        r.fits = r.capacity_tokens >= static_cast<double>(o.batch) * s;
        rows.push_back(r);
      }
    }
  }
  if (o.json) {
    nlohmann::ordered_json j;
    j["model"] = c.name;
    j["hardware"] = {{"name", hw.name},
                     {"compute_flops", hw.compute_flops},
                     {"bandwidth", hw.bandwidth},
                     {"link_bandwidth", hw.link_bandwidth},
                     {"link_latency_s", hw.link_latency},
                     {"memory_bytes", hw.memory_bytes},
                     {"source", hw.source}};
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["tp_size"] = o.tp_size;
    j["batch"] = o.batch;
    j["weights_bytes_per_rank"] = weights;
    j["weight_read_bytes_per_step"] = traffic.bytes;
    j["weight_read_ms"] = weight_ms;
    nlohmann::ordered_json arr = nlohmann::ordered_json::array();
    for (const Row& r : rows) {
      arr.push_back({{"context", r.context},
                     {"dcp_size", r.dcp},
                     {"backend", r.backend},
                     {"attention_ms", r.attn_ms},
                     {"comm_ms", r.comm_ms},
                     {"total_ms", r.total_ms},
                     {"step_ms", r.step_ms},
                     {"kv_bytes_per_rank", r.kv_bytes},
                     {"comm_bytes_per_rank", r.comm_bytes},
                     {"collectives", r.collectives},
                     {"replicated_weight_bytes_per_layer", r.replicated_weight_bytes},
                     {"replicated_gemm_ms", r.replicated_gemm_ms},
                     {"capacity_tokens", r.capacity_tokens},
                     {"fits", r.fits},
                     {"within_model_context", r.context <= c.max_position_embeddings}});
    }
    j["per_layer"] = arr;
    std::cout << j.dump(2) << "\n";
    return;
  }
  std::printf(
      "dcp plan: %s (%d heads, %d layers), TP %d (H_loc %d), batch %d, %s KV, hardware %s\n",
      c.name.c_str(), c.num_attention_heads, c.num_hidden_layers, o.tp_size, h_loc, o.batch,
      o.kv_dtype.c_str(), hw.name.c_str());
  std::printf(
      "  %.0f GFLOP/s, %.0f GB/s KV read, link %.0f GB/s + %.0f us per collective, %.0f GiB per "
      "rank, weights %.2f GiB per rank (%s)\n",
      hw.compute_flops / 1e9, hw.bandwidth / 1e9, hw.link_bandwidth / 1e9, hw.link_latency * 1e6,
      hw.memory_bytes / (1ull << 30), weights / (1ull << 30), hw.source.c_str());
  std::printf(
      "  a decode step reads %.2f GB of weights per rank in their dtype (%.3f ms); step = %d "
      "layers x layer + that\n",
      traffic.bytes / 1e9, weight_ms, c.num_hidden_layers);
  std::printf("%9s %4s %17s | %10s %10s %10s %10s %10s | %12s %6s\n", "context", "dcp", "backend",
              "attn ms", "comm ms", "rep-q ms", "layer ms", "step ms", "capacity", "fits");
  for (std::int64_t s : contexts) {
    const Row* best = nullptr;
    const Row* base = nullptr;
    for (const Row& r : rows) {
      if (r.context != s) continue;
      if (r.dcp == 1) base = &r;
      std::printf("%9lld %4d %17s | %10.3f %10.3f %10.3f %10.3f %10.2f | %12.3g %6s\n",
                  static_cast<long long>(s), r.dcp, r.backend.c_str(), r.attn_ms, r.comm_ms,
                  r.replicated_gemm_ms, r.total_ms, r.step_ms, r.capacity_tokens,
                  r.fits ? "yes" : "no");
      if (r.fits && (!best || r.total_ms < best->total_ms)) best = &r;
    }
    if (s > c.max_position_embeddings) {
      // The rows stay (the cost model holds there), but no request of this model gets that long.
      std::printf(
          "  -> context %lld: beyond the model's context (max_position_embeddings %d); no request "
          "reaches it\n",
          static_cast<long long>(s), c.max_position_embeddings);
    } else if (!best) {
      std::printf(
          "  -> context %lld: no configuration holds batch %d x %lld tokens; lower the batch or "
          "raise TP\n",
          static_cast<long long>(s), o.batch, static_cast<long long>(s));
    } else if (best->dcp == 1) {
      std::printf(
          "  -> context %lld: no DCP (the collective costs more than the KV reads it saves)\n",
          static_cast<long long>(s));
    } else {
      char why[96];
      if (base && !base->fits) {
        std::snprintf(why, sizeof why, " (without DCP the KV does not fit)");
      } else {
        std::snprintf(why, sizeof why, " (%.2fx faster than DCP 1)",
                      base ? base->total_ms / best->total_ms : 0.0);
      }
      std::printf("  -> context %lld: DCP %d with %s, %.3f ms per layer%s\n",
                  static_cast<long long>(s), best->dcp, best->backend.c_str(), best->total_ms, why);
    }
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan", "Cost model: predicted per-layer times and capacity per DCP size and backend");
  cmd->add_option("--preset", o->preset, std::string("model geometry: ") + preset_names())
      ->capture_default_str();
  cmd->add_option("--model-path", o->model_path, "checkpoint whose config.json gives the geometry");
  cmd->add_option("--num-layers", o->num_layers, "layers (default: the model's)")
      ->check(at_least(1));
  cmd->add_option("--hardware", o->hardware, "this-cpu or h200-nvlink")->capture_default_str();
  cmd->add_option("--tp-size", o->tp_size, "tensor parallel size")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--batch", o->batch, "decode batch")->check(at_least(1))->capture_default_str();
  cmd->add_option("--contexts", o->contexts, "comma-separated context lengths")
      ->check(list_at_least(1))
      ->capture_default_str();
  cmd->add_option("--kv-cache-dtype", o->kv_dtype, "fp32 or bf16")
      ->check(one_of({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--compute-gflops", o->compute_gflops, "override the attention rate per rank")
      ->check(positive());
  cmd->add_option("--bandwidth-gbps", o->bandwidth_gbps, "override the KV read bandwidth per rank")
      ->check(positive());
  cmd->add_option("--link-gbps", o->link_gbps, "override the collective bandwidth per rank")
      ->check(positive());
  cmd->add_option("--link-latency-us", o->link_latency_us, "override the latency per collective")
      ->check(non_negative());
  cmd->add_option("--memory-gib", o->memory_gib, "override the memory per rank")->check(positive());
  cmd->add_option("--weights-gib", o->weights_gib, "override the weights per rank")
      ->check(non_negative());
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->callback([o] { plan(*o); });
}

}  // namespace dcp::cli
