// The `dcp` command line.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <new>
#include <string>

#include "cli/cli_checks.h"
#include "cli/commands.h"
#include "cli/flag_names.h"
#include "dcp/blas.h"
#include "dcp/comm_mpi.h"
#include "dcp/error.h"
#include "dcp/version.h"

int main(int argc, char** argv) {
  // First, before any thread or MPI starts: OpenBLAS on generic kernels is started over.
  dcp::restart_with_better_blas_kernels(argv);
  CLI::App app{"dcp: decode context parallelism for MLA attention"};
  app.set_version_flag("--version", dcp::kVersion);
  app.require_subcommand(1);
  dcp::cli::add_demo_command(app);
  dcp::cli::add_topology_command(app);
  dcp::cli::add_run_command(app);
  dcp::cli::add_gen_checkpoint_command(app);
  dcp::cli::add_bench_command(app);
  dcp::cli::add_plan_command(app);
  dcp::cli::add_tokenize_command(app);
  dcp::cli::add_serve_command(app);
  dcp::cli::refuse_empty_values(app);
  // One line per error; under mpirun, naming this process's rank and ending the whole job, since
  // the other ranks may be waiting for this one in a collective.
  const auto fail = [](int code, const std::string& message) {
    const int rank = dcp::mpi_job_rank();
    if (rank >= 0) {
      std::fprintf(stderr, "dcp: error: rank %d: %s\n", rank, message.c_str());
      dcp::mpi_abort_job(code);
    }
    std::fprintf(stderr, "dcp: error: %s\n", message.c_str());
    return code;
  };
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints help on --help (exit 0) and names the bad flag otherwise; usage errors exit 2.
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const dcp::Error& e) {
    // A configuration the user can fix (bad value, or not available here) is a usage error.
    const bool usage = e.category() == dcp::ErrorCategory::invalid_argument ||
                       e.category() == dcp::ErrorCategory::unsupported;
    return fail(usage ? 2 : 1, dcp::cli::with_flag_names(e.what()));
  } catch (const std::bad_alloc&) {
    return fail(1,
                "out of memory: the configuration asks for more than this machine can allocate");
  } catch (const std::exception& e) {  // a library below ours threw: still one line, no abort
    return fail(1, e.what());
  }
  return dcp::cli::exit_code();
}
