#include "cli/flag_names.h"

#include <cctype>
#include <string_view>
#include <utility>

namespace dcp::cli {
namespace {

// Library parameter -> the flag that sets it.
constexpr std::pair<std::string_view, std::string_view> kFlags[] = {
    {"tp_size", "--tp-size"},
    {"dp_size", "--dp-size"},
    {"dcp_size", "--dcp-size"},
    {"pcp_size", "--pcp-size"},
    {"ep_size", "--ep-size"},
    {"prefill_dcp_size", "--prefill-dcp-size"},
    {"enable_dp_attention", "--enable-dp-attention"},
    {"dcp_comm_backend", "--dcp-comm-backend"},
    {"replicate_q_proj", "--dcp-replicate-q-proj"},
    {"platform", "--platform"},
    {"page_size", "--page-size"},
    {"kv_dtype", "--kv-cache-dtype"},
    {"kv_capacity_tokens", "--max-total-tokens"},
    {"attention_kernel", "--attention-kernel"},
    {"weight_kernel", "--weight-kernel"},
    {"threads", "--threads-per-rank"},
    {"chunked_prefill_size", "--chunked-prefill-size"},
    {"max_running_requests", "--max-running-requests"},
    {"max_new_tokens", "--max-new-tokens"},
    {"num_draft_tokens", "--speculative-num-draft-tokens"},
    {"enable_prefix_cache", "--enable-prefix-cache"},
    {"host_kv_capacity_tokens", "--host-kv-capacity-tokens"},
    {"model_path", "--model-path"},
    {"num_layers", "--num-layers"},
    {"preset", "--preset"},
    {"comm", "--comm"},
    {"comm_timeout", "--comm-timeout"},
};

bool word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_' || c == '-';
}

}  // namespace

std::string with_flag_names(const std::string& message) {
  std::string out;
  std::size_t i = 0;
  while (i < message.size()) {
    if (word_char(message[i])) {
      std::size_t j = i;
      while (j < message.size() && word_char(message[j])) ++j;
      const std::string_view word(message.data() + i, j - i);
      // A plain word ("preset", "comm") is a parameter only in the "name = value" form.
      const bool assigned = message.compare(j, 3, " = ") == 0;
      std::string_view flag;
      for (const auto& [param, f] : kFlags) {
        if (word == param && (assigned || word.find('_') != std::string_view::npos)) flag = f;
      }
      if (flag.empty()) {
        out.append(word);
      } else {
        out.append(flag);
        if (assigned) j += 2;  // "name = value" -> "--flag value"
      }
      i = j;
    } else {
      out.push_back(message[i++]);
    }
  }
  return out;
}

}  // namespace dcp::cli
