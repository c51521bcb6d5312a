// Splitting a reasoning model's reply into its reasoning and its content (see dcp/reasoning.h).
#include "dcp/reasoning.h"

#include <algorithm>

namespace dcp {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";

// The length of the longest tail of `text` that is a proper prefix of `marker`.
std::size_t partial_tail(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningSplit::Parts ReasoningSplit::push(std::string_view text) {
  held_.append(text);
  return release(false);
}

ReasoningSplit::Parts ReasoningSplit::finish() {
  return release(true);
}

ReasoningSplit::Parts ReasoningSplit::release(bool at_end) {
  Parts out;
  if (!started_) {
    // A leading "<think>" (the model opening what the template opened) is not reasoning.
    const std::string_view h = held_;
    if (h.size() >= kOpen.size() && h.substr(0, kOpen.size()) == kOpen) {
      held_.erase(0, kOpen.size());
      started_ = true;
    } else if (!at_end && kOpen.substr(0, h.size()) == h) {
      return out;  // may still become "<think>"
    } else {
      started_ = true;
    }
  }
  if (ended_) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  if (const std::size_t close = held_.find(kClose); close != std::string::npos) {
    out.reasoning = held_.substr(0, close);
    out.content = held_.substr(close + kClose.size());
    held_.clear();
    ended_ = true;
    return out;
  }
  const std::size_t keep = at_end ? 0 : partial_tail(held_, kClose);
  out.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace dcp
