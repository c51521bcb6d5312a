// Prefill/decode disaggregation with DCP: which rows each decode rank receives, and a transport
// that moves them.
//
// Dense prefill pages cannot be copied into striped decode storage, so the plan is built from the
// decode side's DCP metadata: equal DCP sizes pair prefill DCP rank r with decode DCP rank r and
// move its rows as they are (the page path); DCP 1 prefill -> DCP N decode relayouts tokens
// (decode rank r receives exactly the positions p with p mod N = r, in order); every other pair
// is refused. Page size and KV dtype must match. The plan carries the exact token count, so rows
// past it in a partial last page are never sent or exposed.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dcp/comm.h"
#include "dcp/deployment.h"
#include "dcp/dtype.h"
#include "dcp/engine.h"
#include "dcp/kv_cache.h"
#include "dcp/layout.h"
#include "dcp/model.h"
#include "dcp/weights.h"

namespace dcp {

struct KvLayoutSpec {
  int dcp_size = 1;
  int page_size = 1;
  KvDtype dtype = KvDtype::bf16;
  int interleave = 1;  // tokens per stripe (the allocator's)
};

// Decode rank `decode_rank` receives `rows` rows: source local rows source_row(0), ...,
// source_row(rows - 1) of the prefill rank with DCP rank src_dcp_rank, stored at its local rows
// 0 .. rows-1.
struct TransferPlan {
  int prefill_dcp_size = 1;
  int decode_dcp_size = 1;
  int decode_rank = 0;
  int interleave = 1;
  std::int64_t tokens = 0;  // the exact sequence length
  int src_dcp_rank = 0;
  std::int64_t rows = 0;   // layout count of `tokens` on decode_rank
  bool page_path = false;  // equal DCP sizes: rows move as the prefill rank holds them
  // Equal sizes: local row j as it is; prefill DCP 1 holds position p at local row p, so decode
  // local row j comes from its position there.
  std::int64_t source_row(std::int64_t j) const noexcept {
    return page_path ? j : layout::position(j, decode_rank, decode_dcp_size, interleave);
  }
};

// Pure function of its arguments; throws dcp::Error(invalid_argument) naming both DCP sizes
// for an unsupported pair, and on page size, interleave or dtype mismatches.
TransferPlan make_transfer_plan(const KvLayoutSpec& prefill, const KvLayoutSpec& decode,
                                int decode_rank, std::int64_t tokens);

// Who is who in the world communicator, for the transport.
struct DisaggRoles {
  std::vector<int> prefill_ranks;    // world ranks of the prefill group, in prefill DCP-rank order
                                     // (prefill_ranks[k] has DCP rank k % prefill dcp size)
  std::vector<int> decode_ranks;     // world ranks of the decode group
  std::vector<int> decode_dcp_rank;  // DCP rank of each decode rank
  KvLayoutSpec prefill, decode;
};

struct TransferItem {
  RequestId request = 0;
  std::int64_t tokens = 0;
};

struct TransferResult {
  RequestId request = 0;
  bool ok = false;
  std::string error;                // why it failed (checksum, capacity)
  std::int64_t bytes_received = 0;  // on this decode rank
};

struct TransportOptions {
  // Test hook: the source corrupts this request's payload after computing its checksum.
  std::optional<RequestId> corrupt_request;
};

// Moves the KV of `items` (all layers) from the prefill shards to the decode shards. Every
// world rank calls it with the same items; a prefill rank passes its shards (one per layer) and
// no decode allocator, a decode rank its shards, the allocator replica to allocate in and the
// group that holds the requests (every rank of roles.decode_ranks: its attention group); a rank
// in neither role (another decode replica's) passes nothing. A request whose payload fails its
// checksum on any decode rank, or does not fit, fails on every decode rank and leaves every
// other request's KV untouched. Returns the decode side's results (empty on other ranks).
std::vector<TransferResult> transfer_kv(Communicator& world, Communicator* decode_group,
                                        const DisaggRoles& roles,
                                        const std::vector<TransferItem>& items,
                                        const std::vector<KvShard*>& shards,
                                        KvAllocator* decode_allocator,
                                        const TransportOptions& options = {});

// ---- a whole disaggregated deployment, one call per world rank ----

struct DisaggConfig {
  ModelSource model;
  int prefill_dcp_size = 1;  // prefill group: TP = DCP = this, world ranks [0, prefill_dcp_size)
  // The decode side, the next world ranks (as many as its topology has): its DP replicas or
  // attention groups each take the requests deal_requests gives them.
  ParallelConfig decode;
  ModelOptions model_options;  // page size, KV dtype, capacity (both sides)
  EngineOptions engine;
  // Speculative decoding on the decode side (engine.num_draft_tokens > 0): its draft, replicated
  // on every decode rank, computes each adopted prompt's KV itself (nothing of it is moved).
  std::optional<ModelSource> draft;
  TransportOptions transport;
  bool poison_decode_pools = false;  // tests: NaN everywhere before transfer (stale rows show)
};

struct DisaggOutcome {
  bool is_decode = false;
  // On decode ranks, this replica's requests: first token (prefill) + decode steps.
  std::vector<RequestResult> results;
  bool reports_results = false;  // the first rank of a decode replica
  RankKv kv;  // on decode ranks: the KV it held and the requests its replica served
  std::vector<TransferResult> transfers;  // on decode ranks
  std::int64_t bytes_received = 0;        // by this decode rank
  std::int64_t logical_capacity_tokens = 0;  // of the decode side's KV cache
  double load_ms = 0;  // from the start until every rank of both sides had its weights
  double prefill_ms = 0, transfer_ms = 0;
  EngineStats decode_stats;
  std::optional<PrefixCacheStats> prefill_cache;  // on prefill ranks, with the prefix cache on
};

// Prefill on the prefill group (max_new_tokens 1, KV kept), first tokens broadcast, KV moved by
// transfer_kv, decode adopts and finishes the requests. World size must be
// prefill_dcp_size + the decode topology's world size.
DisaggOutcome run_disaggregated(Communicator& world, const DisaggConfig& config,
                                const std::vector<RequestSpec>& requests);

// The prefill group: one group with TP = DCP = prefill_dcp_size.
ParallelConfig prefill_group_config(int prefill_dcp_size);

// What every disaggregated deployment needs of its decode side and prefill group: a prefill group
// that resolves, DCP sizes, page sizes, dtypes and interleaves a transfer plan takes. Throws
// dcp::Error (invalid_argument) naming the field.
void check_disaggregation(const ParallelConfig& decode, const ModelOptions& model_options,
                          int prefill_dcp_size);

// Who takes part in a move to each decode replica (DP replica or attention group), by dp_rank:
// the prefill group and that replica's ranks. The world holds the prefill group (world ranks
// [0, prefill_dcp_size)) and then the decode ranks as in `decode`, or with `decode_first` (a
// server's: its frontend is a decode rank) the decode ranks and then the prefill group.
std::vector<DisaggRoles> replica_roles(int prefill_dcp_size, const Topology& decode,
                                       const ModelOptions& model_options,
                                       bool decode_first = false);

// A whole disaggregated run through the deployment's launcher (threads or MPI): spec.parallel is
// the decode side (its DP replicas or attention groups included), spec.requests the workload;
// the draft runs on the decode side, the prefix cache on the prefill side. The report is the first
// decode rank's, with every decode rank's KV; every process receives every result.
Launched<DeploymentReport> run_disaggregated_deployment(const DeploymentSpec& spec,
                                                        int prefill_dcp_size);

}  // namespace dcp
