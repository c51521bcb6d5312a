// Value checks for the command line, run by CLI11 while it parses: a bad value stops the command
// before it prints or allocates anything, and the error names the flag (CLI11 puts it in front:
// "--repeats: 0 must be >= 1") and the legal values.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "dcp/dtype.h"
#include "dcp/error.h"
#include "dcp/kernel_path.h"
#include "dcp/model_config.h"
#include "dcp/tokenizer.h"

namespace dcp::cli {

// A comma-separated list of integers >= 0; dcp::Error naming `flag` otherwise.
std::vector<std::int64_t> parse_list(const std::string& text, const char* flag);
// The comma-separated items of `text`, empty ones included ("1,,2" and "1," have one).
std::vector<std::string> comma_items(const std::string& text);

CLI::Validator at_least(long long min);       // an integer >= min
CLI::Validator positive();                    // a real number > 0
CLI::Validator non_negative();                // a real number >= 0
CLI::Validator list_at_least(long long min);  // comma-separated integers, each >= min
CLI::Validator one_of(std::vector<std::string> legal);
CLI::Validator list_of(std::vector<std::string> legal);  // comma-separated, each one of `legal`
// Runs f(); a dcp::Error it throws comes back with "<flag>: " in front, same category: for
// library calls that take a path or value straight from one flag.
template <typename F>
auto with_flag(const char* flag, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    throw Error(e.category(), str(flag, ": ", e.what()));
  }
}

// `flag` (a TP or DCP size) must divide the model's attention heads; dcp::Error otherwise.
void check_divides_heads(const ModelConfig& model, int size, const char* flag);

// --weight-kernel: automatic, portable, avx2, avx512 or avx512_bf16, a path this CPU runs;
// dcp::Error naming the flag and the legal paths otherwise (amx_bf16 is the attention kernel's
// only). The flag's help, for every command that has it:
KernelPath parse_weight_kernel(const std::string& name);
inline constexpr const char* kWeightKernelHelp =
    "the weight products' path: automatic (the widest this CPU runs), portable, avx2, avx512, or "
    "avx512_bf16 (opt-in: bf16 and FP8 weights in vdpbf16ps pairs with x rounded to bf16; fp32 "
    "ones as avx512)";

// --attention-kernel: a path this CPU runs, checked before any rank starts; the bf16-pair paths
// (amx_bf16, avx512_bf16) need bf16 KV. dcp::Error naming the flag otherwise. Its help:
KernelPath parse_attention_kernel(const std::string& name, KvDtype kv_dtype);
inline constexpr const char* kAttentionKernelHelp =
    "local attention kernel: automatic (fastest exact path), portable, avx2, avx512, or a "
    "bf16-pair path, amx_bf16 or avx512_bf16 (bf16 KV; rounds q and P to bf16)";

// --chat-template FILE: the Jinja template in `path` becomes `tokenizer`'s chat template. Throws
// dcp::Error naming the flag when the file cannot be read or the template does not parse (the
// parser's error names the line), before anything renders it.
void use_chat_template_file(Tokenizer& tokenizer, const std::string& path);
inline constexpr const char* kChatTemplateHelp =
    "a file with a Jinja chat template, used instead of tokenizer_config.json's chat_template";

// This machine's physical memory in bytes.
double physical_memory_bytes();
// The memory this process may still take: MemAvailable, or less under a cgroup limit.
double available_memory_bytes();
// Throws dcp::Error (capacity) when `bytes` exceed the available memory: "<what> needs about X
// GiB, more than the Y GiB of memory available (of Z GiB); <fix>". For requests that would
// otherwise run for minutes and then die to the out-of-memory killer.
void check_fits_in_memory(double bytes, const std::string& what, const std::string& fix);

// Every option of `app` and its subcommands that takes a value refuses an empty one ("--json ''"
// would otherwise read as "not given" and run something else than asked).
void refuse_empty_values(CLI::App& app);

// A file the command will write: its directory must exist and be writable, so that a long
// benchmark does not run only to fail at the end.
CLI::Validator writable_file();

}  // namespace dcp::cli
