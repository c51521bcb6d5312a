// The PyTorch peer of `dcp bench attention`: tools/torch_peer.py, run in a child process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

namespace dcp::cli {

class TorchPeer {
 public:
  // Finds torch_peer.py next to the dcp binary and checks that `python` imports torch, timing a
  // tiny shape. python "off" disables the peer. When unusable, available() is false and
  // reason() says why in one line. With flush_bytes > 0 the child reads that many bytes before
  // every timed call, as the benchmark does for its own calls on a cold cache.
  TorchPeer(const std::string& python, int threads, std::size_t flush_bytes);

  bool available() const { return available_; }
  const std::string& reason() const { return reason_; }
  const std::string& version() const { return version_; }

  // Median ms per dtype ("fp32", "bf16") for one decode call of `batch` requests of `context`
  // rows and `heads` query heads. Throws dcp::Error if the child fails.
  std::map<std::string, double> time(std::int64_t batch, std::int64_t context, std::int64_t heads,
                                     int repeats, const std::string& dtypes) const;

 private:
  std::string python_, script_, version_, reason_;
  int threads_ = 1;
  std::size_t flush_bytes_ = 0;
  bool available_ = false;
};

}  // namespace dcp::cli
