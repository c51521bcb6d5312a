#!/usr/bin/env bash
# Starts `dcp serve` on a generated checkpoint (ranks as threads, or `mpirun -np 4` when MPIEXEC is
# given) and drives it with the npm `openai` client and with `curl -N`; then SIGTERM must end it
# with exit 0. The client is fetched from npm into a cache outside the source tree
# (DCP_NPM_CACHE, default ~/.cache/dcp-npm); exits 77 (skipped) when node or npm is not there.
# The server requires an API key, which the client sends as OpenAI's api_key.
# Usage: run_openai_client.sh path/to/dcp [MPIEXEC]
set -u
dcp="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # before the cd below
mpiexec="${2:-}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${DCP_NPM_CACHE:-$HOME/.cache/dcp-npm}"
client=openai@4.95.0
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "SKIP: node and npm are not installed (the OpenAI client runs on node)"
  exit 77
}
mkdir -p "$cache" && cd "$cache" || exit 1
[ -f package.json ] || echo '{"private": true}' >package.json
if [ "$(node -p 'require("openai/package.json").version' 2>/dev/null)" != "${client#openai@}" ]; then
  if ! timeout 300 npm install --no-audit --no-fund --silent "$client" >npm.log 2>&1; then
    echo "SKIP: could not fetch $client from the npm registry into $cache:"
    tail -3 npm.log
    exit 77
  fi
fi
cp "$here/openai_client.mjs" "$cache/"  # node finds the package beside the script

tmp=$(mktemp -d)
trap '[ -n "${server:-}" ] && kill -KILL "$server" 2>/dev/null; rm -rf "$tmp"' EXIT
"$dcp" gen-checkpoint --out "$tmp/ckpt" --num-layers 2 >/dev/null || { echo "gen-checkpoint failed"; exit 1; }
key="dcp-test-$$"  # the client sends it as OpenAI's api_key
flags=(serve --model-path "$tmp/ckpt" --port 0 --tp-size 2 --dcp-size 2 --served-model-name tiny-mla --api-key "$key"
       --tool-call-parser deepseek_v3)
if [ -n "$mpiexec" ]; then
  "$mpiexec" -np 4 "$dcp" "${flags[@]}" --comm mpi --dp-size 2 >"$tmp/out" 2>"$tmp/err" &
else
  "$dcp" "${flags[@]}" >"$tmp/out" 2>"$tmp/err" &
fi
server=$!
port=""
for _ in $(seq 1 300); do
  port=$(grep -o 'http://127.0.0.1:[0-9]*' "$tmp/out" 2>/dev/null | head -1 | cut -d: -f3)
  [ -n "$port" ] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL: the server did not start"; cat "$tmp/err"; exit 1; }
failed=0
node "$cache/openai_client.mjs" "http://127.0.0.1:$port/v1" tiny-mla "$key" || failed=1

# curl -N: the raw event stream, one data: line per piece, ending in [DONE].
curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H 'Content-Type: application/json' -H "Authorization: Bearer $key" \
  -d '{"messages":[{"role":"user","content":"hello"}],"max_tokens":10,"temperature":0,"stream":true}' >"$tmp/sse"
if [ "$(grep -c '^data: ' "$tmp/sse")" -ge 3 ] && [ "$(grep '^data: ' "$tmp/sse" | tail -1)" = "data: [DONE]" ]; then :; else
  echo "FAIL: curl -N stream"; cat "$tmp/sse"; failed=1
fi
curl -s "http://127.0.0.1:$port/metrics" | grep -q '^dcp_generation_tokens_total [1-9]' ||
  { echo "FAIL: /metrics counts the generated tokens"; failed=1; }

# SIGTERM (to rank 0 under mpirun: mpirun itself exits 1 when signalled) ends it with exit 0.
target=$server
if [ -n "$mpiexec" ]; then
  for p in $(pgrep -f "$tmp/ckpt"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0' && target=$p
  done
fi
kill -TERM "$target"
code=0
wait "$server" || code=$?
server=""
[ "$code" -eq 0 ] && grep -q "dcp serve: stopped" "$tmp/out" || { echo "FAIL: exit $code after SIGTERM"; cat "$tmp/err"; failed=1; }
pgrep -f "$tmp/ckpt" >/dev/null && { echo "FAIL: processes left"; failed=1; }
[ "$failed" -eq 0 ] && echo "PASS: the openai client, curl -N and SIGTERM${mpiexec:+ under mpirun -np 4}"
exit "$failed"
