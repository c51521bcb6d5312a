#!/usr/bin/env bash
# Every MLA family as published under mpirun: a generated checkpoint (FP8 with scales, or INT4
# experts, where the family ships them) runs one rank per process at TP 4 x DCP 4 and verifies
# against DCP 1; the DeepSeek-V3 family also with DP attention and EP 8 at TP 8 (DP 2 and 4, DCP 2), and with EP 4
# alone at TP 4, against DP 1 / DCP 1 / EP 1.
# Usage: test_families_mpi.sh MPIEXEC path/to/dcp
set -eu
mpiexec="$1"
dcp="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
for family in deepseek-v2-lite deepseek-v2 deepseek-v3 kimi-k2 kimi-k2-thinking moonlight; do
  "$dcp" gen-checkpoint --family "$family" --out "$tmp/$family" >/dev/null
  "$mpiexec" -np 4 "$dcp" run --comm mpi --model-path "$tmp/$family" --tp-size 4 --dcp-size 4 \
    --batch 3 --prompt-len 40 --max-new-tokens 4 --json "$tmp/run.json" >"$tmp/out" 2>"$tmp/err" || {
    echo "FAIL: $family: mpirun failed"; cat "$tmp/out" "$tmp/err"; exit 1; }
  grep -q '"passed": true' "$tmp/run.json" || { echo "FAIL: $family did not verify"; cat "$tmp/out"; exit 1; }
  [ "$(grep -c '^dcp run:' "$tmp/out")" -eq 1 ] || { echo "FAIL: $family: not one summary"; exit 1; }
  passed=$((passed + 1))
done
# The MoE FP8 family with DP attention and expert parallelism: two or four attention groups of
# DCP 2 over TP 8, the experts partitioned over all 8 ranks.
for dp in 2 4; do
  "$mpiexec" -np 8 "$dcp" run --comm mpi --model-path "$tmp/deepseek-v3" --tp-size 8 --dp-size "$dp" \
    --enable-dp-attention --dcp-size 2 --ep-size 8 --batch 5 --prompt-len 40 --max-new-tokens 4 \
    --json "$tmp/run.json" >"$tmp/out" 2>"$tmp/err" || {
    echo "FAIL: deepseek-v3 DP attention $dp: mpirun failed"; cat "$tmp/out" "$tmp/err"; exit 1; }
  grep -q '"passed": true' "$tmp/run.json" || { echo "FAIL: DP attention $dp did not verify"; cat "$tmp/out"; exit 1; }
  grep -q '"tokens_match": true' "$tmp/run.json" || { echo "FAIL: DP attention $dp: tokens differ"; cat "$tmp/out"; exit 1; }
  grep -q '"ep_size": 8' "$tmp/run.json" || { echo "FAIL: DP attention $dp: ep_size not reported"; exit 1; }
  [ "$(grep -c '^  dp group' "$tmp/out")" -eq "$dp" ] || { echo "FAIL: expected $dp dp groups"; cat "$tmp/out"; exit 1; }
  passed=$((passed + 1))
done
# Expert parallelism without DP attention: the experts partitioned over the 4 ranks of TP 4.
"$mpiexec" -np 4 "$dcp" run --comm mpi --model-path "$tmp/deepseek-v3" --tp-size 4 --dcp-size 2 \
  --ep-size 4 --batch 3 --prompt-len 40 --max-new-tokens 4 --json "$tmp/run.json" >"$tmp/out" 2>"$tmp/err" || {
  echo "FAIL: deepseek-v3 EP 4: mpirun failed"; cat "$tmp/out" "$tmp/err"; exit 1; }
grep -q '"passed": true' "$tmp/run.json" || { echo "FAIL: EP 4 did not verify"; cat "$tmp/out"; exit 1; }
grep -q '"ep_size": 4' "$tmp/run.json" || { echo "FAIL: EP 4: ep_size not reported"; exit 1; }
passed=$((passed + 1))
echo "$passed passed, 0 failed"
