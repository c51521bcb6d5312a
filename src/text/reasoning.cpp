// Splitting a reasoning model's reply into its reasoning and its content (see dcp/reasoning.h).
#include "dcp/reasoning.h"

#include <algorithm>
#include <string>
#include <utility>

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

ReasoningSplit::ReasoningSplit(std::string opens_content)
    : opens_content_(std::move(opens_content)) {}

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
  // The first of "</think>" (dropped) and opens_content (kept: the content's start).
  const std::size_t close = held_.find(kClose);
  const std::size_t opens = opens_content_.empty() ? std::string::npos : held_.find(opens_content_);
  if (close != std::string::npos || opens != std::string::npos) {
    const bool by_close =
        opens == std::string::npos || (close != std::string::npos && close < opens);
    const std::size_t at = by_close ? close : opens;
    out.reasoning = held_.substr(0, at);
    out.content = held_.substr(by_close ? at + kClose.size() : at);
    held_.clear();
    ended_ = true;
    return out;
  }
  const std::size_t keep =
      at_end ? 0
             : std::max(partial_tail(held_, kClose),
                        opens_content_.empty() ? 0 : partial_tail(held_, opens_content_));
  out.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace dcp
