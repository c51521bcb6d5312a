#!/usr/bin/env bash
# `dcp run --comm mpi` under mpirun: one rank per process, rank 0 prints and writes the JSON,
# --verify (on by default) must pass. Usage: test_run_mpi.sh MPIEXEC NP path/to/dcp [run flags]
# Without run flags the job is TP = DCP = NP.
set -eu
mpiexec="$1"
np="$2"
dcp="$3"
shift 3
if [ $# -eq 0 ]; then
  set -- --tp-size "$np" --dcp-size "$np"
  expect_dcp="$np"
else
  expect_dcp=""
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpiexec" -np "$np" "$dcp" run --comm mpi "$@" --batch 3 --prompt-len 170 \
  --max-new-tokens 4 --chunked-prefill-size 50 --json "$tmp/run.json" >"$tmp/out" 2>"$tmp/err" || {
  echo "mpirun failed"; cat "$tmp/out" "$tmp/err"; exit 1; }
grep -q '"tokens_match": true' "$tmp/run.json" || { echo "verification did not match"; cat "$tmp/out"; exit 1; }
grep -q '"passed": true' "$tmp/run.json" || { echo "verification did not pass"; cat "$tmp/out"; exit 1; }
[ -z "$expect_dcp" ] || grep -q "\"dcp_size\": $expect_dcp" "$tmp/run.json" || { echo "wrong dcp size"; exit 1; }
[ "$(grep -c '^dcp run:' "$tmp/out")" -eq 1 ] || { echo "expected exactly one summary (rank 0)"; cat "$tmp/out"; exit 1; }
echo "1 passed, 0 failed"
