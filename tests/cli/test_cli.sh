#!/usr/bin/env bash
# Command-line behaviour of `dcp`: exit codes, one-line errors naming the flag, JSON output.
# Usage: test_cli.sh path/to/dcp
set -u
dcp="$1"
passed=0
failed=0

# expect CODE DESCRIPTION -- ARGS... : runs dcp ARGS, checks the exit status; keeps output.
expect() {
  local want="$1" what="$2"
  shift 3
  "$dcp" "$@" >/tmp/dcp_cli_out.$$ 2>/tmp/dcp_cli_err.$$
  local got=$?
  if [ "$got" -eq "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what: exit $got, expected $want (dcp $*)"
    sed 's/^/  stderr: /' /tmp/dcp_cli_err.$$ | head -5
  fi
}
# check DESCRIPTION COMMAND...: a shell condition on the last outputs.
check() {
  local what="$1"
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $what"; fi
}
stderr_has() { grep -q -- "$1" /tmp/dcp_cli_err.$$; }
stdout_has() { grep -q -- "$1" /tmp/dcp_cli_out.$$; }
stderr_lines() { [ "$(wc -l </tmp/dcp_cli_err.$$)" -eq "$1" ]; }

expect 0 "seed example TP64 DP4 DCP16" -- topology --tp-size 64 --dp-size 4 --enable-dp-attention --dcp-size 16 --json
check "four DCP groups" stdout_has '"num_dcp_groups": 4'
check "attention TP 16" stdout_has '"attn_tp_size": 16'
check "auto backend is a2a on cpu" stdout_has '"dcp_comm_backend": "a2a"'

expect 2 "DCP 32 crosses a DP replica" -- topology --tp-size 64 --dp-size 4 --enable-dp-attention --dcp-size 32
check "one line on stderr" stderr_lines 1
check "names --dcp-size and legal values" stderr_has "--dcp-size 32 .*legal --dcp-size values: 1, 2, 4, 8, 16"

expect 2 "fi_a2a without MNNVL" -- topology --tp-size 4 --dcp-size 2 --dcp-comm-backend fi_a2a
check "names fi_a2a" stderr_has "fi_a2a needs Blackwell"
expect 0 "fi_a2a on blackwell-mnnvl" -- topology --tp-size 4 --dcp-size 2 --dcp-comm-backend fi_a2a --platform blackwell-mnnvl
expect 2 "unknown backend" -- topology --dcp-comm-backend nccl
check "lists legal backends" stderr_has "ag_rs, a2a, fi_a2a"
expect 2 "replicated q with ag_rs" -- topology --tp-size 4 --dcp-size 4 --dcp-comm-backend ag_rs --dcp-replicate-q-proj
check "names the flag" stderr_has "--dcp-replicate-q-proj"
expect 0 "alias --decode-context-parallel-size" -- topology --tp-size 4 --decode-context-parallel-size 4 --no-dcp-replicate-q-proj
check "alias took effect" stdout_has "DCP size 4: 1 group"
expect 2 "non-numeric size" -- topology --dcp-size x
expect 2 "unknown subcommand" -- frobnicate
expect 0 "help" -- --help
expect 0 "demo (small)" -- demo --context 300 --heads 4 --dcp-size 3 --batch 2 --page-size 7
check "demo says OK" stdout_has "^OK"
expect 2 "demo rejects bad dtype" -- demo --kv-cache-dtype fp8
check "names legal dtypes" stderr_has "legal: fp32, bf16"

rm -f /tmp/dcp_cli_out.$$ /tmp/dcp_cli_err.$$
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
