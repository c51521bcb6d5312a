// Reasoning models (DeepSeek-R1, DeepSeek-V3.1 in thinking mode, Kimi-K2-Thinking) write their
// thinking first and close it with "</think>"; their chat templates open it ("<think>\n" ends the
// generation prompt), so a reply starts inside the reasoning (a "<think>" it writes itself is
// dropped). Kimi-K2-Thinking may also end it by opening its tool-call section. MiniCPM3 thinks
// only when it chooses to: a reply that opens with "<|thought_start|>" has its thought up to
// "<|thought_end|>", any other is all content. ReasoningSplit separates the two parts of a reply,
// whole or as it streams.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace dcp {

struct ReasoningMarkers {
  std::string open = "<think>", close = "</think>";
  // A marker that also ends the reasoning and is the content's start (Kimi-K2's
  // "<|tool_calls_section_begin|>"); empty: only `close` ends it.
  std::string opens_content;
  // The template opened the reasoning, so a reply starts inside it; false: a reply has reasoning
  // only where it starts with `open`.
  bool starts_inside = true;
  static ReasoningMarkers minicpm3() { return {"<|thought_start|>", "<|thought_end|>", "", false}; }
};

class ReasoningSplit {
 public:
  struct Parts {
    std::string reasoning, content;
  };
  explicit ReasoningSplit(ReasoningMarkers markers = {});
  // Feeds newly generated text; returns what is now known to be reasoning or content. A tail that
  // could begin the opening marker (at the start), the closing one or opens_content is held back
  // until the next text decides.
  Parts push(std::string_view text);
  // The end of the reply: what was held back.
  Parts finish();
  // Whether the closing marker (or opens_content) was seen, or the reply did not open with its
  // reasoning where it need not: the content has begun.
  bool ended() const noexcept { return ended_; }

 private:
  Parts release(bool at_end);

  ReasoningMarkers markers_;
  std::string held_;      // text not yet given out
  bool started_ = false;  // past a possible leading opening marker
  bool ended_ = false;
};

}  // namespace dcp
