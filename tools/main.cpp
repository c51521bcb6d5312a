// The `dcp` command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <new>

#include "cli/commands.h"
#include "cli/flag_names.h"
#include "dcp/error.h"

int main(int argc, char** argv) {
  CLI::App app{"dcp: decode context parallelism for MLA attention"};
  app.require_subcommand(1);
  dcp::cli::add_demo_command(app);
  dcp::cli::add_topology_command(app);
  dcp::cli::add_run_command(app);
  dcp::cli::add_gen_checkpoint_command(app);
  dcp::cli::add_bench_command(app);
  dcp::cli::add_plan_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help on --help (exit 0) and names the bad flag otherwise; usage errors exit 2.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const dcp::Error& e) {
    std::fprintf(stderr, "dcp: error: %s\n", dcp::cli::with_flag_names(e.what()).c_str());
    // A configuration the user can fix (bad value, or not available here) is a usage error.
    const bool usage = e.category() == dcp::ErrorCategory::invalid_argument ||
                       e.category() == dcp::ErrorCategory::unsupported;
    return usage ? 2 : 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr,
                 "dcp: error: out of memory: the configuration asks for more than this "
                 "machine can allocate\n");
    return 1;
  } catch (const std::exception& e) {  // a library below ours threw: still one line, no abort
    std::fprintf(stderr, "dcp: error: %s\n", e.what());
    return 1;
  }
  return dcp::cli::exit_code();
}
