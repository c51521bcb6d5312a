#!/usr/bin/env bash
# Builds the libFuzzer targets (the `fuzz` preset: clang, ASan, UBSan) and runs each for a bounded
# time from its committed seed corpus (fuzz/corpus/<target>). New inputs go to a scratch folder,
# not the committed corpus. A crash fails the run and leaves its input in that folder: add it to
# fuzz/corpus/<target> with the fix.
# An input that runs past 60 s is a failure too (a hang, not slowness).
# Usage: scripts/fuzz.sh [seconds per target, default 60] [target ...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_safetensors fuzz_torch_checkpoint fuzz_checkpoint_index fuzz_model_config fuzz_prompt_tokens
                                      fuzz_tokenizer_json fuzz_sentencepiece_model fuzz_tokenize fuzz_chat_template fuzz_tiktoken
                                      fuzz_openai_request fuzz_http_connection fuzz_regex fuzz_grammar fuzz_json_schema
                                      fuzz_tool_calls)

scripts/setup.sh fuzz  # clang and its libFuzzer runtime, then the build

scratch=$(mktemp -d)
# One target per core at a time: each gets its full time, the run takes 1/nproc of it.
run_one() {
  local t="$1"
  mkdir -p "$scratch/$t"
  local rc=0
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "build/fuzz/fuzz/$t" -max_total_time="$seconds" -timeout=60 -rss_limit_mb=4096 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="$scratch/$t/" "$scratch/$t" "fuzz/corpus/$t" \
    >"$scratch/$t.log" 2>&1 || rc=$?
  echo "$rc" >"$scratch/$t.rc"
}
for t in "${targets[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "$(nproc)" ]; do wait -n || true; done
  echo "fuzz: $t for ${seconds}s"
  run_one "$t" &
done
wait
failed=0
for t in "${targets[@]}"; do
  if [ "$(cat "$scratch/$t.rc")" != 0 ]; then
    failed=1
    echo "fuzz: $t FAILED; its input: $(ls "$scratch/$t"/crash-* "$scratch/$t"/leak-* "$scratch/$t"/timeout-* "$scratch/$t"/oom-* 2>/dev/null | head -1)"
    tail -40 "$scratch/$t.log"
    continue
  fi
  echo "fuzz: $t passed"
  grep -E "stat::number_of_executed_units|stat::new_units_added|cov:" "$scratch/$t.log" | tail -3
done
[ "$failed" -eq 0 ] && rm -rf "$scratch"
exit "$failed"
