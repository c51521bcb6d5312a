// `dcp bench plot`: a table, CSV and SVG plot from the JSON that the Google Benchmark binaries
// write (bench/bench_kernels --benchmark_out=FILE --benchmark_out_format=json). One measure (a
// time or a user counter) against one benchmark argument, a series per benchmark family and
// combination of its other arguments.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "bench/bench.h"
#include "bench/bench_util.h"
#include "dcp/error.h"

namespace dcp::cli {
namespace {

// One benchmark run: its family and named arguments, parsed from the run name
// ("BM_Merge/parts:2/rows:2048"; an argument without a name is arg<i>, by position).
struct Run {
  std::string family;
  std::vector<std::pair<std::string, std::string>> args;
  const nlohmann::json* entry = nullptr;
};

Run parse_run(const nlohmann::json& entry) {
  const std::string name = entry.value("run_name", entry.value("name", std::string()));
  Run run;
  run.entry = &entry;
  std::size_t start = 0;
  for (int i = 0; start <= name.size(); ++i) {
    const std::size_t end = std::min(name.find('/', start), name.size());
    const std::string part = name.substr(start, end - start);
    if (i == 0) {
      run.family = part;
    } else {
      const std::size_t colon = part.find(':');
      if (colon == std::string::npos) {
        run.args.emplace_back("arg" + std::to_string(i - 1), part);
      } else {
        run.args.emplace_back(part.substr(0, colon), part.substr(colon + 1));
      }
    }
    start = end + 1;
  }
  return run;
}

// Seconds per time unit of Google Benchmark's "time_unit" field.
double seconds_per(const std::string& unit, const std::string& path) {
  if (unit == "ns") return 1e-9;
  if (unit == "us") return 1e-6;
  if (unit == "ms") return 1e-3;
  if (unit == "s") return 1.0;
  throw_error(ErrorCategory::io, str("--json ", path, ": unknown time_unit '", unit, "'"), __FILE__,
              __LINE__);
}

// The measure y of an entry: times in milliseconds, counters as written.
bool measure(const nlohmann::json& entry, const std::string& y, const std::string& path,
             double& value) {
  const auto it = entry.find(y);
  if (it == entry.end() || !it->is_number()) return false;
  value = it->get<double>();
  if (y == "real_time" || y == "cpu_time") {
    value *= seconds_per(entry.value("time_unit", std::string("ns")), path) * 1e3;
  }
  return true;
}

std::string join(const std::set<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

void bench_plot(const PlotBenchOptions& o) {
  std::ifstream in(o.json);
  DCP_CHECK(in.good(), io, "--json ", o.json, ": cannot open");
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw_error(ErrorCategory::io, str("--json ", o.json, ": not JSON (", e.what(), ")"), __FILE__,
                __LINE__);
  }
  DCP_CHECK(doc.is_object() && doc.contains("benchmarks") && doc["benchmarks"].is_array(), io,
            "--json ", o.json,
            ": no 'benchmarks' array (write it with --benchmark_out=FILE "
            "--benchmark_out_format=json)");

  // Plain runs; with --benchmark_report_aggregates_only there are none, and the medians stand in.
  std::vector<Run> runs;
  // (A run that failed, SkipWithError, has no measures worth plotting.)
  for (const auto& entry : doc["benchmarks"]) {
    if (entry.value("run_type", std::string("iteration")) == "iteration" &&
        !entry.value("error_occurred", false)) {
      runs.push_back(parse_run(entry));
    }
  }
  if (runs.empty()) {
    for (const auto& entry : doc["benchmarks"]) {
      if (entry.value("aggregate_name", std::string()) == "median") {
        runs.push_back(parse_run(entry));
      }
    }
  }
  DCP_CHECK(!runs.empty(), io, "--json ", o.json, ": no benchmark runs in it");

  // y per (series, x); repetitions of one run give several values, of which the median counts.
  std::set<std::string> arg_names, measures;
  std::map<std::string, std::map<double, std::vector<double>>> points;
  std::vector<std::string> order;  // series in the order they first appear
  for (const Run& run : runs) {
    for (const auto& [key, value] : run.entry->items()) {
      if (value.is_number() && key != "family_index" && key != "per_family_instance_index" &&
          key != "repetitions" && key != "repetition_index" && key != "threads" &&
          key != "iterations") {
        measures.insert(key);
      }
    }
    std::string label = run.family;
    double x = 0;
    bool has_x = false;
    for (const auto& [key, value] : run.args) {
      arg_names.insert(key);
      if (key == o.x) {
        char* end = nullptr;
        x = std::strtod(value.c_str(), &end);
        DCP_CHECK(end != value.c_str() && *end == '\0', invalid_argument, "--x ", o.x, ": run ",
                  run.family, " has the value '", value, "', not a number");
        has_x = true;
      } else {
        label += " " + key + "=" + value;
      }
    }
    double y = 0;
    if (!has_x || !measure(*run.entry, o.y, o.json, y)) continue;
    if (!points.count(label)) order.push_back(label);
    points[label][x].push_back(y);
  }
  DCP_CHECK(arg_names.count(o.x), invalid_argument, "--x ", o.x,
            " is not an argument of the benchmarks in ", o.json, " (arguments: ", join(arg_names),
            ")");
  DCP_CHECK(measures.count(o.y), invalid_argument, "--y ", o.y, " is not a measure in ", o.json,
            " (measures: ", join(measures), ")");
  DCP_CHECK(!points.empty(), invalid_argument, "no run in ", o.json, " has both the argument --x ",
            o.x, " and the measure --y ", o.y);

  // A scale that keeps the printed values short; times stay in ms.
  double largest = 0;
  for (const auto& [label, by_x] : points) {
    for (const auto& [x, ys] : by_x) largest = std::max(largest, std::abs(median(ys)));
  }
  const bool is_time = o.y == "real_time" || o.y == "cpu_time";
  double scale = 1;
  std::string unit = is_time ? " (ms)" : "";
  if (!is_time && largest >= 1e9) {
    scale = 1e9;
    unit = " (G)";
  } else if (!is_time && largest >= 1e6) {
    scale = 1e6;
    unit = " (M)";
  }

  CsvFile csv(o.csv, {"series", o.x, o.y});
  std::vector<Series> chart;
  double x_min = 1e300, x_max = -1e300;
  std::printf("%s against %s, from %s\n", o.y.c_str(), o.x.c_str(), o.json.c_str());
  std::printf("%-48s %14s %16s\n", "series", o.x.c_str(), (o.y + unit).c_str());
  for (const std::string& label : order) {
    for (const auto& [x, ys] : points[label]) {
      const double y = median(ys);
      std::printf("%-48s %14g %16.4g\n", label.c_str(), x, y / scale);
      csv.row({label, str(x), str(y)});
      add_point(chart, label, x, y / scale);
      x_min = std::min(x_min, x);
      x_max = std::max(x_max, x);
    }
  }
  if (!o.svg.empty()) {
    const bool log_x = x_min > 0 && x_max / x_min > 8;
    write_svg_chart(o.svg, str(o.y, " against ", o.x), o.x, o.y + unit, chart, log_x);
  }
}

void add_plot_bench(CLI::App* bench) {
  auto po = std::make_shared<PlotBenchOptions>();
  CLI::App* plot = bench->add_subcommand(
      "plot",
      "Table, CSV and SVG plot of a Google Benchmark JSON file (bench/bench_kernels "
      "--benchmark_out=FILE --benchmark_out_format=json)");
  plot->add_option("--json", po->json, "the Google Benchmark JSON file")->required();
  plot->add_option("--x", po->x, "the benchmark argument on the x axis (e.g. heads, parts)")
      ->required();
  plot->add_option("--y", po->y,
                   "the measure: real_time or cpu_time (ms), or a user counter (e.g. FLOP/s)")
      ->capture_default_str();
  add_output_files(plot, po->csv, po->svg, "the plot");
  plot->callback([po] { bench_plot(*po); });
}

}  // namespace dcp::cli
