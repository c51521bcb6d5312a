// Reasoning models (DeepSeek-R1, DeepSeek-V3.1 in thinking mode, Kimi-K2-Thinking) write their
// thinking first and close it with "</think>"; their chat templates open it ("<think>\n" ends the
// generation prompt), so a reply starts inside the reasoning (a "<think>" it writes itself is
// dropped). Kimi-K2-Thinking may also end it by opening its tool-call section. ReasoningSplit
// separates the two parts of a reply, whole or as it streams.
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
  // `opens_content`: a marker that also ends the reasoning and is the content's start (Kimi-K2's
  // "<|tool_calls_section_begin|>"); empty: only "</think>" ends it.
  explicit ReasoningSplit(std::string opens_content = {});
  // Feeds newly generated text; returns what is now known to be reasoning or content. A tail that
  // could begin "<think>" (at the start), "</think>" or opens_content is held back until the next
  // text decides.
  Parts push(std::string_view text);
  // The end of the reply: what was held back.
  Parts finish();
  // Whether "</think>" (or opens_content) was seen: the content has begun.
  bool ended() const noexcept { return ended_; }

 private:
  Parts release(bool at_end);

  std::string opens_content_;
  std::string held_;      // text not yet given out
  bool started_ = false;  // past a possible leading "<think>"
  bool ended_ = false;
};

}  // namespace dcp
