// A deterministic generator (xorshift) for the reference tests' corpora, so a corpus is the same
// on every run.
export function generator(seed) {
  let state = seed >>> 0;
  const rand = (n) => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state % n;
  };
  return { rand, pick: (list) => list[rand(list.length)] };
}
