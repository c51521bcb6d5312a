// Subcommands of the `dcp` tool. Each add_* registers one subcommand and its callback.
#pragma once

#include <CLI/CLI.hpp>

namespace dcp::cli {

void add_demo_command(CLI::App& app);
void add_topology_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_gen_checkpoint_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_serve_command(CLI::App& app);

// The exit status the subcommand that ran asked for (0 unless it failed a check).
int exit_code();
void set_exit_code(int code);

}  // namespace dcp::cli
