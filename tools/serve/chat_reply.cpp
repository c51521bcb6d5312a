// One chat choice's reply: its thinking (with --reasoning-parser), its content and the tool calls
// it makes, whole or as deltas (see chat_reply.h).
#include "serve/chat_reply.h"

#include <optional>
#include <vector>

#include "dcp/error.h"

namespace dcp::serve {

ChatReply::ChatReply(ToolUse use, std::string call_id, bool reasoning, bool include_reasoning,
                     ReasoningMarkers markers)
    : use_(std::move(use)),
      call_id_(std::move(call_id)),
      reasoning_(reasoning),
      include_reasoning_(include_reasoning),
      markers_(std::move(markers)),
      split_(markers_) {
  if (use_.mode == ToolUse::Mode::read_auto) calls_.emplace(use_.format);
}

json ChatReply::call_json(std::size_t index, const std::string& id, const std::string& name,
                          const std::string& arguments) const {
  return {{"index", index},
          {"id", id.empty() ? str(call_id_, "-", index) : id},
          {"type", "function"},
          {"function", {{"name", name}, {"arguments", arguments}}}};
}

ChatReply::Read ChatReply::read(const std::string& text) const {
  Read r;
  switch (use_.mode) {
    case ToolUse::Mode::none: r.content = text; break;
    case ToolUse::Mode::named:  // no call where nothing was written (thinking that never ended)
      if (text.empty()) {
        r.content = text;
      } else {
        r.calls.push_back(call_json(0, "", use_.function, text));
      }
      break;
    case ToolUse::Mode::required: {
      // The guide keeps the text to the list's grammar; cut short, what follows the calls read is
      // content.
      ListedCallReader reader;
      reader.read(text);
      for (std::size_t k = 0; k < reader.calls().size(); ++k)
        r.calls.push_back(call_json(k, "", reader.calls()[k].name, reader.calls()[k].arguments));
      if (const std::size_t from = reader.content_resumes(true); from != ListedCallReader::npos)
        r.content = text.substr(from);
      break;
    }
    case ToolUse::Mode::read_auto: {
      ParsedToolCalls parsed = parse_tool_calls(text, use_.format);
      r.content = std::move(parsed.content);
      // parallel_tool_calls false: the first call only.
      const std::size_t keep =
          use_.parallel ? parsed.calls.size() : std::min<std::size_t>(parsed.calls.size(), 1);
      for (std::size_t k = 0; k < keep; ++k) {
        const ToolCall& c = parsed.calls[k];
        r.calls.push_back(call_json(k, c.id, c.name, c.arguments));
      }
      break;
    }
  }
  return r;
}

json ChatReply::content_delta(const std::string& text, bool finished) {
  text_ += text;
  switch (use_.mode) {
    case ToolUse::Mode::none:
      sent_ = text_.size();
      return text.empty() ? json(nullptr) : json{{"content", text}};
    case ToolUse::Mode::named: {
      // The arguments stream as they come, after a first delta with the call's id and name.
      json call = {{"index", 0}, {"function", {{"arguments", text}}}};
      if (text.empty()) return nullptr;
      if (!opened_) {
        call = call_json(0, "", use_.function, text);
        opened_ = called_ = true;
      }
      return {{"tool_calls", json::array({call})}};
    }
    case ToolUse::Mode::required: return listed_delta(finished);
    case ToolUse::Mode::read_auto: return auto_delta(finished);
  }
  return nullptr;
}

json ChatReply::auto_delta(bool finished) {
  ToolCallReader& reader = *calls_;
  reader.read(text_);
  // The content is the text up to the calls' marker, then the text from where it resumes after
  // them; before the marker, a tail that could begin it is held back.
  std::size_t head = reader.calls_begin();
  if (head == ToolCallReader::npos) {
    head = text_.size();
    if (!finished) {
      const std::string_view marker = tool_calls_begin(use_.format);
      for (std::size_t n = std::min(marker.size() - 1, text_.size()); n > 0; --n) {
        if (text_.compare(text_.size() - n, n, marker.substr(0, n)) == 0) {
          head = text_.size() - n;
          break;
        }
      }
    }
  }
  std::string content;
  if (sent_ < head) content = text_.substr(sent_, head - sent_);
  const std::size_t resumes = reader.content_resumes(finished);
  if (reader.calls_begin() != ToolCallReader::npos && resumes != ToolCallReader::npos)
    content += text_.substr(resumes + (std::max(sent_, head) - head));
  sent_ += content.size();
  json d = new_calls(reader.calls());
  if (!content.empty()) d["content"] = std::move(content);
  return d.empty() ? json(nullptr) : d;
}

json ChatReply::listed_delta(bool finished) {
  listed_.read(text_);
  json d = new_calls(listed_.calls());
  if (const std::size_t from = listed_.content_resumes(finished); from != ListedCallReader::npos) {
    std::string content = text_.substr(from + sent_);
    sent_ += content.size();
    if (!content.empty()) d["content"] = std::move(content);
  }
  return d.empty() ? json(nullptr) : d;
}

json ChatReply::new_calls(const std::vector<ToolCall>& read) {
  json calls = json::array();
  for (; calls_sent_ < read.size(); ++calls_sent_) {
    if (!use_.parallel && calls_sent_ > 0) continue;
    const ToolCall& c = read[calls_sent_];
    calls.push_back(call_json(calls_sent_, c.id, c.name, c.arguments));
    called_ = true;
  }
  return calls.empty() ? json::object() : json{{"tool_calls", std::move(calls)}};
}

json ChatReply::message(const std::string& text) {
  // A reasoning model's thinking, then its content (which tool calls are read from).
  ReasoningSplit split(markers_);
  ReasoningSplit::Parts parts{"", text};
  if (reasoning_) {
    parts = split.push(text);
    ReasoningSplit::Parts rest = split.finish();
    parts.reasoning += rest.reasoning;
    parts.content += rest.content;
  }
  Read r = read(parts.content);
  called_ = !r.calls.empty();
  json m = {{"role", "assistant"}};
  // null: the calls say it all, or the reply never got past its thinking.
  const bool none = r.content.empty() && (called_ || (reasoning_ && !split.ended()));
  m["content"] = none ? json(nullptr) : json(r.content);
  if (called_) {
    for (json& call : r.calls) call.erase("index");  // deltas number their calls; a message lists
    m["tool_calls"] = std::move(r.calls);
  }
  if (reasoning_ && include_reasoning_) m["reasoning_content"] = parts.reasoning;
  return m;
}

json ChatReply::delta(const std::string& text, bool finished) {
  std::string content = text, reasoning;
  if (reasoning_) {
    ReasoningSplit::Parts parts = split_.push(text);
    if (finished) {
      ReasoningSplit::Parts rest = split_.finish();
      parts.reasoning += rest.reasoning;
      parts.content += rest.content;
    }
    content = std::move(parts.content);
    if (include_reasoning_) reasoning = std::move(parts.reasoning);
  }
  json d = content_delta(content, finished);
  if (d.is_null() && (finished || !reasoning.empty())) d = json::object();  // a last one goes out
  if (!reasoning.empty()) d["reasoning_content"] = reasoning;
  return d;
}

}  // namespace dcp::serve
