// Reasoning models (DeepSeek-R1, DeepSeek-V3.1 in thinking mode) write their thinking first and
// close it with "</think>"; their chat templates open it ("<think>\n" ends the generation
// prompt), so a reply starts inside the reasoning (a "<think>" it writes itself is dropped).
// ReasoningSplit separates the two parts of a reply, whole or as it streams.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dcp {

class ReasoningSplit {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  // Feeds newly generated text; returns what is now known to be reasoning or content. A tail that
  // could begin "<think>" (at the start) or "</think>" is held back until the next text decides.
  Parts push(std::string_view text);
  // The end of the reply: what was held back.
  Parts finish();
  // Whether "</think>" was seen: the content has begun.
  bool ended() const noexcept { return ended_; }

 private:
  Parts release(bool at_end);

  std::string held_;      // text not yet given out
  bool started_ = false;  // past a possible leading "<think>"
  bool ended_ = false;
};

}  // namespace dcp
