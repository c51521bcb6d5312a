// shared_regex: one compiled automaton per pattern for the whole process, the most recently asked
// kept within a memory bound.
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dcp/regex_dfa.h"

namespace dcp {
namespace regex_cache {  // named: a unity build shares one file's anonymous namespace

struct Cache {
  std::mutex mutex;
  // Most recent first; `at` finds a pattern's entry.
  std::list<std::pair<std::string, std::shared_ptr<const RegexDfa>>> recent;
  std::unordered_map<std::string, decltype(recent)::iterator> at;
  std::size_t bytes = 0;
};

Cache& cache() {
  static Cache c;
  return c;
}

}  // namespace regex_cache

std::shared_ptr<const RegexDfa> shared_regex(std::string_view pattern, std::string_view field) {
  regex_cache::Cache& c = regex_cache::cache();
  const std::string key(pattern);
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    const auto it = c.at.find(key);
    if (it != c.at.end()) {
      c.recent.splice(c.recent.begin(), c.recent, it->second);
      return it->second->second;
    }
  }
  // Compiled outside the lock: a large pattern takes milliseconds, and other patterns' requests
  // should not wait for it. Two threads compiling the same pattern at once keep the first.
  auto dfa = std::make_shared<const RegexDfa>(pattern, field);
  const std::lock_guard<std::mutex> lock(c.mutex);
  const auto it = c.at.find(key);
  if (it != c.at.end()) return it->second->second;
  c.recent.emplace_front(key, dfa);
  c.at.emplace(key, c.recent.begin());
  c.bytes += dfa->bytes() + key.size();
  while (c.recent.size() > 1 &&
         (c.bytes > kSharedRegexBytes || c.recent.size() > kSharedRegexCount)) {
    c.bytes -= c.recent.back().second->bytes() + c.recent.back().first.size();
    c.at.erase(c.recent.back().first);
    c.recent.pop_back();  // a request holding it keeps it alive
  }
  return dfa;
}

}  // namespace dcp
