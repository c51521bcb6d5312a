#include "cli/run_report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "cli/flag_names.h"
#include "dcp/error.h"
#include "dcp/timing.h"

namespace dcp::cli {

using ordered_json = nlohmann::ordered_json;

Verify compare(const DeploymentReport& dcp, const DeploymentReport& ref, int vocab) {
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
        // std::max drops a NaN difference: a non-finite logit on either side is a failure.
        if (!std::isfinite(la[j]) || !std::isfinite(lb[j])) v.non_finite += 1;
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

ordered_json report_json(const RunOptions& o, const Workload& w, const DeploymentReport& r,
                 const Verify& v) {
  const EngineStats& s = r.stats;
  std::vector<double> attn, dcp_comm, tp_comm, other;
  double dcp_calls = 0, dcp_bytes = 0, tp_calls = 0;
  for (std::size_t i = 0; i < s.decode_timings.size(); ++i) {
    const ForwardTimings& t = s.decode_timings[i];
    attn.push_back(t.attention_ms);
    dcp_comm.push_back(t.dcp_comm_ms);
    // TP collectives, with DP attention including the row gather and scatter around the MLP.
    tp_comm.push_back(t.tp_comm_ms + t.mlp_comm_ms);
    other.push_back(s.decode_step_ms[i] - t.attention_ms - t.dcp_comm_ms - tp_comm.back());
    dcp_calls += static_cast<double>(t.dcp_comm.total_calls());
    dcp_bytes += static_cast<double>(t.dcp_comm.total_bytes());
    tp_calls += static_cast<double>(t.tp_comm.total_calls());
  }
  const double steps = static_cast<double>(std::max<std::size_t>(1, s.decode_timings.size()));
  const double layers = w.spec.model.config.num_hidden_layers;
  double decode_total = 0;
  for (double ms : s.decode_step_ms) decode_total += ms;
  ordered_json j;
  j["config"] = {{"model", w.model_label},
                 {"num_layers", w.spec.model.config.num_hidden_layers},
                 {"num_attention_heads", w.spec.model.config.num_attention_heads},
                 {"tp_size", w.spec.parallel.tp_size},
                 {"dp_size", w.spec.parallel.dp_size},
                 {"enable_dp_attention", w.spec.parallel.enable_dp_attention},
                 {"ep_size", w.spec.parallel.ep_size},
                 {"dcp_size", w.spec.parallel.dcp_size},
                 {"dcp_comm_backend", std::string(to_string(r.backend))},
                 {"dcp_replicate_q_proj", r.replicated_q},
                 {"page_size", o.page_size},
                 {"dcp_kv_cache_interleave_size", o.kv_interleave},
                 {"kv_cache_dtype", o.kv_cache_dtype},
                 {"attention_kernel", kernel_name(w.spec.model_options.attention_kernel)},
                 {"weight_kernel", kernel_name(w.spec.model_options.weight_kernel)},
                 {"threads_per_rank", w.spec.model_options.threads},
                 {"chunked_prefill_size", o.chunked_prefill_size},
                 {"comm", o.comm},
                 {"requests", w.spec.requests.size()},
                 {"max_new_tokens", o.max_new_tokens},
                 {"seed", o.seed}};
  ordered_json ranks = ordered_json::array();
  for (const RankKv& k : r.ranks) {
    ranks.push_back({{"rank", k.rank},
                     {"dp_rank", k.dp_rank},
                     {"dcp_rank", k.dcp_rank},
                     {"kv_rows_used", k.kv_rows_used},
                     {"kv_bytes", k.kv_bytes},
                     {"kv_bytes_used", k.kv_bytes_used}});
  }
  // Per DP group (replica or attention group): the requests it served and the KV its ranks used.
  ordered_json groups = ordered_json::array();
  for (int g = 0; g < w.spec.parallel.dp_size; ++g) {
    std::int64_t requests = 0, used = 0, allocated = 0;
    for (const RankKv& k : r.ranks) {
      if (k.dp_rank != g) continue;
      requests = k.requests;
      used += k.kv_bytes_used;
      allocated += k.kv_bytes;
    }
    groups.push_back({{"dp_rank", g},
                      {"requests", requests},
                      {"kv_bytes_used", used},
                      {"kv_bytes", allocated}});
  }
  j["kv"] = {{"logical_capacity_tokens", r.logical_capacity_tokens},
             {"ranks", ranks},
             {"dp_groups", groups}};
  ordered_json weight_bytes = ordered_json::array();
  for (const RankKv& k : r.ranks) weight_bytes.push_back(k.weight_bytes);
  j["weights"] = {{"dtype", std::string(to_string(r.weight_dtype))},
                  {"experts_dtype", std::string(to_string(r.expert_weight_dtype))},
                  {"bytes_per_rank", weight_bytes}};
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
    ordered_json ranks_tiers = ordered_json::array();
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
                   {"decode_dcp_size", w.spec.parallel.dcp_size},
                   {"bytes_per_decode_rank", r.bytes_per_decode_rank},
                   {"transfer_ms", r.transfer_ms},
                   {"failed_requests", failed}};
  }
  j["comm"] = {{"collectives_per_layer", dcp_calls / steps / layers},
               {"bytes_per_layer_per_rank", dcp_bytes / steps / layers},
               {"tp_collectives_per_step", tp_calls / steps}};
  ordered_json reqs = ordered_json::array();
  for (std::size_t i = 0; i < r.results.size(); ++i) {
    const RequestResult& q = r.results[i];
    ordered_json e = {{"id", q.id},
                      {"prompt_len", w.spec.requests[i].prompt.size()},
                      {"cached_prompt_tokens", q.cached_prompt_tokens},
                      {"output_tokens", q.output_tokens},
                      {"state", q.state == RequestState::finished ? "finished" : "rejected"}};
    if (o.spec_tokens > 0) e["spec_verify_steps"] = q.spec_verify_steps;
    if (!q.error.empty()) e["error"] = with_flag_names(q.error);
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
                 {"non_finite_logits", v.non_finite},
                 {"passed", v.passed()}};
  return j;
}

void print_summary(const ordered_json& j) {
  const ordered_json& c = j["config"];
  const int dp = c["dp_size"].get<int>();
  const int ep = c["ep_size"].get<int>();
  const std::string dp_text =
      (dp == 1 ? ""
               : str(", dp ", dp, c["enable_dp_attention"].get<bool>() ? " (DP attention)" : "")) +
      (ep == 1 ? "" : str(", ep ", ep));
  std::printf(
      "dcp run: %s, %d layers, %d heads | tp %d%s, dcp %d, backend %s%s | KV %s, page %d, kernel "
      "%s | comm %s, %d thread(s) per rank\n",
      c["model"].get<std::string>().c_str(), c["num_layers"].get<int>(),
      c["num_attention_heads"].get<int>(), c["tp_size"].get<int>(), dp_text.c_str(),
      c["dcp_size"].get<int>(),
      c["dcp_comm_backend"].get<std::string>().c_str(),
      c["dcp_replicate_q_proj"].get<bool>() ? " (replicated q)" : "",
      c["kv_cache_dtype"].get<std::string>().c_str(), c["page_size"].get<int>(),
      c["attention_kernel"].get<std::string>().c_str(), c["comm"].get<std::string>().c_str(),
      c["threads_per_rank"].get<int>());
  if (j.contains("prefix_cache")) {
    const ordered_json& pc = j["prefix_cache"];
    std::printf(
        "prefix cache: hit rate %.1f%% (%lld of %lld prompt tokens); host tier %lld tokens\n",
        100 * pc["hit_rate"].get<double>(), pc["hit_tokens"].get<long long>(),
        pc["lookup_tokens"].get<long long>(), pc["host_kv_capacity_tokens"].get<long long>());
    for (const ordered_json& r : pc["ranks"]) {
      std::printf(
          "  rank %lld: %lld B to host, %lld B back (%lld pages offloaded, %lld reloaded, %lld "
          "dropped)\n",
          r["rank"].get<long long>(), r["bytes_to_host"].get<long long>(),
          r["bytes_to_device"].get<long long>(), r["pages_offloaded"].get<long long>(),
          r["pages_reloaded"].get<long long>(), r["pages_dropped"].get<long long>());
    }
  }
  if (j.contains("disagg")) {
    const ordered_json& d = j["disagg"];
    std::string bytes;
    for (const ordered_json& b : d["bytes_per_decode_rank"]) {
      if (!bytes.empty()) bytes += ", ";
      bytes += std::to_string(b.get<long long>());
    }
    std::printf(
        "disaggregated: prefill DCP %d -> decode DCP %d, KV moved in %.1f ms; bytes received per "
        "decode rank: %s\n",
        d["prefill_dcp_size"].get<int>(), d["decode_dcp_size"].get<int>(),
        d["transfer_ms"].get<double>(), bytes.c_str());
  }
  const ordered_json& kv = j["kv"];
  const ordered_json& wt = j["weights"];
  if (!wt["bytes_per_rank"].empty()) {
    std::string per_rank;
    for (const ordered_json& b : wt["bytes_per_rank"]) {
      if (!per_rank.empty()) per_rank += ", ";
      char mib[32];
      std::snprintf(mib, sizeof mib, "%.2f", static_cast<double>(b.get<long long>()) / 1048576.0);
      per_rank += mib;
    }
    const std::string dtype = wt["dtype"].get<std::string>();
    const std::string experts = wt["experts_dtype"].get<std::string>();
    std::printf("weights: %s%s, MiB per rank: %s\n", dtype.c_str(),
                experts == dtype ? "" : (" (routed experts " + experts + ")").c_str(),
                per_rank.c_str());
  }
  std::printf("KV: logical capacity %lld tokens%s\n",
              kv["logical_capacity_tokens"].get<long long>(), dp > 1 ? " per DP group" : "");
  if (dp > 1) {
    for (const ordered_json& g : kv["dp_groups"]) {
      std::printf("  dp group %lld: %lld requests, %.2f MiB KV used of %.2f MiB allocated\n",
                  g["dp_rank"].get<long long>(), g["requests"].get<long long>(),
                  g["kv_bytes_used"].get<double>() / 1048576.0,
                  g["kv_bytes"].get<double>() / 1048576.0);
    }
  }
  for (const ordered_json& r : kv["ranks"]) {
    const std::string group = dp > 1 ? str("dp ", r["dp_rank"].get<long long>(), ", ") : "";
    std::printf(
        "  rank %lld (%sdcp rank %lld): peak %lld rows/layer, %.2f MiB used of %.2f MiB "
        "allocated\n",
        r["rank"].get<long long>(), group.c_str(), r["dcp_rank"].get<long long>(),
        r["kv_rows_used"].get<long long>(), r["kv_bytes_used"].get<double>() / 1048576.0,
        r["kv_bytes"].get<double>() / 1048576.0);
  }
  const ordered_json& t = j["timing"];
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
  for (const ordered_json& r : j["requests"]) {
    std::string toks;
    for (const ordered_json& x : r["output_tokens"]) {
      if (!toks.empty()) toks += ' ';
      toks += std::to_string(x.get<int>());
    }
    const bool finished = r["state"].get<std::string>() == "finished";
    const std::string why = r.contains("error") ? ": " + r["error"].get<std::string>() : "";
    const long long cached = r["cached_prompt_tokens"].get<long long>();
    std::printf("  request %lld (prompt %lld%s): %s\n", r["id"].get<long long>(),
                r["prompt_len"].get<long long>(),
                cached > 0 ? str(", ", cached, " cached").c_str() : "",
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
  const ordered_json& v = j["verify"];
  if (v["ran"].get<bool>() && v["steps_compared"].get<long long>() == 0) {
    std::printf("verify vs dcp 1: nothing to compare, no request finished in both runs: FAIL\n");
  } else if (v["ran"].get<bool>() && v["non_finite_logits"].get<long long>() > 0) {
    std::printf("verify vs dcp 1: %lld logits are NaN or infinite: FAIL\n",
                v["non_finite_logits"].get<long long>());
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

void dump_logits(const std::string& path, const DeploymentReport& r, int vocab) {
  ordered_json header;
  header["dtype"] = "float32";
  header["layout"] = "rows are (request, step) in the order of 'rows'; each row holds vocab logits";
  ordered_json rows = ordered_json::array();
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

}  // namespace dcp::cli
