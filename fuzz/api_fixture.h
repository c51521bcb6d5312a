// The HTTP API the fuzz targets drive: a small byte-level tokenizer and a tiny deployment that is
// built but not running, so a request that parses is refused at submission ("still loading").
#pragma once

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "dcp/serving.h"
#include "dcp/text_stream.h"
#include "dcp/tokenizer.h"
#include "serve/openai_api.h"

struct ApiFixture {
  ApiFixture() {
    const std::filesystem::path dir =
        std::filesystem::temp_directory_path() / ("dcp_fuzz_tok_" + std::to_string(getpid()));
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
                dcp::serve::ApiOptions{"tiny",
                                       16,
                                       dcp::ToolCallFormat::deepseek_v3,
                                       dcp::serve::ReasoningParser::deepseek_v3,
                                       {},
                                       {},
                                       {},
                                       {}});
  }
  std::optional<dcp::Tokenizer> tokenizer;
  std::optional<dcp::ServingDeployment> deployment;
  std::optional<dcp::serve::OpenAiApi> api;
};
