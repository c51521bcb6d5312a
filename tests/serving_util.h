// A served deployment in a test: a small spec, the deployment running in a background thread,
// a stream read to its end.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "dcp/serving.h"
#include "dcp/weights.h"

namespace dcp::test {

using namespace std::chrono_literals;

inline DeploymentSpec small_spec(const WeightSource& w, int tp, int dcp, int dp = 1,
                                 std::int64_t capacity = 2048) {
  DeploymentSpec s;
  s.model.config = preset_config("tiny", 2);
  s.model.weights = &w;
  s.parallel.tp_size = tp;
  s.parallel.dcp_size = dcp;
  s.parallel.dp_size = dp;
  s.model_options.kv_dtype = KvDtype::fp32;
  s.model_options.page_size = 4;
  s.model_options.kv_capacity_tokens = capacity;
  return s;
}

// Runs a served deployment in a background thread for the duration of the test body.
class Running {
 public:
  explicit Running(DeploymentSpec spec, ServeOptions o = {}) : dep_(std::move(spec), o) {
    thread_ = std::thread([this] {
      try {
        dep_.run();
      } catch (const std::exception& e) {
        error_ = e.what();
      }
    });
    while (!dep_.ready() && error_.empty()) std::this_thread::sleep_for(1ms);
  }
  ~Running() {
    dep_.shutdown(false);
    thread_.join();
  }
  ServingDeployment& operator*() { return dep_; }
  ServingDeployment* operator->() { return &dep_; }
  void stop(bool drain) {
    dep_.shutdown(drain);
    thread_.join();
    thread_ = std::thread([] {});
  }

 private:
  ServingDeployment dep_;
  std::thread thread_;
  std::string error_;
};

// Reads a stream to its end; every update's tokens in order.
inline StreamUpdate drain_stream(RequestStream& s, int* updates = nullptr) {
  StreamUpdate all;
  for (;;) {
    const std::optional<StreamUpdate> u = s.next(10s);
    if (!u) {
      ADD_FAILURE() << "request " << s.id() << " stalled";
      return all;
    }
    if (updates) ++*updates;
    all.tokens.insert(all.tokens.end(), u->tokens.begin(), u->tokens.end());
    all.logprobs.insert(all.logprobs.end(), u->logprobs.begin(), u->logprobs.end());
    all.prompt_logprobs.insert(all.prompt_logprobs.end(), u->prompt_logprobs.begin(),
                               u->prompt_logprobs.end());
    all.cached_prompt_tokens = u->cached_prompt_tokens;
    all.spec_verify_steps = u->spec_verify_steps;
    if (u->finished) {
      all.finished = true;
      all.finish_reason = u->finish_reason;
      all.error = u->error;
      return all;
    }
  }
}

inline ServeRequest greedy(std::vector<std::int32_t> prompt, int max_new) {
  ServeRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new;
  return r;
}

}  // namespace dcp::test
