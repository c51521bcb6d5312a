// Splitting a reasoning model's reply into its reasoning and its content (see dcp/reasoning.h).
#include "dcp/reasoning.h"

#include <algorithm>
#include <string>
#include <utility>

namespace dcp {
namespace {

// The length of the longest tail of `text` that is a proper prefix of `marker`.
std::size_t partial_tail(std::string_view text, std::string_view marker) {
  for (std::size_t n = std::min(marker.size() - 1, text.size()); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

ReasoningSplit::ReasoningSplit(ReasoningMarkers markers) : markers_(std::move(markers)) {}

ReasoningSplit::Parts ReasoningSplit::push(std::string_view text) {
  held_.append(text);
  return release(false);
}

ReasoningSplit::Parts ReasoningSplit::finish() {
  return release(true);
}

ReasoningSplit::Parts ReasoningSplit::release(bool at_end) {
  Parts out;
  const std::string_view open = markers_.open, close_marker = markers_.close;
  const std::string& opens_content = markers_.opens_content;
  if (!started_) {
    // A leading opening marker is not reasoning (the model opening what the template opened,
    // or, where the reply need not think, opening its thought).
    const std::string_view h = held_;
    if (h.size() >= open.size() && h.substr(0, open.size()) == open) {
      held_.erase(0, open.size());
      started_ = true;
    } else if (!at_end && open.substr(0, h.size()) == h) {
      return out;  // may still become the marker
    } else {
      started_ = true;
      ended_ = !markers_.starts_inside;  // a reply that did not open its thought: all content
    }
  }
  if (ended_) {
    out.content = std::move(held_);
    held_.clear();
    return out;
  }
  // The first of the closing marker (dropped) and opens_content (kept: the content's start).
  const std::size_t close = held_.find(close_marker);
  const std::size_t opens = opens_content.empty() ? std::string::npos : held_.find(opens_content);
  if (close != std::string::npos || opens != std::string::npos) {
    const bool by_close =
        opens == std::string::npos || (close != std::string::npos && close < opens);
    const std::size_t at = by_close ? close : opens;
    out.reasoning = held_.substr(0, at);
    out.content = held_.substr(by_close ? at + close_marker.size() : at);
    held_.clear();
    ended_ = true;
    return out;
  }
  const std::size_t keep =
      at_end ? 0
             : std::max(partial_tail(held_, close_marker),
                        opens_content.empty() ? 0 : partial_tail(held_, opens_content));
  out.reasoning = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

}  // namespace dcp
