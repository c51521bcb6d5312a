// The HTTP API's request bodies (outside input from the network): the first byte picks the
// endpoint (completions, chat, /generate, /tokenize, /detokenize), the rest is the body. Every body
// gets a reply, an error or a refusal, never a crash. The deployment is built but not running, so a
// body that parses is refused at submission ("still loading").
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

#include "dcp/serving.h"
#include "dcp/text_stream.h"
#include "dcp/tokenizer.h"
#include "serve/openai_api.h"

namespace {

struct Fixture {
  Fixture() {
    dir = std::filesystem::temp_directory_path() / ("dcp_fuzz_tok_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir);
    dcp::write_small_tokenizer(dir.string(), 512);
    tokenizer.emplace(dcp::Tokenizer::from_dir(dir.string()));
    std::filesystem::remove_all(dir);
    dcp::DeploymentSpec spec;
    spec.model.config = dcp::preset_config("tiny", 1);
    // Guided regexes compile and are checked against the vocabulary at parse time; tool_choice
    // "auto" reads DeepSeek's format.
    spec.engine.guide_vocabulary = dcp::guide_vocabulary(*tokenizer, spec.model.config.vocab_size);
    deployment.emplace(spec);
    api.emplace(*deployment, &*tokenizer,
                dcp::serve::ApiOptions{"tiny", 16, dcp::ToolCallFormat::deepseek_v3,
                                       dcp::serve::ReasoningParser::deepseek_v3});
  }
  std::filesystem::path dir;
  std::optional<dcp::Tokenizer> tokenizer;
  std::optional<dcp::ServingDeployment> deployment;
  std::optional<dcp::serve::OpenAiApi> api;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture f;
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  dcp::serve::Handled h;
  switch (data[0] % 5) {
    case 0: h = f.api->completions(body); break;
    case 1: h = f.api->chat_completions(body); break;
    case 2: h = f.api->generate(body); break;
    case 3: h.reply = f.api->tokenize(body); break;
    default: h.reply = f.api->detokenize(body); break;
  }
  // Nothing runs, so nothing may come back as a stream.
  if (!h.reply) __builtin_trap();
  return 0;
}
