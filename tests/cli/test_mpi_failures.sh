#!/usr/bin/env bash
# A rank that fails, dies or stalls under mpirun ends the whole job promptly, with a message
# naming the rank, and leaves no process behind.
#   test_mpi_failures.sh MPIEXEC path/to/dcp
set -u
mpiexec="$1"
dcp="$2"
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/marker" 2>/dev/null; rm -rf "$tmp"' EXIT
passed=0
failed=0
ok() { passed=$((passed + 1)); }
fail() { failed=$((failed + 1)); echo "FAIL: $1"; sed 's/^/  /' "$tmp/out" | tail -8; }
# A marker in every command line, so that this test's processes (and only they) can be found.
run_flags=(run --comm mpi --tp-size 4 --dcp-size 4 --batch 2 --model-path "$tmp/marker/good")
no_process_left() { ! pgrep -f "$tmp/marker" >/dev/null; }

"$dcp" gen-checkpoint --out "$tmp/marker/good" >/dev/null || { echo "gen-checkpoint failed"; exit 1; }
cp -r "$tmp/marker/good" "$tmp/marker/bad"
truncate -s 100000 "$tmp/marker/bad/model.safetensors"

# 1. Rank 3 of 4 loads a truncated checkpoint (mpirun's MPMD form): the job ends with rank 3's
#    error, not a deadlock in the other ranks' collectives or in MPI_Finalize.
start=$SECONDS
timeout 120 "$mpiexec" -np 3 "$dcp" "${run_flags[@]}" --prompt-len 50 --max-new-tokens 4 \
  : -np 1 "$dcp" run --comm mpi --tp-size 4 --dcp-size 4 --batch 2 --model-path "$tmp/marker/bad" \
  --prompt-len 50 --max-new-tokens 4 >"$tmp/out" 2>&1
code=$?
if [ "$code" -ne 0 ] && [ "$code" -ne 124 ]; then ok; else fail "load failure: exit $code"; fi
if grep -q "dcp: error: rank 3: .*truncated file" "$tmp/out"; then ok; else fail "load failure: names rank 3"; fi
if [ $((SECONDS - start)) -lt 60 ]; then ok; else fail "load failure took $((SECONDS - start)) s"; fi
if no_process_left; then ok; else fail "load failure: processes left"; fi

# Starts a long decode in the background and picks one of its ranks.
start_long_run() {
  timeout 120 "$mpiexec" -np 4 "$dcp" "${run_flags[@]}" --prompt-len 100 --max-new-tokens 100000 \
    --max-total-tokens 300000 --comm-timeout 5 >"$tmp/out" 2>&1 &
  job=$!
  for _ in $(seq 1 100); do  # until the four ranks run, then 3 s for them to load and decode
    [ "$(pgrep -fc "^$dcp .*$tmp/marker")" -ge 4 ] && break
    sleep 0.2
  done
  sleep 3
  victim=$(pgrep -f "^$dcp .*$tmp/marker" | tail -1)  # one of the ranks
}

# 2. A rank dies mid-decode (SIGKILL): the job ends.
start_long_run
start=$SECONDS
kill -KILL "$victim"
wait "$job"
code=$?
if [ "$code" -ne 0 ] && [ "$code" -ne 124 ]; then ok; else fail "killed rank: exit $code"; fi
if [ $((SECONDS - start)) -lt 60 ]; then ok; else fail "killed rank: took $((SECONDS - start)) s"; fi
if no_process_left; then ok; else fail "killed rank: processes left"; fi

# 3. A rank stalls mid-decode (SIGSTOP): the others give up after --comm-timeout 5, naming the
#    collective, and the job ends (the stopped process too).
start_long_run
start=$SECONDS
kill -STOP "$victim"
wait "$job"
code=$?
kill -KILL "$victim" 2>/dev/null
if [ "$code" -ne 0 ] && [ "$code" -ne 124 ]; then ok; else fail "stalled rank: exit $code"; fi
if grep -q "dcp: error: rank [0-9]: MPI .* over world ranks {0, 1, 2, 3} waited 5 s (--comm-timeout)" "$tmp/out"; then
  ok
else
  fail "stalled rank: names the collective and the timeout"
fi
if [ $((SECONDS - start)) -lt 60 ]; then ok; else fail "stalled rank: took $((SECONDS - start)) s"; fi
if no_process_left; then ok; else fail "stalled rank: processes left"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
