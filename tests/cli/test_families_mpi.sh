#!/usr/bin/env bash
# Every MLA family as published under mpirun: a generated checkpoint (FP8 with scales where the
# family ships FP8) runs one rank per process at TP 4 x DCP 4 and verifies against DCP 1.
# Usage: test_families_mpi.sh MPIEXEC path/to/dcp
set -eu
mpiexec="$1"
dcp="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
for family in deepseek-v2-lite deepseek-v2 deepseek-v3 kimi-k2 moonlight; do
  "$dcp" gen-checkpoint --family "$family" --out "$tmp/$family" >/dev/null
  "$mpiexec" -np 4 "$dcp" run --comm mpi --model-path "$tmp/$family" --tp-size 4 --dcp-size 4 \
    --batch 3 --prompt-len 40 --max-new-tokens 4 --json "$tmp/run.json" >"$tmp/out" 2>"$tmp/err" || {
    echo "FAIL: $family: mpirun failed"; cat "$tmp/out" "$tmp/err"; exit 1; }
  grep -q '"passed": true' "$tmp/run.json" || { echo "FAIL: $family did not verify"; cat "$tmp/out"; exit 1; }
  [ "$(grep -c '^dcp run:' "$tmp/out")" -eq 1 ] || { echo "FAIL: $family: not one summary"; exit 1; }
  passed=$((passed + 1))
done
echo "$passed passed, 0 failed"
