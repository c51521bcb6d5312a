#include "cli_checks.h"

#include <fcntl.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dcp/chat_template.h"
#include "dcp/error.h"
#include "dcp/weights.h"

namespace dcp::cli {
namespace {

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s;
}

// The whole text as an integer, or false (CLI11's own conversion runs after the validators).
bool whole_integer(const std::string& text, long long& value) {
  std::size_t used = 0;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  return used == text.size();
}

std::string integer_at_least(const std::string& text, long long min) {
  long long v = 0;
  if (!whole_integer(text, v)) return "'" + text + "' is not an integer";
  if (v < min) return text + " must be >= " + std::to_string(min);
  return {};
}

std::string real_above(const std::string& text, bool allow_zero) {
  std::size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v))
    return "'" + text + "' is not a number";
  if (allow_zero ? v < 0 : v <= 0) return text + (allow_zero ? " must be >= 0" : " must be > 0");
  return {};
}

// "" when `item` is one of `legal`, else the error.
std::string membership(const std::string& item, const std::vector<std::string>& legal) {
  for (const auto& l : legal) {
    if (item == l) return {};
  }
  return "'" + item + "' is not one of: " + joined(legal);
}

// The first error `check` finds among a comma-separated list's items ("" if none).
template <typename Check>
std::string first_error(const std::string& text, Check check) {
  const auto list = comma_items(text);
  if (list.empty()) return "the list is empty";
  for (const auto& item : list) {
    if (item.empty()) return "an empty item in '" + text + "'";
    std::string err = check(item);
    if (!err.empty()) return err;
  }
  return {};
}

std::string format_gib(double gib) {
  char buf[32];
  std::snprintf(buf, sizeof buf, gib < 10 ? "%.1f" : "%.0f", gib);
  return buf;
}

}  // namespace

std::vector<std::string> comma_items(const std::string& text) {
  std::vector<std::string> out;
  if (text.empty()) return out;
  std::size_t at = 0;
  while (true) {
    const std::size_t comma = text.find(',', at);
    out.push_back(text.substr(at, comma == std::string::npos ? std::string::npos : comma - at));
    if (comma == std::string::npos) return out;
    at = comma + 1;
  }
}

std::vector<std::int64_t> parse_list(const std::string& text, const char* flag) {
  std::vector<std::int64_t> v;
  for (const auto& item : comma_items(text)) {
    DCP_ARG_CHECK(!item.empty(), flag, ": an empty item in '", text, "'");
    long long x = 0;
    DCP_ARG_CHECK(whole_integer(item, x), flag, ": '", item, "' is not an integer");
    DCP_ARG_CHECK(x >= 0, flag, ": ", x, " must be >= 0");
    v.push_back(x);
  }
  DCP_ARG_CHECK(!v.empty(), flag, " is empty");
  return v;
}

void use_chat_template_file(Tokenizer& tokenizer, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  DCP_ARG_CHECK(in && std::filesystem::is_regular_file(path), "--chat-template: cannot read '",
                path, "'");
  std::string jinja((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  with_flag("--chat-template", [&] { ChatTemplate parsed(jinja); });
  tokenizer.set_chat_template(std::move(jinja));
}

void check_divides_heads(const ModelConfig& model, int size, const char* flag) {
  DCP_ARG_CHECK(size >= 1 && model.num_attention_heads % size == 0, flag, " ", size,
                " must divide the model's ", model.num_attention_heads, " attention heads");
}

KernelPath parse_weight_kernel(const std::string& name) {
  KernelPath k = KernelPath::automatic;
  try {
    k = parse_kernel_path(name);
  } catch (const Error&) {  // its list names the attention-only paths too
    throw Error(ErrorCategory::invalid_argument,
                str("--weight-kernel ", name,
                    ": not one of: automatic, portable, avx2, avx512, avx512_bf16"));
  }
  try {
    weight_kernel_label(k);  // refuses amx_bf16 and a path this CPU lacks
  } catch (const Error& e) {
    throw Error(e.category(), str("--weight-kernel ", name, ": ", e.what()));
  }
  return k;
}

KernelPath parse_attention_kernel(const std::string& name, KvDtype kv_dtype) {
  KernelPath k = KernelPath::automatic;
  try {
    k = parse_kernel_path(name);
    if (is_bf16_pair_path(k)) {
      require_bf16_pair_path(k);
      DCP_ARG_CHECK(kv_dtype == KvDtype::bf16, to_string(k), " needs --kv-cache-dtype bf16");
    } else {
      resolve_exact_path(k);
    }
  } catch (const Error& e) {
    throw Error(e.category(), str("--attention-kernel ", name, ": ", e.what()));
  }
  return k;
}

double physical_memory_bytes() {
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

double available_memory_bytes() {
  double available = -1;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      available = kib * 1024.0;
      break;
    }
  }
  if (available < 0) {
    available = static_cast<double>(sysconf(_SC_AVPHYS_PAGES)) *
                static_cast<double>(sysconf(_SC_PAGE_SIZE));
  }
  // A container's cgroup (v2) limit, less what the group already uses, may be lower.
  std::ifstream max_file("/sys/fs/cgroup/memory.max"),
      current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  double current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    try {
      available = std::min(available, std::max(0.0, std::stod(max_text) - current));
    } catch (const std::exception&) {
    }
  }
  return available;
}

void check_fits_in_memory(double bytes, const std::string& what, const std::string& fix) {
  const double have = available_memory_bytes(), gib = 1024.0 * 1024.0 * 1024.0;
  DCP_CHECK(bytes <= have, capacity, what, " needs about ", format_gib(bytes / gib),
            " GiB, more than the ", format_gib(have / gib), " GiB of memory available (of ",
            format_gib(physical_memory_bytes() / gib), " GiB); ", fix);
}

CLI::Validator at_least(long long min) {
  return CLI::Validator([min](std::string& s) { return integer_at_least(s, min); },
                        "(>= " + std::to_string(min) + ")");
}

CLI::Validator positive() {
  return CLI::Validator([](std::string& s) { return real_above(s, false); }, "(> 0)");
}

CLI::Validator non_negative() {
  return CLI::Validator([](std::string& s) { return real_above(s, true); }, "(>= 0)");
}

CLI::Validator list_at_least(long long min) {
  return CLI::Validator(
      [min](std::string& s) {
        return first_error(s, [min](const std::string& x) { return integer_at_least(x, min); });
      },
      "(each >= " + std::to_string(min) + ")");
}

CLI::Validator one_of(std::vector<std::string> legal) {
  const std::string desc = "{" + joined(legal) + "}";
  return CLI::Validator([legal](std::string& s) { return membership(s, legal); }, desc);
}

CLI::Validator list_of(std::vector<std::string> legal) {
  const std::string desc = "{" + joined(legal) + "}, comma-separated";
  return CLI::Validator(
      [legal](std::string& s) {
        return first_error(s, [&legal](const std::string& x) { return membership(x, legal); });
      },
      desc);
}

CLI::Validator writable_file() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        namespace fs = std::filesystem;
        std::error_code ec;
        if (fs::is_directory(s, ec)) return "'" + s + "' is a directory, not a file";
        const fs::path dir = fs::path(s).has_parent_path() ? fs::path(s).parent_path() : ".";
        if (!fs::is_directory(dir, ec))
          return "cannot write '" + s + "': no directory " + dir.string();
        if (access(dir.c_str(), W_OK) != 0) {
          return "cannot write '" + s + "': directory " + dir.string() + " is not writable";
        }
        if (!fs::exists(s, ec)) return {};
        // An existing file is opened now (not truncated), so that one the kernel refuses
        // (/proc/...) fails before the run rather than after it. A device is written one
        // newline, so that one that fails every write (/dev/full) does too.
        struct statfs where {};
        constexpr long kProcfs = 0x9fa0, kSysfs = 0x62656572;  // linux/magic.h
        if (::statfs(s.c_str(), &where) == 0 && (where.f_type == kProcfs || where.f_type == kSysfs))
          return "cannot write '" + s + "': a kernel interface file, not an output file";
        const int fd = ::open(s.c_str(), O_WRONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) return "cannot write '" + s + "': " + std::strerror(errno);
        std::string err;
        if (fs::is_character_file(s, ec) && ::write(fd, "\n", 1) != 1)
          err = "cannot write '" + s + "': " + std::strerror(errno);
        ::close(fd);
        return err;
      },
      "FILE");
}

void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& value) {
        return value.empty() ? std::string("an empty value is not allowed") : std::string();
      },
      "");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size_max() > 0) opt->check(non_empty);
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    refuse_empty_values(*sub);
}

}  // namespace dcp::cli
