// dcp bench serve: the HTTP server on loopback under C concurrent streaming clients (closed loop:
// each sends its next request when the last one ends), against `dcp run`'s engine on the same
// requests with at most C running, in the same run. Prompts are token ids (SGLang's /generate with
// input_ids), greedy, a fixed number of new tokens each.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/deployment.h"
#include "dcp/disagg.h"
#include "dcp/error.h"
#include "dcp/serving.h"
#include "serve/http_server.h"
#include "serve/openai_api.h"

namespace dcp::cli {
namespace {

struct ServeBenchOptions {
  std::string preset = "tiny";
  int num_layers = 2;
  int tp_size = 2;
  int dcp_size = 2;
  bool disaggregate = false;
  int prefill_dcp_size = 1;
  int prompt_len = 256;
  int max_tokens = 64;
  int rounds = 2;  // requests each client sends, one after the other
  std::string concurrency = "1,8,32,64";
  std::string csv, svg;
};

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double percentile(std::vector<double> x, double p) {
  if (x.empty()) return 0;
  std::sort(x.begin(), x.end());
  const std::size_t i = static_cast<std::size_t>(p * static_cast<double>(x.size() - 1) + 0.5);
  return x[std::min(i, x.size() - 1)];
}

struct ClientStats {
  std::vector<double> ttft_s, itl_s;
  std::int64_t tokens = 0, requests = 0, failures = 0;
};

// One streaming /generate request; records its first-token time and the gaps between tokens.
void one_request(httplib::Client& http, const std::vector<std::int32_t>& prompt, int max_tokens,
                 ClientStats& stats) {
  const nlohmann::json body = {{"input_ids", prompt}, {"stream", true},
                               {"sampling_params", {{"max_new_tokens", max_tokens},
                                                    {"temperature", 0},
                                                    {"ignore_eos", true}}}};
  httplib::Request req;
  req.method = "POST";
  req.path = "/generate";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  const auto start = Clock::now();
  auto last = start;
  std::size_t seen = 0;
  std::string buffer;
  req.content_receiver = [&](const char* data, std::size_t len, std::uint64_t, std::uint64_t) {
    buffer.append(data, len);
    for (std::size_t end; (end = buffer.find("\n\n")) != std::string::npos;
         buffer.erase(0, end + 2)) {
      const std::string event = buffer.substr(0, end);
      if (event.rfind("data: {", 0) != 0) continue;
      const auto j = nlohmann::json::parse(event.substr(6));
      const std::size_t ids = j["output_ids"].size();
      if (ids == seen) continue;
      const auto now = Clock::now();
      if (seen == 0) {
        stats.ttft_s.push_back(seconds(now - start));
      } else {
        for (std::size_t k = seen; k < ids; ++k)
          stats.itl_s.push_back(seconds(now - last) / static_cast<double>(ids - seen));
      }
      last = now;
      seen = ids;
    }
    return true;
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!http.send(req, res, error) || res.status != 200 ||
      seen != static_cast<std::size_t>(max_tokens)) {
    if (stats.failures++ == 0) {
      std::fprintf(stderr, "dcp bench serve: a request failed: %s, HTTP %d, %zu of %d tokens\n",
                   httplib::to_string(error).c_str(), res.status, seen, max_tokens);
    }
    return;
  }
  stats.tokens += static_cast<std::int64_t>(seen);
  ++stats.requests;
}

void bench_serve(const ServeBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  check_divides_heads(config, o.tp_size, "--tp-size");
  const auto concurrency = parse_list(o.concurrency, "--concurrency");
  const std::int64_t most = *std::max_element(concurrency.begin(), concurrency.end());
  DeploymentSpec spec;
  spec.model.config = config;  // synthetic weights
  spec.model.synthetic_dtype = preset_weight_dtype(o.preset);
  spec.parallel.tp_size = o.tp_size;
  spec.parallel.dcp_size = o.dcp_size;
  spec.model_options.kv_dtype = KvDtype::bf16;
  spec.model_options.page_size = 64;
  // Room for the most clients at once, with a page of slack per request.
  spec.model_options.kv_capacity_tokens =
      most * (o.prompt_len + o.max_tokens + 64L * o.dcp_size);
  // Disaggregated, the prefill group holds every prompt of a run at once until its transfer.
  if (o.disaggregate) {
    spec.model_options.kv_capacity_tokens =
        std::max(spec.model_options.kv_capacity_tokens,
                 most * o.rounds * (o.prompt_len + 1 + 64L * o.prefill_dcp_size));
  }
  spec.engine.max_running_requests = static_cast<int>(most);
  // Disaggregated: a prefill group of its own before the decode group, on both sides of the
  // comparison (the engine alone is `dcp run --disaggregate`).
  if (o.disaggregate) check_disaggregation(spec.parallel, spec.model_options, o.prefill_dcp_size);
  std::printf(
      "serving %s %d layers, TP %d, DCP %d%s; prompts of %d tokens, %d new tokens, %d "
      "requests per client; loopback HTTP vs the engine alone (dcp run)\n",
      o.preset.c_str(), o.num_layers, o.tp_size, o.dcp_size,
      o.disaggregate ? str(", prefill group DCP ", o.prefill_dcp_size).c_str() : "", o.prompt_len,
      o.max_tokens, o.rounds);
  std::printf("%5s %9s %12s %12s %11s %11s %10s %10s %12s %9s\n", "conc", "req/s", "tok/s",
              "run tok/s", "ttft p50", "ttft p99", "itl p50", "itl p99", "failures", "overhead");
  CsvFile csv(o.csv, {"concurrency", "requests_per_s", "output_tokens_per_s", "run_tokens_per_s",
                      "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "failures",
                      "overhead"});
  std::vector<Series> series;
  const std::vector<RequestSpec> pool =
      random_requests(most * o.rounds, o.prompt_len, o.max_tokens, config.vocab_size);

  // The server, once for all concurrencies.
  ServeOptions serve_options;
  serve_options.prefill_dcp_size = o.disaggregate ? o.prefill_dcp_size : 0;
  ServingDeployment deployment(spec, serve_options);
  serve::OpenAiApi api(
      deployment, nullptr,
      {"bench", o.max_tokens, std::nullopt, serve::ReasoningParser::none, {}, {}, {}, {}});
  serve::HttpServer http(api);
  const int port = http.bind("127.0.0.1", 0);
  std::thread listener([&] { http.listen(); });
  std::thread ranks([&] { deployment.run(); });
  // The server stops and its threads end however this function leaves (an error of the engine
  // alone's run included), so the error reaches the user instead of std::terminate.
  struct Stop {
    ServingDeployment& deployment;
    serve::HttpServer& http;
    std::thread &ranks, &listener;
    ~Stop() {
      deployment.shutdown(false);
      ranks.join();
      http.stop();
      listener.join();
    }
  } stop{deployment, http, ranks, listener};
  while (!deployment.ready()) std::this_thread::sleep_for(std::chrono::milliseconds(5));

  for (const std::int64_t c : concurrency) {
    // The engine alone: the same requests, at most c running.
    DeploymentSpec run = spec;
    run.engine.max_running_requests = static_cast<int>(c);
    run.requests.assign(pool.begin(), pool.begin() + c * o.rounds);
    const auto t_run = Clock::now();
    const DeploymentReport rep =
        (o.disaggregate ? run_disaggregated_deployment(run, o.prefill_dcp_size)
                        : run_deployment(run))
            .report;
    const double run_s =
        seconds(Clock::now() - t_run) - rep.model_load_ms / 1e3;  // as served: loaded
    std::int64_t run_tokens = 0;
    for (const RequestResult& r : rep.results)
      run_tokens += static_cast<std::int64_t>(r.output_tokens.size());

    std::vector<ClientStats> stats(static_cast<std::size_t>(c));
    std::vector<std::thread> clients;
    const auto t0 = Clock::now();
    for (std::int64_t i = 0; i < c; ++i) {
      clients.emplace_back([&, i] {
        httplib::Client client("127.0.0.1", port);
        client.set_read_timeout(600, 0);
        for (int k = 0; k < o.rounds; ++k)
          one_request(client, pool[static_cast<std::size_t>(i * o.rounds + k)].prompt, o.max_tokens,
                      stats[static_cast<std::size_t>(i)]);
      });
    }
    for (auto& t : clients) t.join();
    const double wall = seconds(Clock::now() - t0);
    ClientStats all;
    for (const ClientStats& s : stats) {
      all.ttft_s.insert(all.ttft_s.end(), s.ttft_s.begin(), s.ttft_s.end());
      all.itl_s.insert(all.itl_s.end(), s.itl_s.begin(), s.itl_s.end());
      all.tokens += s.tokens;
      all.requests += s.requests;
      all.failures += s.failures;
    }
    const double rps = static_cast<double>(all.requests) / wall;
    const double tps = static_cast<double>(all.tokens) / wall;
    const double run_tps = static_cast<double>(run_tokens) / run_s;
    const double overhead = 1.0 - tps / run_tps;
    std::printf("%5lld %9.2f %12.1f %12.1f %9.1fms %9.1fms %8.2fms %8.2fms %12lld %8.1f%%\n",
                static_cast<long long>(c), rps, tps, run_tps, 1e3 * percentile(all.ttft_s, 0.5),
                1e3 * percentile(all.ttft_s, 0.99), 1e3 * percentile(all.itl_s, 0.5),
                1e3 * percentile(all.itl_s, 0.99), static_cast<long long>(all.failures),
                100 * overhead);
    std::fflush(stdout);
    csv.row({str(c), str(rps), str(tps), str(run_tps), str(1e3 * percentile(all.ttft_s, 0.5)),
             str(1e3 * percentile(all.ttft_s, 0.99)), str(1e3 * percentile(all.itl_s, 0.5)),
             str(1e3 * percentile(all.itl_s, 0.99)), str(all.failures), str(overhead)});
    add_point(series, "dcp serve (HTTP)", static_cast<double>(c), tps);
    add_point(series, "engine alone (dcp run)", static_cast<double>(c), run_tps);
  }
  if (!o.svg.empty()) {
    write_svg_chart(o.svg, "output tokens/s, loopback HTTP vs the engine alone",
                    "concurrent clients", "tokens/s", series, true);
  }
}

}  // namespace

void add_serve_bench(CLI::App* bench) {
  auto o = std::make_shared<ServeBenchOptions>();
  CLI::App* cmd = bench->add_subcommand(
      "serve", "dcp serve on loopback under concurrent streaming clients vs the engine alone");
  cmd->add_option("--preset", o->preset, "model geometry (synthetic weights)")
      ->capture_default_str();
  cmd->add_option("--num-layers", o->num_layers, "layers")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--tp-size", o->tp_size, "TP size (ranks as threads)")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--dcp-size", o->dcp_size, "DCP size (divides --tp-size)")
      ->check(at_least(1))
      ->capture_default_str();
  CLI::Option* disaggregate = cmd->add_flag(
      "--disaggregate", o->disaggregate,
      "prefill on a group of its own, move the KV, decode on the --tp-size/--dcp-size group (the "
      "server and the engine alone both)");
  cmd->add_option("--prefill-dcp-size", o->prefill_dcp_size,
                  "DCP (= TP) size of the prefill group with --disaggregate")
      ->check(at_least(1))
      ->capture_default_str()
      ->needs(disaggregate);
  cmd->add_option("--prompt-len", o->prompt_len, "prompt tokens per request")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--max-tokens", o->max_tokens, "new tokens per request")
      ->check(at_least(2))
      ->capture_default_str();
  cmd->add_option("--rounds", o->rounds, "requests each client sends in turn")
      ->check(at_least(1))
      ->capture_default_str();
  cmd->add_option("--concurrency", o->concurrency, "concurrent clients")
      ->check(list_at_least(1))
      ->capture_default_str();
  add_output_files(cmd, o->csv, o->svg, "a plot (tokens/s vs concurrency)");
  cmd->callback([o] { bench_serve(*o); });
}

}  // namespace dcp::cli
