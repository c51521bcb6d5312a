// The smallest deterministic automaton of a language (Hopcroft's partition refinement, in
// Valmari's form over the transitions that exist), for the
// regex compiler: subset construction yields one state per set of NFA states, and the copies a
// regex must spell out (`x(,x)*` writes x twice; a schema's nesting writes it 2^depth times) stay
// apart there though they accept the same continuations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace dcp {

// A transition table over byte classes: next[state * classes + class], kDead (-1) for no
// continuation; the start state is 0.
struct DfaTable {
  std::size_t classes = 1;
  std::vector<std::int32_t> next;
  std::vector<char> accepting;
  std::size_t states() const noexcept { return accepting.size(); }
};

// The automaton of the same language with the fewest states: states no match can follow from and
// states the start cannot reach are dropped (their transitions become kDead), equivalent states
// are merged. The start stays 0 and the others are numbered in breadth-first order from it. An
// automaton of the empty language comes back with no states.
DfaTable minimized(const DfaTable& dfa);

}  // namespace dcp
