// `dcp run`'s results: the --verify comparison against DCP 1, the JSON summary, the printed
// summary and the --dump-logits file.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/run_workload.h"
#include "dcp/deployment.h"

namespace dcp::cli {

struct Verify {
  bool ran = false;
  int requests = 0;        // requests both runs finished: the ones compared
  std::int64_t steps = 0;  // decode steps compared
  bool tokens_match = true;
  bool near_tie = false;  // a mismatch where the reference's top two were within the logit error
  double max_abs = 0;
  double max_rel = 0;
  double tolerance = 1e-3;      // relative to the largest |logit|
  std::int64_t non_finite = 0;  // NaN or infinite logits, in either run
  // A verification that compared nothing fails: it cannot vouch for anything; nor can one that
  // met a NaN or an infinity.
  bool passed() const {
    return !ran || (steps > 0 && non_finite == 0 && max_rel <= tolerance &&
                    (tokens_match || near_tie));
  }
};

// Compares the DCP run's logits and tokens with the teacher-forced DCP-1 reference.
Verify compare(const DeploymentReport& dcp, const DeploymentReport& ref, int vocab);

nlohmann::ordered_json report_json(const RunOptions& o, const Workload& w,
                                   const DeploymentReport& r, const Verify& v);
void print_summary(const nlohmann::ordered_json& j);
// Every step's logits as float32 behind a JSON header (u64 length, header, data: as safetensors).
void dump_logits(const std::string& path, const DeploymentReport& r, int vocab);

}  // namespace dcp::cli
