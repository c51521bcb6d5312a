// dcp bench extend: gather vs DCP-native extend against prefix length.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>

#include "bench.h"
#include "bench_util.h"
#include "dcp/attention.h"
#include "dcp/comm_mpi.h"
#include "dcp/comm_threads.h"
#include "dcp/dcp_attention.h"
#include "dcp/error.h"
#include "dcp/kv_cache.h"
#include "dcp/merge.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp::cli {

std::vector<ExtendRow> bench_extend(const ExtendBenchOptions& o) {
  const ModelConfig config = preset_config(o.preset, o.num_layers);
  check_divides_heads(config, o.dcp_size, "--dcp-size");
  const std::vector<std::int64_t> prefixes = parse_list(o.prefix_lens, "--prefix-lens");
  const std::int64_t longest = *std::max_element(prefixes.begin(), prefixes.end());
  std::vector<ExtendRow> rows(prefixes.size());
  set_blas_threads(1);
  run_threads(o.dcp_size, [&](Communicator& world) {
    auto dcp = world.split(0, world.rank());
    const auto weights = make_synthetic_weights(1234);
    ModelOptions mo;
    mo.backend = o.dcp_size > 1 ? CombineBackend::a2a : CombineBackend::ag_rs;
    mo.kv_dtype = KvDtype::bf16;
    mo.kv_capacity_tokens = longest + o.chunk + 64LL * o.dcp_size;
    MlaModel model(config, *weights, world, *dcp, mo);
    std::mt19937 gen(7);
    std::uniform_int_distribution<std::int32_t> token(0, config.vocab_size - 1);
    for (std::size_t i = 0; i < prefixes.size(); ++i) {
      const RequestId id = static_cast<RequestId>(i);
      const std::int64_t prefix = prefixes[i];
      // Build the prefix once (in chunks, native path: cheap), then time extends over it.
      model.allocator().allocate(id, 0);
      for (std::int64_t at = 0; at < prefix;) {
        const std::int64_t n = std::min<std::int64_t>(2048, prefix - at);
        model.allocator().extend(id, n);
        ForwardBatch b;
        b.mode = ForwardMode::extend_native;
        b.entries = {{id, static_cast<std::int32_t>(n)}};
        for (std::int64_t k = 0; k < n; ++k) b.tokens.push_back(token(gen));
        model.forward(b);
        at += n;
      }
      std::vector<std::int32_t> chunk(static_cast<std::size_t>(o.chunk));
      for (auto& t : chunk) t = token(gen);
      for (ForwardMode mode : {ForwardMode::extend, ForwardMode::extend_native}) {
        std::vector<double> ms;
        double bytes = 0;
        for (int r = 0; r < o.repeats; ++r) {
          model.allocator().extend(id, o.chunk);
          ForwardBatch b;
          b.mode = mode;
          b.entries = {{id, o.chunk}};
          b.tokens = chunk;
          ForwardTimings t;
          world.barrier();
          model.forward(b, &t);
          ms.push_back(t.total_ms);
          bytes = static_cast<double>(t.dcp_comm.total_bytes()) / config.num_hidden_layers;
          model.allocator().truncate(id,
                                     prefix);  // roll back: every repeat extends the same prefix
        }
        if (world.rank() != 0) continue;
        if (mode == ForwardMode::extend) {
          rows[i].gather_ms = median(ms);
          rows[i].gather_bytes = bytes;
        } else {
          rows[i].native_ms = median(ms);
          rows[i].native_bytes = bytes;
        }
      }
      rows[i].prefix = prefix;
      model.allocator().free(id);
    }
  });
  return rows;
}

}  // namespace dcp::cli
