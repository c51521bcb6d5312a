// `dcp tokenize`: a tokenizer checked by hand. Text on stdin -> its token ids as a JSON array;
// --decode: a JSON array of ids on stdin -> the text; --chat: JSON messages on stdin -> the
// prompt the chat template renders (--print-prompt) or its ids; --jsonl: many texts (id lists,
// conversations) in one run, one JSON value a line each way.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/cli_checks.h"
#include "cli/commands.h"
#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/tokenizer.h"

namespace dcp::cli {
namespace {

// The ids of a JSON array; `where` names the input in errors.
std::vector<std::int32_t> token_ids(const nlohmann::json& ids, const Tokenizer& tok,
                                    const std::string& where) {
  DCP_ARG_CHECK(ids.is_array(), where, " must be a JSON array of token ids");
  std::vector<std::int32_t> list;
  for (const auto& id : ids) {
    DCP_ARG_CHECK(id.is_number_integer() && id.get<std::int64_t>() >= 0 &&
                      id.get<std::int64_t>() < tok.vocab_size(),
                  where, ": ", id.dump(), " is not a token id in [0, ", tok.vocab_size(), ")");
    list.push_back(id.get<std::int32_t>());
  }
  return list;
}

// The prompt the chat template renders over `context_json`; errors name `where`.
std::string render_chat(const Tokenizer& tok, const std::string& context_json,
                        bool generation_prompt, const std::string& where) {
  return with_flag(where.c_str(),
                   [&] { return apply_chat_template(tok, context_json, generation_prompt); });
}

// A text as one line of JSON (a string); invalid UTF-8 as U+FFFD, so a dump never throws.
std::string json_line(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

struct LineModes {
  bool decode = false, add_special = false, skip_special = false;
  bool chat = false, print_prompt = false, generation_prompt = false;
};

// --jsonl: each line of stdin a JSON string (--decode: a JSON array of ids; --chat: a
// conversation), each answered by one line: a JSON array of ids (--decode: the text as a JSON
// string; --chat --print-prompt: the rendered prompt as a JSON string).
void tokenize_lines(const Tokenizer& tok, const LineModes& m) {
  std::string line;
  for (std::int64_t n = 1; std::getline(std::cin, line); ++n) {
    const std::string where = str("--jsonl: stdin line ", n);
    nlohmann::json value;
    try {
      value = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::invalid_argument, str(where, " is not JSON: ", e.what()));
    }
    if (m.decode) {
      const std::string text = tok.decode(token_ids(value, tok, where), m.skip_special);
      std::printf("%s\n", json_line(text).c_str());
    } else if (m.chat) {
      const std::string prompt = render_chat(tok, line, m.generation_prompt, where);
      std::printf("%s\n", m.print_prompt ? json_line(prompt).c_str()
                                         : nlohmann::json(tok.encode(prompt)).dump().c_str());
    } else {
      DCP_ARG_CHECK(value.is_string(), where, " must be a JSON string");
      std::printf(
          "%s\n",
          nlohmann::json(tok.encode(value.get<std::string>(), m.add_special)).dump().c_str());
    }
  }
}

}  // namespace

void add_tokenize_command(CLI::App& app) {
  struct Options {
    std::string tokenizer_path, chat_template;
    bool decode = false, add_special = false, skip_special = false;
    bool chat = false, print_prompt = false, generation_prompt = false, jsonl = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Text on stdin -> token ids (JSON array); --decode: ids on stdin -> text");
  cmd->add_option(
         "--tokenizer-path", o->tokenizer_path,
         "folder with tokenizer.json, Kimi's tiktoken.model or SentencePiece's tokenizer.model "
         "(and tokenizer_config.json; "
         "chat_template.jinja, when there, is the chat template)")
      ->required();
  CLI::Option* decode =
      cmd->add_flag("--decode", o->decode, "read a JSON array of ids, print the text");
  cmd->add_flag("--add-special-tokens", o->add_special,
                "add BOS (and EOS) as tokenizer_config.json's add_bos_token (add_eos_token) say, "
                "else as tokenizer.json's post_processor adds them")
      ->excludes(decode);
  cmd->add_flag("--skip-special-tokens", o->skip_special, "leave special tokens out of the text")
      ->needs(decode);
  CLI::Option* chat = cmd->add_flag(
      "--chat", o->chat,
      "stdin is a JSON list of messages (or an object of template variables with 'messages'): "
      "render the tokenizer's chat template, then tokenize")
                          ->excludes(decode);
  cmd->add_option("--chat-template", o->chat_template, kChatTemplateHelp)
      ->needs(chat)
      ->type_name("FILE");
  cmd->add_flag("--add-generation-prompt", o->generation_prompt,
                "end the rendered prompt with the assistant's turn")
      ->needs(chat);
  cmd->add_flag("--print-prompt", o->print_prompt,
                "print the rendered prompt, not its ids (with --jsonl: as a JSON string)")
      ->needs(chat);
  cmd->add_flag("--jsonl", o->jsonl,
                "many inputs in one run: each line of stdin a JSON string (--decode: a JSON array "
                "of ids; --chat: a conversation), each printed as one line, its ids (--decode: "
                "its text as a JSON string)");
  cmd->callback([o] {
    Tokenizer tok =
        with_flag("--tokenizer-path", [&] { return Tokenizer::from_dir(o->tokenizer_path); });
    if (!o->chat_template.empty()) use_chat_template_file(tok, o->chat_template);
    if (o->jsonl) {
      tokenize_lines(tok, {o->decode, o->add_special, o->skip_special, o->chat, o->print_prompt,
                           o->generation_prompt});
      return;
    }
    const std::string input((std::istreambuf_iterator<char>(std::cin)),
                            std::istreambuf_iterator<char>());
    if (o->chat) {
      const std::string prompt = render_chat(tok, input, o->generation_prompt, "--chat");
      if (o->print_prompt) {
        std::fwrite(prompt.data(), 1, prompt.size(), stdout);
      } else {
        std::printf("%s\n", nlohmann::json(tok.encode(prompt)).dump().c_str());
      }
      return;
    }
    if (!o->decode) {
      const nlohmann::json ids = tok.encode(input, o->add_special);
      std::printf("%s\n", ids.dump().c_str());
      return;
    }
    nlohmann::json ids;
    try {
      ids = nlohmann::json::parse(input);
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCategory::invalid_argument,
                  str("--decode: stdin is not a JSON array of token ids: ", e.what()));
    }
    const std::string text = tok.decode(token_ids(ids, tok, "--decode: stdin"), o->skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);
  });
}

}  // namespace dcp::cli
