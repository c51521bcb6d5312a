// Runs tools/bench/torch_peer.py as a child process and parses its "<dtype> <ms>" lines.
#include "bench/torch_peer.h"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <sstream>

#include "dcp/error.h"

namespace dcp::cli {

namespace {

// The directory of the running binary: CMake copies torch_peer.py there.
std::string binary_dir() {
  std::array<char, 4096> buf{};
  const ssize_t n = readlink("/proc/self/exe", buf.data(), buf.size() - 1);
  if (n <= 0) return ".";
  const std::string exe(buf.data(), static_cast<std::size_t>(n));
  const auto slash = exe.rfind('/');
  return slash == std::string::npos ? "." : exe.substr(0, slash);
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct ChildResult {
  int status = -1;  // exit code, or -1 when the child did not exit normally
  std::string output;
};

// Exit status of coreutils `timeout` when the limit expired.
constexpr int kTimedOut = 124;

// Runs `command` through the shell with stderr folded into stdout, killed after `limit_s`
// seconds (coreutils `timeout`), so a child that hangs cannot hang the benchmark.
ChildResult run_child(const std::string& command, int limit_s) {
  ChildResult r;
  const std::string line =
      "timeout --kill-after=10 " + std::to_string(limit_s) + " " + command + " 2>&1";
  FILE* pipe = popen(line.c_str(), "r");
  if (pipe == nullptr) return r;
  std::array<char, 512> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), pipe) != nullptr)
    r.output += buf.data();
  const int raw = pclose(pipe);
  if (raw != -1 && WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
  return r;
}

std::string first_line(const std::string& s) {
  return s.substr(0, s.find('\n'));
}

// Wall-clock limits: importing torch, and one point (the largest default point, 8 x 128K rows
// at 128 heads, takes about a minute for both dtypes).
constexpr int kProbeLimitS = 300;
constexpr int kPointLimitS = 1800;

}  // namespace

TorchPeer::TorchPeer(const std::string& python, int threads, std::size_t flush_bytes)
    : python_(python), threads_(threads), flush_bytes_(flush_bytes) {
  if (python == "off") {
    reason_ = "disabled by --torch-python off";
    return;
  }
  script_ = binary_dir() + "/torch_peer.py";
  if (access(script_.c_str(), R_OK) != 0) {
    reason_ = script_ + " is missing (CMake copies it next to the dcp binary)";
    return;
  }
  const ChildResult probe =
      run_child(shell_quote(python_) + " " + shell_quote(script_) + " --version", kProbeLimitS);
  if (probe.status == 0) {
    available_ = true;
    version_ = first_line(probe.output);
  } else if (probe.status == kTimedOut) {
    reason_ = python_ + " did not import torch within " + std::to_string(kProbeLimitS) + " s";
  } else if (probe.status == 3) {
    reason_ = python_ + " cannot import torch (Debian: apt-get install python3-torch)";
  } else {
    reason_ = python_ + " failed: " + first_line(probe.output);
  }
}

std::map<std::string, double> TorchPeer::time(std::int64_t batch, std::int64_t context,
                                              std::int64_t heads, int repeats,
                                              const std::string& dtypes) const {
  DCP_CHECK(available_, unsupported, "the PyTorch peer is not available: ", reason_);
  std::ostringstream cmd;
  cmd << shell_quote(python_) << " " << shell_quote(script_) << " " << batch << " " << context
      << " " << heads << " " << threads_ << " " << repeats << " " << shell_quote(dtypes) << " "
      << flush_bytes_;
  const ChildResult r = run_child(cmd.str(), kPointLimitS);
  DCP_CHECK(r.status != kTimedOut, io, "PyTorch peer timed out after ", kPointLimitS, " s (",
            cmd.str(), ")");
  DCP_CHECK(r.status == 0, io, "PyTorch peer failed (", cmd.str(), "): ", r.output);
  std::map<std::string, double> ms;
  std::istringstream lines(r.output);
  std::string dtype;
  double value = 0;
  while (lines >> dtype >> value) ms[dtype] = value;
  DCP_CHECK(!ms.empty(), io, "PyTorch peer printed no timings: ", r.output);
  return ms;
}

}  // namespace dcp::cli
