// Tool calls as MLA chat models write them: the text a reply holds between the model's own
// markers, read back into calls (a function's name and its JSON arguments) and the content around
// them. DeepSeek (V3 writes "function<sep>NAME" and fenced JSON, V3.1 "NAME<sep>JSON"), Kimi K2
// ("functions.NAME:INDEX" as the call's id) and MiniCPM3 (Python calls `name(key=value)`, fenced
// as ```python, between <|tool_call_start|> and <|tool_call_end|>; their arguments as Python's
// json.dumps writes the values) are read; the markers are special tokens, so the text must be
// decoded with special tokens kept.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dcp/tokenizer.h"

namespace dcp {

enum class ToolCallFormat { deepseek_v3, kimi_k2, minicpm3 };

// "deepseek_v3", "kimi_k2" (vLLM's --tool-call-parser names) or "minicpm3"; nullopt for any
// other name.
std::optional<ToolCallFormat> tool_call_format_named(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);
// The format whose markers `tokenizer` holds as single tokens; nullopt when it holds neither's.
std::optional<ToolCallFormat> tool_call_format_of(const Tokenizer& tokenizer);

// The marker that opens a reply's tool calls: text from it on is not content.
std::string_view tool_calls_begin(ToolCallFormat format);

struct ToolCall {
  std::string id;         // the model's id (Kimi K2); empty where the format has none
  std::string name;       // the function
  // JSON text, as the model wrote it (surrounding whitespace dropped); MiniCPM3's: its Python
  // values as JSON
  std::string arguments;
};

struct ParsedToolCalls {
  std::string content;          // the text outside the calls
  std::vector<ToolCall> calls;  // in the order written
};

// Reads a reply's calls as its text grows, each call once its end marker is read, so that a stream
// sends calls as they are written. The calls read stay calls: the first stretch that does not read
// as one (a spoiled call, text between calls, a call cut short at the end) ends them, and the text
// from there on is content, as is the text after the calls' closing marker. Where no call is read
// at all, the text from the opening marker on is content: nothing the model wrote is lost.
class ToolCallReader {
 public:
  static constexpr std::size_t npos = std::string_view::npos;

  explicit ToolCallReader(ToolCallFormat format) : format_(format) {}
  // Reads on into `text`: the whole reply so far, which extends the text of the last call.
  void read(std::string_view text);
  // Where the calls' opening marker starts (the content before it ends), npos while none is read.
  std::size_t calls_begin() const noexcept { return begin_; }
  const std::vector<ToolCall>& calls() const noexcept { return calls_; }
  // Where the content goes on after the calls, to the end of the text; npos while calls may still
  // follow. `finished`: the text is whole, so a call still open was cut short.
  std::size_t content_resumes(bool finished) const noexcept;

 private:
  enum class State { before, calls, closed, spoiled };
  ToolCallFormat format_;
  State state_ = State::before;
  std::size_t begin_ = npos;
  std::size_t at_ = 0;  // where reading goes on: the marker's search, or past the last call read
  std::vector<ToolCall> calls_;
};

// Reads `text` (a whole reply, special tokens kept) as ToolCallReader does. A reply without the
// opening marker is all content.
ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format);

// Reads the list of calls a reply guided by tool_choice "required" writes (vLLM's form):
// `[{"name": NAME, "parameters": OBJECT}, ...]`, one call or more, surrounded by whitespace or
// not. Each call's arguments are its parameters as Python's json.dumps separates them (", " and
// ": ", no other whitespace between tokens), every string and number spelt as the model wrote it:
// read into doubles, an integer of 30 digits would come back rounded and 1e400 would not be read
// at all. nullopt when the text is not such a list of valid JSON (RFC 8259).
std::optional<std::vector<ToolCall>> read_listed_calls(std::string_view text);

// Reads such a list as its text grows, each call once its object closes (a stream's deltas).
// Where the text is not a whole list (cut short, an item that is not a call, text after it), the
// calls read stay calls and the text after the last of them is content (all of it where none was
// read); read_listed_calls reads only whole lists.
class ListedCallReader {
 public:
  static constexpr std::size_t npos = std::string_view::npos;

  // Reads on into `text`: the whole reply so far, which extends the text of the last call.
  void read(std::string_view text);
  const std::vector<ToolCall>& calls() const noexcept { return calls_; }
  // Where the content starts, to the end of the text; npos while the list may go on, and where it
  // is whole. `finished`: the text is whole, so a list still open was cut short.
  std::size_t content_resumes(bool finished) const noexcept;
  // The text so far is a whole list (only blank space after its ']').
  bool whole() const noexcept { return state_ == State::closed && !calls_.empty(); }

 private:
  enum class State { before, item, after_item, closed, spoiled };
  State state_ = State::before;
  std::size_t at_ = 0;    // where reading goes on
  std::size_t last_ = 0;  // past the last call read
  std::vector<ToolCall> calls_;
};

// The JSON value at the start of `text` (after whitespace) respelt as read_listed_calls writes
// arguments, and the index just past it; nullopt when no valid JSON value starts there.
struct RespeltJson {
  std::string text;
  std::size_t end = 0;
};
std::optional<RespeltJson> respelt_json(std::string_view text);

}  // namespace dcp
