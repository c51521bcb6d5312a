#include "dfa_minimize.h"

#include <algorithm>
#include <utility>

namespace dcp {
namespace dfa_minimize_detail {

constexpr std::int32_t kDead = -1;

// The states the start reaches that can also reach a match.
std::vector<char> useful_states(const DfaTable& dfa) {
  const std::size_t n = dfa.states(), k = dfa.classes;
  std::vector<char> reached(n, 0);
  std::vector<std::int32_t> todo{0};
  reached[0] = 1;
  while (!todo.empty()) {
    const auto s = static_cast<std::size_t>(todo.back());
    todo.pop_back();
    for (std::size_t c = 0; c < k; ++c) {
      const std::int32_t t = dfa.next[s * k + c];
      if (t != kDead && !reached[static_cast<std::size_t>(t)]) {
        reached[static_cast<std::size_t>(t)] = 1;
        todo.push_back(t);
      }
    }
  }
  // Backwards from the reached matches, over edges between reached states.
  std::vector<std::vector<std::int32_t>> into(n);
  for (std::size_t s = 0; s < n; ++s) {
    if (!reached[s]) continue;
    for (std::size_t c = 0; c < k; ++c) {
      const std::int32_t t = dfa.next[s * k + c];
      if (t != kDead) into[static_cast<std::size_t>(t)].push_back(static_cast<std::int32_t>(s));
    }
  }
  std::vector<char> useful(n, 0);
  for (std::size_t s = 0; s < n; ++s) {
    if (reached[s] && dfa.accepting[s]) {
      useful[s] = 1;
      todo.push_back(static_cast<std::int32_t>(s));
    }
  }
  while (!todo.empty()) {
    const auto t = static_cast<std::size_t>(todo.back());
    todo.pop_back();
    for (const std::int32_t s : into[t]) {
      if (!useful[static_cast<std::size_t>(s)]) {
        useful[static_cast<std::size_t>(s)] = 1;
        todo.push_back(s);
      }
    }
  }
  return useful;
}

// A partition of 0..n-1 into sets that splits by marks: each set's elements lie together in
// `elems`, [first, past); marking moves an element to the front of its set, and split() cuts
// every marked set in two, the smaller part becoming a new set at the end (so a pass that visits
// sets in order visits each element O(log n) times: Hopcroft's trick).
struct RefinablePartition {
  std::vector<std::int32_t> elems, where, set_of, first, past, marked, touched;

  explicit RefinablePartition(std::int32_t n) : elems(n), where(n), set_of(n, 0) {
    for (std::int32_t i = 0; i < n; ++i) elems[i] = where[i] = i;
    if (n > 0) add(0, n);
  }
  std::int32_t sets() const noexcept { return static_cast<std::int32_t>(first.size()); }
  void add(std::int32_t from, std::int32_t to) {
    first.push_back(from);
    past.push_back(to);
    marked.push_back(0);
  }
  void mark(std::int32_t e) {
    const std::int32_t s = set_of[e], i = where[e], j = first[s] + marked[s];
    if (i < j) return;  // marked already
    std::swap(elems[i], elems[j]);
    where[elems[i]] = i;
    where[elems[j]] = j;
    if (marked[s]++ == 0) touched.push_back(s);
  }
  void split() {
    for (const std::int32_t s : touched) {
      const std::int32_t cut = first[s] + marked[s];
      marked[s] = 0;
      if (cut == past[s]) continue;  // all of it marked
      const std::int32_t z = sets();
      if (cut - first[s] <= past[s] - cut) {  // the marked part is the smaller
        add(first[s], cut);
        first[s] = cut;
      } else {
        add(cut, past[s]);
        past[s] = cut;
      }
      for (std::int32_t i = first[z]; i < past[z]; ++i) set_of[elems[i]] = z;
    }
    touched.clear();
  }
};

}  // namespace dfa_minimize_detail

DfaTable minimized(const DfaTable& dfa) {
  using dfa_minimize_detail::kDead;
  const std::size_t k = dfa.classes;
  DfaTable out;
  out.classes = k;
  if (dfa.states() == 0) return out;
  const std::vector<char> useful = dfa_minimize_detail::useful_states(dfa);
  if (!useful[0]) return out;

  // The useful states numbered 0..n-1 (the start stays 0) and the transitions between them,
  // grouped by class; a missing transition stays missing (Valmari's form of Hopcroft's
  // algorithm refines a partial automaton in time O(transitions * log states)).
  std::vector<std::int32_t> index(dfa.states(), -1), old_of;
  std::int32_t n = 0;
  for (std::size_t s = 0; s < dfa.states(); ++s) {
    if (!useful[s]) continue;
    index[s] = n++;
    old_of.push_back(static_cast<std::int32_t>(s));
  }
  std::vector<std::int32_t> tail, head;
  std::vector<std::int32_t> class_first(k + 1, 0);
  for (std::size_t c = 0; c < k; ++c) {
    for (std::size_t s = 0; s < dfa.states(); ++s) {
      const std::int32_t t = dfa.next[s * k + c];
      if (!useful[s] || t == kDead || !useful[t]) continue;
      tail.push_back(index[s]);
      head.push_back(index[t]);
    }
    class_first[c + 1] = static_cast<std::int32_t>(tail.size());
  }
  const auto transitions = static_cast<std::int32_t>(tail.size());
  // The transitions into each state: into[into_first[s] ..].
  std::vector<std::int32_t> into_first(static_cast<std::size_t>(n) + 1, 0), into(tail.size());
  for (const std::int32_t h : head) ++into_first[h + 1];
  for (std::int32_t s = 0; s < n; ++s) into_first[s + 1] += into_first[s];
  {
    std::vector<std::int32_t> fill(into_first.begin(), into_first.end() - 1);
    for (std::int32_t t = 0; t < transitions; ++t) into[fill[head[t]]++] = t;
  }

  // States: matches apart from the rest. Transitions: one cord per class.
  dfa_minimize_detail::RefinablePartition states(n), cords(transitions);
  for (std::size_t s = 0; s < dfa.states(); ++s)
    if (useful[s] && dfa.accepting[s]) states.mark(index[s]);
  states.split();
  if (transitions > 0) {  // transitions are numbered class by class already
    cords.first.clear();
    cords.past.clear();
    cords.marked.clear();
    for (std::size_t c = 0; c < k; ++c) {
      if (class_first[c] == class_first[c + 1]) continue;
      for (std::int32_t t = class_first[c]; t < class_first[c + 1]; ++t)
        cords.set_of[t] = cords.sets();
      cords.add(class_first[c], class_first[c + 1]);
    }
  }
  // Split the states by each cord's tails, and the cords by each new block's incoming
  // transitions, until neither splits. Block 0 needs no pass: the cords already tell apart the
  // states that have a transition of a class, and among those, into block 0 is not into another.
  std::int32_t b = 1;
  for (std::int32_t c = 0; c < cords.sets(); ++c) {
    for (std::int32_t i = cords.first[c]; i < cords.past[c]; ++i) states.mark(tail[cords.elems[i]]);
    states.split();
    for (; b < states.sets(); ++b) {
      for (std::int32_t i = states.first[b]; i < states.past[b]; ++i) {
        const std::int32_t s = states.elems[i];
        for (std::int32_t j = into_first[s]; j < into_first[s + 1]; ++j) cords.mark(into[j]);
      }
      cords.split();
    }
  }

  // One state per block, numbered breadth-first from the start's; a block's transitions are
  // those of any of its states.
  std::vector<std::int32_t> id(static_cast<std::size_t>(states.sets()), -1);
  std::vector<std::int32_t> order{states.set_of[0]};
  id[states.set_of[0]] = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto rep = static_cast<std::size_t>(old_of[states.elems[states.first[order[i]]]]);
    out.accepting.push_back(dfa.accepting[rep]);
    for (std::size_t c = 0; c < k; ++c) {
      const std::int32_t t = dfa.next[rep * k + c];
      if (t == kDead || !useful[t]) {
        out.next.push_back(kDead);
        continue;
      }
      const std::int32_t to = states.set_of[index[t]];
      if (id[to] < 0) {
        id[to] = static_cast<std::int32_t>(order.size());
        order.push_back(to);
      }
      out.next.push_back(id[to]);
    }
  }
  return out;
}

}  // namespace dcp
