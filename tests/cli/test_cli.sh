#!/usr/bin/env bash
# Command-line behaviour of `dcp`: exit codes, one-line errors naming the flag, JSON output.
# One behaviour per case, each its own ctest test (cli.CASE), each runnable alone:
#   test_cli.sh CASE path/to/dcp [path/to/bench_kernels]
#   test_cli.sh --list
set -u
case_name="${1:-}"
dcp="${2:-}"
bench_kernels="${3:-}"  # the Google Benchmark binary, for `dcp bench plot` end to end
passed=0
failed=0
tmp=$(mktemp -d)
out="$tmp/.stdout"
err="$tmp/.stderr"
trap 'rm -rf "$tmp"' EXIT

# expect CODE DESCRIPTION -- ARGS... : runs dcp ARGS, checks the exit status; keeps output.
expect() {
  local want="$1" what="$2"
  shift 3
  "$dcp" "$@" >"$out" 2>"$err"
  local got=$?
  if [ "$got" -eq "$want" ]; then
    passed=$((passed + 1))
  else
    failed=$((failed + 1))
    echo "FAIL: $what: exit $got, expected $want (dcp $*)"
    sed 's/^/  stderr: /' "$err" | head -5
  fi
}
# check DESCRIPTION COMMAND...: a shell condition on the last outputs.
check() {
  local what="$1"
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $what"; fi
}
stderr_has() { grep -q -- "$1" "$err"; }
# The captured stderr exists and does not match (a missing file must not pass as "no match").
stderr_lacks() { [ -f "$err" ] && ! grep -q -- "$1" "$err"; }
stdout_has() { grep -q -- "$1" "$out"; }
stdout_lacks() { [ -s "$out" ] && ! grep -q -- "$1" "$out"; }
stdout_empty() { [ ! -s "$out" ]; }
stdout_lacks_verify_false() { [ -s "$out" ] && ! grep -q -- "--verify.*{false}" "$out"; }
stderr_lines() { [ "$(wc -l <"$err")" -eq "$1" ]; }
json_has() { grep -q -- "$1" "$tmp/run.json"; }
# bad_value DESCRIPTION MESSAGE -- ARGS...: exit 2, the message, nothing printed first.
bad_value() {
  local what="$1" message="$2"
  shift 2
  expect 2 "$what" "$@"
  check "$what: names the flag" stderr_has "$message"
  check "$what: prints nothing first" stdout_empty
}

# `dcp topology`: layouts, backend rules and refusals; help and unknown subcommands
case_topology() {
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
}

# `dcp demo`: a small striped attention checked against full attention
case_demo() {
  expect 0 "demo (small)" -- demo --context 300 --heads 4 --dcp-size 3 --batch 2 --page-size 7
  check "demo says OK" stdout_has "^OK"
  expect 2 "demo rejects bad dtype" -- demo --kv-cache-dtype fp8
  check "names the flag and legal dtypes" stderr_has "--kv-cache-dtype: .fp8. is not one of: fp32, bf16"
}

# `dcp run`: the JSON keys kept stable, the verification summary, the mpirun warning
case_run_summary() {
  expect 0 "run small with json" -- run --batch 3 --prompt-len 150 --max-new-tokens 3 --json "$tmp/run.json"
  for key in '"dcp_size": 4' '"dcp_comm_backend": "a2a"' '"tp_size": 4' '"logical_capacity_tokens"' \
             '"kv_rows_used"' '"kv_bytes"' '"decode_ms_per_step"' '"collectives_per_layer": 2.0' \
             '"bytes_per_layer_per_rank"' '"output_tokens"' '"tokens_match": true' '"max_abs_logit_diff"'; do
    check "json has $key" json_has "$key"
  done
  check "summary says PASS" stdout_has "PASS"
  check "verify says what it compared" stdout_has "verify vs dcp 1 (3 requests, 9 steps): tokens match"
  check "json counts the compared steps" json_has '"steps_compared": 9'
  # Started by mpirun (its environment) without --comm mpi: a warning, and the job still runs.
  OMPI_COMM_WORLD_SIZE=2 expect 0 "threads under mpirun" -- run --num-layers 1 --batch 1 --prompt-len 20 --max-new-tokens 2
  check "warns to pass --comm mpi" stderr_has "started by mpirun with 2 processes but --comm threads.*pass --comm mpi"
  expect 0 "threads, no mpirun" -- run --num-layers 1 --batch 1 --prompt-len 20 --max-new-tokens 2
  check "no warning" stderr_lacks warning
  # One new token: the requests finish (and free their KV) in the step that prefilled them.
  expect 0 "run, one new token" -- run --batch 2 --prompt-len 100 --max-new-tokens 1 --json "$tmp/run.json"
  check "the peak KV is sampled before the requests free it (100 + 68 prompt rows over 4 ranks)" stdout_has "rank 0 (dcp rank 0): peak 42 rows/layer"
  check "the JSON reports the same peak" json_has '"kv_rows_used": 42'
}

# every request rejected: each says why, and a verification that compared nothing fails
case_run_rejected() {
  expect 1 "run with every request rejected" -- run --num-layers 1 --max-total-tokens 1 --json "$tmp/run.json"
  check "says why each was rejected" stdout_has "request 0 (prompt 4000): REJECTED: needs 4032 tokens of KV; the cache holds 256 (raise --max-total-tokens)"
  check "verify does not pass on nothing" stdout_has "verify vs dcp 1: nothing to compare, no request finished in both runs: FAIL"
  check "json says the reason" json_has '"error": "needs 4032 tokens of KV'
  check "json says not passed" json_has '"passed": false'
  # Past the model's context (its config's max_position_embeddings, cut to 64 here).
  expect 0 "gen-checkpoint" -- gen-checkpoint --out "$tmp/short"
  /usr/bin/python3 -c 'import json, sys; p = sys.argv[1] + "/config.json"; c = json.load(open(p)); c["max_position_embeddings"] = 64; json.dump(c, open(p, "w"))' "$tmp/short"
  expect 0 "run past the model's context" -- run --model-path "$tmp/short" --batch 1 --prompt-len 60 --max-new-tokens 8 --no-verify
  check "says the model's context" stdout_has "REJECTED: needs 68 positions; the model's context is 64 (max_position_embeddings)"
  expect 0 "run within it" -- run --model-path "$tmp/short" --batch 1 --prompt-len 60 --max-new-tokens 4 --no-verify
  check "runs it" stdout_lacks "REJECTED"
}

# the combine backends' collective counts, prompt tokens and the logits file
case_run_combine() {
  expect 0 "ag_rs backend, dcp 2, fp32 KV" -- run --tp-size 4 --dcp-size 2 --dcp-comm-backend ag_rs --kv-cache-dtype fp32 --batch 2 --prompt-len 90 --max-new-tokens 3 --json "$tmp/run.json"
  check "ag_rs takes 3 collectives per layer" json_has '"collectives_per_layer": 3.0'
  expect 0 "kimi-k3 replicates the query projection by default" -- run --preset kimi-k3 --num-layers 1 --tp-size 4 --dcp-size 2 --batch 2 --prompt-len 30 --max-new-tokens 3 --json "$tmp/run.json"
  check "kimi-k3: replicated" json_has '"dcp_replicate_q_proj": true'
  check "kimi-k3: verifies" json_has '"passed": true'
  expect 0 "--no-dcp-replicate-q-proj turns it off" -- run --preset kimi-k3 --num-layers 1 --tp-size 4 --dcp-size 2 --batch 2 --prompt-len 30 --max-new-tokens 3 --no-dcp-replicate-q-proj --json "$tmp/run.json"
  check "kimi-k3 off: gathered" json_has '"dcp_replicate_q_proj": false'
  expect 0 "kimi-k3 with ag_rs: no default replication" -- run --preset kimi-k3 --num-layers 1 --tp-size 4 --dcp-size 2 --dcp-comm-backend ag_rs --batch 1 --prompt-len 20 --max-new-tokens 2 --json "$tmp/run.json"
  check "kimi-k3 ag_rs: gathered" json_has '"dcp_replicate_q_proj": false'
  expect 0 "other models do not replicate by default" -- run --batch 1 --prompt-len 20 --max-new-tokens 2 --json "$tmp/run.json"
  check "tiny: gathered" json_has '"dcp_replicate_q_proj": false'
  expect 0 "replicated q takes 1 collective" -- run --dcp-replicate-q-proj --batch 2 --prompt-len 90 --max-new-tokens 3 --json "$tmp/run.json"
  check "one packed all-to-all" json_has '"collectives_per_layer": 1.0'
  expect 0 "prompt tokens, chunk not a multiple of N" -- run --prompt-tokens "5,6,7;8" --chunked-prefill-size 3 --max-new-tokens 2 --dump-logits "$tmp/logits.bin"
  check "logits file has a header" grep -q '"shape":\[4,512\]' "$tmp/logits.bin"
  # A list longer than a file name may be is still a list, not an unreadable file.
  expect 0 "a long inline prompt" -- run --prompt-tokens "$(seq -s, 1 300)" --max-new-tokens 2
  check "its 300 tokens" stdout_has "request 0 (prompt 300)"
}

# configurations refused with one line naming the flag
case_run_refusals() {
  expect 2 "dcp must divide tp" -- run --tp-size 4 --dcp-size 3
  check "names --dcp-size" stderr_has "--dcp-size 3 must divide --tp-size 4"
  expect 2 "bad kv dtype" -- run --kv-cache-dtype fp8
  expect 2 "bad preset" -- run --preset llama
  check "lists presets" stderr_has "tiny, deepseek-v2-lite, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight, minicpm3-4b, deepseek-v3-attn, kimi-k3"
  expect 2 "bad token id" -- run --prompt-tokens "1,x"
  expect 2 "token outside vocab" -- run --prompt-tokens "100000" --max-new-tokens 1
  check "names the vocabulary" stderr_has "outside the vocabulary"
  expect 2 "tp does not divide heads" -- run --tp-size 16 --dcp-size 4 --preset tiny
  check "refused before any rank starts (no 'rank N:')" stderr_has "^dcp: error: --tp-size 16 must divide the model's 8 attention heads"
  expect 1 "missing checkpoint" -- run --model-path "$tmp/none"
  check "names --model-path" stderr_has "^dcp: error: --model-path: checkpoint directory $tmp/none has no config.json"
  expect 1 "a checkpoint name too long for the system" -- run --model-path "$tmp/$(printf 'x%.0s' $(seq 1 300))"
  check "names --model-path and why" stderr_has "^dcp: error: --model-path: checkpoint directory .* has no config.json (File name too long)"
  expect 2 "a draft name too long for the system" -- run --speculative-num-draft-tokens 2 --speculative-draft "$(printf 'x%.0s' $(seq 1 300))"
  check "names --speculative-draft" stderr_has "^dcp: error: --speculative-draft 'x*' is neither ngram:N"
  expect 1 "draft checkpoint without a config" -- run --speculative-num-draft-tokens 2 --speculative-draft "$tmp"
  check "names --speculative-draft, not --model-path" stderr_has "^dcp: error: --speculative-draft: checkpoint directory $tmp has no config.json"
  expect 2 "token id beyond int32" -- run --prompt-tokens "99999999999"
  check "says what a token id is" stderr_has "'99999999999' in prompt 1 is not a token id (an integer in \[0, 2^31))"
}

# a generated checkpoint runs and verifies, also as its own speculative draft
case_run_checkpoint() {
  expect 0 "gen-checkpoint" -- gen-checkpoint --out "$tmp/ckpt" --num-files 2 --no-q-lora
  expect 0 "run a generated checkpoint" -- run --model-path "$tmp/ckpt" --batch 2 --prompt-len 60 --max-new-tokens 3
  check "checkpoint run verifies" stdout_has "PASS"
  expect 0 "speculative with a checkpoint draft" -- run --model-path "$tmp/ckpt" --batch 2 --prompt-len 60 --max-new-tokens 5 --speculative-num-draft-tokens 2 --speculative-draft "$tmp/ckpt"
}

# speculative decoding with the target's first layers; draft refusals
case_run_speculative() {
  expect 0 "speculative with the target's first layer" -- run --batch 2 --prompt-len 120 --max-new-tokens 9 --speculative-num-draft-tokens 3 --speculative-draft target:1 --json "$tmp/run.json"
  check "speculative summary" stdout_has "tokens per target step"
  check "json has acceptance_rate" json_has '"acceptance_rate"'
  check "json has each request's verifying steps" json_has '"spec_verify_steps": [2-8]$'
  check "speculation verifies" json_has '"tokens_match": true'
  expect 2 "draft layers out of range" -- run --speculative-num-draft-tokens 2 --speculative-draft target:9
  check "names target:N" stderr_has "target:N needs 1 <= N <= 2"
  expect 2 "draft vocabulary mismatch" -- run --speculative-num-draft-tokens 2 --speculative-draft deepseek-v3
  check "names both vocabularies" stderr_has "^dcp: error: --speculative-draft 'deepseek-v3' has a vocabulary of 129280, the target 512"
  expect 2 "unknown draft" -- run --speculative-num-draft-tokens 2 --speculative-draft nosuch
  check "says what a draft may be" stderr_has "^dcp: error: --speculative-draft 'nosuch' is neither ngram:N, target:N, a checkpoint folder nor a preset (tiny"
  expect 0 "speculative by n-gram lookup" -- run --batch 2 --prompt-len 120 --max-new-tokens 40 --speculative-num-draft-tokens 3 --speculative-draft ngram:3 --json "$tmp/run.json"
  check "n-gram speculation verifies" json_has '"tokens_match": true'
  check "n-gram draft named" json_has '"draft": "ngram:3"'
  expect 2 "n-gram size out of range" -- run --speculative-num-draft-tokens 2 --speculative-draft ngram:0
  check "names ngram:N" stderr_has "^dcp: error: --speculative-draft 'ngram:0': ngram:N needs 1 <= N <= 1024"
}

# DCP-native extend verifies; bench extend plots both paths
case_run_extend() {
  expect 0 "native extend" -- run --dcp-extend native --batch 2 --prompt-len 200 --chunked-prefill-size 45 --max-new-tokens 3
  check "native extend verifies" stdout_has "PASS"
  expect 0 "bench extend (small)" -- bench extend --prefix-lens 0,40 --chunk 8 --repeats 1 --dcp-size 2 --svg "$tmp/extend.svg"
  check "bench prints a table" stdout_has "native/gather"
  check "bench extend plots both paths" [ "$(grep -c "<polyline" "$tmp/extend.svg")" -eq 2 ]
}

# the prefix cache and host tier
case_run_prefix_cache() {
  expect 0 "prefix cache with a shared prefix" -- run --enable-prefix-cache --host-kv-capacity-tokens 1024 --shared-prefix-len 200 --batch 4 --prompt-len 260 --max-new-tokens 3 --max-running-requests 1 --json "$tmp/run.json"
  check "json has the hit rate" json_has '"hit_rate"'
  check "json has per-rank tier bytes" json_has '"bytes_to_host"'
  check "cache run verifies" json_has '"tokens_match": true'
  check "summary reports the hit rate" stdout_has "prefix cache: hit rate"
  # Arriving together, the later requests wait for the first one's pages of the shared prefix:
  # each reuses min(200, its prompt - 1) tokens in whole pages of 16 x DCP 4.
  expect 0 "prefix cache, requests arriving together" -- run --enable-prefix-cache --shared-prefix-len 200 --batch 4 --prompt-len 260 --max-new-tokens 3 --page-size 16 --json "$tmp/run.json"
  check "each later request reuses the shared pages" /usr/bin/python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))["requests"]
want = [0] + [min(200, q["prompt_len"] - 1) // 64 * 64 for q in r[1:]]
sys.exit(0 if [q["cached_prompt_tokens"] for q in r] == want and want[1] > 0 else 1)' "$tmp/run.json"
  check "the summary says what each reused" stdout_has "(prompt [0-9]*, [0-9]* cached)"
  expect 0 "prefix cache with speculative decoding" -- run --enable-prefix-cache --speculative-num-draft-tokens 3 --speculative-draft target:1 --shared-prefix-len 150 --batch 4 --prompt-len 200 --max-new-tokens 6 --max-running-requests 1 --page-size 8 --json "$tmp/run.json"
  check "cache + speculation: hits" json_has '"hit_tokens": [1-9]'
  check "cache + speculation: drafts accepted" json_has '"acceptance_rate": 0\.[0-9]*[1-9]'
  check "cache + speculation verifies" json_has '"passed": true'
  expect 2 "host tier without the cache" -- run --host-kv-capacity-tokens 100
  check "names the missing flag" stderr_has "needs --enable-prefix-cache"
  expect 2 "shared prefix longer than the prompt" -- run --shared-prefix-len 5000

}

# `dcp plan`: recommendations, JSON, refusals
case_plan() {
  expect 0 "plan on H200" -- plan --preset deepseek-v3 --num-layers 61 --tp-size 8 --batch 16 --contexts 32768,131072
  check "plan recommends" stdout_has "-> context 131072: DCP"
  check "plan explains capacity" stdout_has "without DCP the KV does not fit"
  expect 0 "plan as json" -- plan --hardware this-cpu --preset tiny --tp-size 4 --contexts 4096 --json
  check "plan json has rows" stdout_has '"per_layer"'
  # MiniCPM3-4B's context is 32768 (max_position_embeddings): longer contexts are priced but
  # marked, never recommended.
  expect 0 "plan past the model's context" -- plan --preset minicpm3-4b --tp-size 2 --contexts 32768,65536
  check "plans within it" stdout_has "-> context 32768: DCP"
  check "marks beyond it" stdout_has "-> context 65536: beyond the model's context (max_position_embeddings 32768)"
  expect 0 "plan past the model's context, json" -- plan --preset minicpm3-4b --tp-size 2 --contexts 32768,65536 --json
  check "json names the model's context" stdout_has '"max_position_embeddings": 32768'
  check "json marks the row" stdout_has '"within_model_context": false'
  # Replicated query projection: each rank holds the DCP group's q_b_proj and kv_b_proj rows, at
  # DCP 2 for Kimi-K3 at TP 8: 2 x 12 heads x (192 x 1536 + 256 x 512) x 2 bytes; its step reads
  # the other rank's 12 heads of q_b_proj and w_kc: 12 x (192 x 1536 + 128 x 512) x 2 bytes at
  # 4 TB/s.
  expect 0 "plan kimi-k3 counts the replicated projection" -- plan --preset kimi-k3 --tp-size 8 --hardware h200-nvlink --contexts 4096 --json
  check "replicated weights per layer" stdout_has '"replicated_weight_bytes_per_layer": 20447232.0'
  check "replicated gemm time" stdout_has '"replicated_gemm_ms": 0.00216268'
  # Weights in the step: tiny (dense) at batch 1 reads all its 1091328 bytes of bf16 weights
  # but the 511 embedding rows (128 x 2 bytes) no token looks up: 960512 bytes, at 4 TB/s.
  expect 0 "plan counts the weights a step reads" -- plan --preset tiny --tp-size 1 --batch 1 --contexts 64 --hardware h200-nvlink --json
  check "weights per rank" stdout_has '"weights_bytes_per_rank": 1091328.0'
  check "weights read per step" stdout_has '"weight_read_bytes_per_step": 960512.0'
  check "their time" stdout_has '"weight_read_ms": 0.000240128'
  check "a step is 2 layers x 2.56e-06 ms + that" stdout_has '"step_ms": 0.000245248'
  expect 2 "plan rejects unknown hardware" -- plan --hardware tpu
  check "lists hardware presets" stderr_has "this-cpu, h200-nvlink"
}

# `dcp bench comm` on thread ranks
case_bench_comm() {
  expect 0 "bench comm (small)" -- bench comm --ranks 2 --tokens 1,2 --repeats 2 --csv "$tmp/comm.csv" --svg "$tmp/comm.svg"
  check "bench comm prints ratios" stdout_has "ratio"
  check "bench comm writes both backends at both token counts" [ "$(grep -c '^threads,2,' "$tmp/comm.csv")" -eq 4 ]
  check "bench comm plots a series per backend" [ "$(grep -c "<polyline" "$tmp/comm.svg")" -eq 2 ]
}

# `dcp bench attention`: ceilings, cache states, prefill chunks, the PyTorch peer
case_bench_attention() {
  expect 0 "bench attention (small)" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes bf16 --repeats 1
  check "bench attention prints ceilings" stdout_has "ceilings (sgemm GFLOP/s, read GB/s) are measured again"
  check "bench attention flushes the caches by default" stdout_has "cache: cold, every timed call"
  expect 0 "bench attention on warm caches" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes fp32 --repeats 1 --cache warm --torch-python off
  expect 0 "bench attention, a prefill chunk" -- bench attention --query-tokens 64 --contexts 256 --heads 4 --batches 2 --dtypes fp32 --repeats 1 --cache warm --csv "$tmp/chunk.csv"
  check "bench attention names the chunk" stdout_has "prefill-chunk attention"
  check "bench attention's CSV has the query tokens" grep -q "^2,256,64,4,fp32," "$tmp/chunk.csv"
  check "says the caches are warm" stdout_has "cache: warm"
  expect 2 "bench attention rejects a bad cache state" -- bench attention --contexts 256 --cache hot
  check "names the flag and the legal values" stderr_has "--cache: 'hot' is not one of: cold, warm"
  # The PyTorch peer: a stand-in interpreter speaks the peer's protocol, so the columns are checked
  # without torch; interpreters that cannot import torch or fail are reported, not fatal.
  cat >"$tmp/fake_python" <<'FAKE'
#!/bin/sh
if [ "$2" = "--version" ]; then echo "torch 0.0-fake"; exit 0; fi
# script, batch, context, heads, threads, repeats, dtypes, flush bytes (> 0 on a cold cache)
[ $# -eq 8 ] && [ "$8" -gt 0 ] || { echo "bad arguments: $*"; exit 2; }
echo "bf16 4.25"
FAKE
  printf '#!/bin/sh\nexit 3\n' >"$tmp/no_torch_python"
  printf '#!/bin/sh\nexit 124\n' >"$tmp/slow_python"  # what `timeout` reports when it fires
  chmod +x "$tmp/fake_python" "$tmp/no_torch_python" "$tmp/slow_python"
  expect 0 "bench attention with a torch peer" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes bf16 --repeats 1 --torch-python "$tmp/fake_python"
  check "names the torch version" stdout_has "torch: torch 0.0-fake"
  check "prints the torch time" stdout_has "|      4.25 "
  expect 0 "bench attention, torch off" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes fp32 --repeats 1 --torch-python off
  check "says the peer is off" stdout_has "torch: not measured (disabled by --torch-python off)"
  expect 0 "bench attention, no torch" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes fp32 --repeats 1 --torch-python "$tmp/no_torch_python"
  check "says torch is missing" stdout_has "cannot import torch (Debian: apt-get install python3-torch)"
  expect 0 "bench attention, torch import times out" -- bench attention --contexts 256 --heads 4 --batches 1 --dtypes fp32 --repeats 1 --torch-python "$tmp/slow_python"
  check "says it timed out" stdout_has "did not import torch within 300 s"
}

# `dcp bench merge`
case_bench_merge() {
  expect 0 "bench merge, one repeat" -- bench merge --repeats 1 --csv "$tmp/merge.csv" --svg "$tmp/merge.svg"
  check "bench merge flushes by default" stdout_has "cache: cold"
  check "bench merge writes its CSV" grep -q "^operation,ms,gbps,fraction_of_read,read_gbps,cache$" "$tmp/merge.csv"
  check "one CSV line per operation" [ "$(wc -l <"$tmp/merge.csv")" -eq 8 ]
  check "bench merge writes its plot" grep -q "<polyline" "$tmp/merge.svg"
  expect 2 "bench merge rejects a bad cache state" -- bench merge --cache lukewarm
  check "bench merge names the flag" stderr_has "--cache: 'lukewarm' is not one of: cold, warm"
}

# `dcp bench guide`: a synthetic vocabulary and a tokenizer's, the walk checked against the scan
case_bench_guide() {
  expect 0 "bench guide, synthetic" -- bench guide --vocab-size 3000 --repeats 1 --csv "$tmp/guide.csv"
  check "bench guide prints both sides" stdout_has "first scan first walk"
  check "bench guide writes its CSV" grep -q "^guide,vocabulary,tokens,states,allowed_per_state,first_scan_ms_per_state,first_walk_ms_per_state,first_speedup," "$tmp/guide.csv"
  check "one CSV line per guide" [ "$(wc -l <"$tmp/guide.csv")" -eq 5 ]
  check "the synthetic vocabulary is named" [ "$(grep -c ',synthetic,' "$tmp/guide.csv")" -eq 4 ]
  expect 0 "gen-checkpoint for its tokenizer" -- gen-checkpoint --family deepseek-v2-lite --out "$tmp/lite"
  expect 0 "bench guide, a tokenizer" -- bench guide --tokenizer-path "$tmp/lite" --repeats 2
  check "bench guide names the tokenizer" stdout_has "vocabulary: $tmp/lite, 319 ids"
  bad_value "bench guide, --vocab-size with a tokenizer" "--tokenizer-path excludes --vocab-size" -- bench guide --tokenizer-path "$tmp/lite" --vocab-size 500
  bad_value "bench guide, a vocabulary under 256" "--vocab-size: Value 100 not in range" -- bench guide --vocab-size 100
  bad_value "bench guide, no such folder" "--tokenizer-path: Directory does not exist" -- bench guide --tokenizer-path "$tmp/none"
}

# `dcp bench serve`: the server on loopback under streaming clients, colocated and disaggregated
case_bench_serve() {
  expect 0 "bench serve" -- bench serve --concurrency 1,3 --rounds 2 --max-tokens 4 --prompt-len 24 --csv "$tmp/serve.csv" --svg "$tmp/serve.svg"
  check "bench serve writes a CSV row per concurrency" [ "$(wc -l <"$tmp/serve.csv")" -eq 3 ]
  check "every request of the server ends whole" [ "$(cut -d, -f9 "$tmp/serve.csv" | tail -n +2 | sort -u)" = 0 ]
  check "bench serve plots" grep -q "engine alone" "$tmp/serve.svg"
  # Disaggregated: 6 requests of a 24-token prompt held at once by the prefill group.
  expect 0 "bench serve disaggregated" -- bench serve --concurrency 1,3 --rounds 2 --max-tokens 4 --prompt-len 24 --disaggregate --prefill-dcp-size 2 --csv "$tmp/serve_pd.csv"
  check "says the prefill group" stdout_has "TP 2, DCP 2, prefill group DCP 2"
  check "every disaggregated request ends whole" [ "$(cut -d, -f9 "$tmp/serve_pd.csv" | tail -n +2 | sort -u)" = 0 ]
  expect 0 "bench serve disaggregated, prefill DCP 1" -- bench serve --concurrency 2 --rounds 1 --max-tokens 3 --prompt-len 20 --disaggregate
  bad_value "bench serve, prefill DCP 3 to decode DCP 2" "prefill DCP size 3 -> decode DCP size 2 is not supported" -- bench serve --concurrency 1 --disaggregate --prefill-dcp-size 3
  bad_value "bench serve, a prefill size alone" "--prefill-dcp-size requires --disaggregate" -- bench serve --prefill-dcp-size 2
}

# `dcp bench step` and `dcp bench engine`
case_bench_step_engine() {
  expect 2 "bench step with an unwritable CSV" -- bench step --preset tiny --contexts 64 --new-tokens 3 --csv /nonexistent-dir/step.csv
  check "says which file it cannot write, before running" stderr_has "--csv: cannot write '/nonexistent-dir/step.csv'"
  check "ran nothing" stdout_empty
  expect 0 "bench step (small)" -- bench step --preset tiny --contexts 64 --new-tokens 3 --csv "$tmp/step.csv" --svg "$tmp/step.svg"
  check "bench step writes DCP 1 and 2" [ "$(grep -c '^64,[12],' "$tmp/step.csv")" -eq 2 ]
  check "bench step plots attention beside the plan" grep -q "plan attention, DCP 2" "$tmp/step.svg"
  check "bench step prints the plan beside the measurement" stdout_has "plan ms"
  check "bench step separates waiting from the transfer" stdout_has "least ms"
  expect 0 "bench engine (small)" -- bench engine --context 128 --concurrency 1,2 --new-tokens 2 --dp-attention 2 --csv "$tmp/engine.csv" --svg "$tmp/engine.svg"
  check "bench engine writes TP only and TP + DCP at each concurrency" [ "$(grep -c '^[14],[12],.*,1$' "$tmp/engine.csv")" -eq 4 ]
  check "bench engine writes DP attention (2 x DCP 2) at each concurrency" [ "$(grep -c '^2,[12],.*,2$' "$tmp/engine.csv")" -eq 2 ]
  check "bench engine plots both" grep -q "TP 4, DCP 4" "$tmp/engine.svg"
  check "bench engine plots DP attention" grep -q "DP 2 x (TP 2, DCP 2)" "$tmp/engine.svg"
  expect 2 "bench step rejects a bad backend" -- bench step --preset tiny --contexts 64 --dcp-comm-backend bogus
  check "bench step names the flag" stderr_has "--dcp-comm-backend: 'bogus' is not one of: ag_rs, a2a"
  expect 2 "bench decode with an unwritable CSV" -- bench decode --preset tiny --num-layers 1 --csv /nonexistent-dir/decode.csv
  check "bench decode says which file, before running" stderr_has "--csv: cannot write '/nonexistent-dir/decode.csv'"
  check "bench decode ran nothing" stdout_empty
  expect 2 "bench decode int4 without experts" -- bench decode --preset tiny --num-layers 1 --dtypes int4
  check "bench decode names the preset's missing experts" stderr_has "--preset tiny has none"
  expect 0 "bench decode (small)" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1,tp2dcp2 --dtypes f32,bf16,fp8 --contexts 0,64 --batches 1,2 --new-tokens 3 --csv "$tmp/decode.csv"
  check "bench decode writes one row per point" [ "$(grep -c '^decode,tp[12]dcp[12],' "$tmp/decode.csv")" -eq 24 ]
  check "bench decode writes a prefill row per configuration and dtype" [ "$(grep -c '^prefill,tp[12]dcp[12],512,1,[12],\(f32\|bf16\|fp8\),' "$tmp/decode.csv")" -eq 6 ]
  check "bench decode has the columns a reader needs" grep -q '^mode,config,context,batch,threads,weights_dtype,tokens_per_s,.*roofline_fraction$' "$tmp/decode.csv"
  check "bench decode prints the ceilings it used" stdout_has "read ceiling"
  check "bench decode names its attention kernel" stdout_has "^attention kernel: \(portable\|avx2\|avx512\) (exact)$"
  check "bench decode names its weight kernel" stdout_has "weight kernel (decode shapes): \(portable\|avx2, FP8 widened by F16C\|avx512, FP8 widened by \(F16C\|AVX512-VBMI byte lookups\)\)\(, lines asked ahead into L[12] (L1d [0-9]* KB)\)\?; prefill shapes: \(BLAS sgemm, bf16/FP8 rows widened a tile at a time\|\(avx2\|avx512\), x packed once, bf16/FP8 widened in L1 chunks\)$"
  check "bench decode names both GEMMs of its compute ceiling" stdout_has "compute ceiling [0-9.]* GFLOP/s (1 thread; sgemm [0-9.]* with OpenBLAS [0-9.]*, [A-Za-z]* kernels\(, forced by OPENBLAS_CORETYPE\)\{0,1\}, dcp's blocked product \([0-9.]*\|not on the portable path\))"
  expect 0 "bench decode on a forced weight path" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1 --dtypes bf16 --contexts 0 --batches 1 --new-tokens 2 --prefill-tokens 20 --weight-kernel portable
  check "names the forced path's kernels" stdout_has "weight kernel (decode shapes): portable; prefill shapes: BLAS sgemm, bf16/FP8 rows widened a tile at a time$"
  check "no blocked product on the portable path" stdout_has "dcp's blocked product not on the portable path)"
  expect 2 "bench decode refuses an unknown weight path" -- bench decode --preset tiny --num-layers 1 --weight-kernel bogus
  check "names the flag and the legal paths" stderr_has "--weight-kernel bogus: not one of: automatic, portable, avx2, avx512, avx512_bf16"
  expect 0 "bench decode on a forced attention path" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1 --dtypes bf16 --contexts 64 --batches 1 --new-tokens 2 --prefill-tokens 20 --attention-kernel portable
  check "names the forced attention path" stdout_has "^attention kernel: portable (exact)$"
  expect 2 "bench decode refuses an unknown attention path" -- bench decode --preset tiny --num-layers 1 --attention-kernel bogus
  check "names the flag and the legal paths" stderr_has "--attention-kernel bogus: kernel path 'bogus' is not one of: automatic, portable, avx2, avx512, amx_bf16, avx512_bf16"
  # Eight requests whose contexts end mid-page: the KV must hold each one's last partial page.
  expect 0 "bench decode, a batch of contexts ending mid-page" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1,tp2dcp2 --dtypes bf16 --contexts 100 --batches 8 --prefill-tokens 0 --new-tokens 3 --csv "$tmp/decode.csv"
  check "bench decode ran the batch of 8 on both configurations" [ "$(grep -c '^decode,tp[12]dcp[12],100,8,' "$tmp/decode.csv")" -eq 2 ]
  expect 0 "bench decode, two threads per rank" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1,tp2dcp2 --dtypes bf16 --contexts 0 --batches 1 --threads 1,2 --new-tokens 3 --csv "$tmp/decode.csv"
  check "bench decode counts all threads (tp 1)" [ "$(grep -c '^decode,tp1dcp1,0,1,2,bf16,' "$tmp/decode.csv")" -eq 1 ]
  check "bench decode counts all threads (tp 2)" [ "$(grep -c '^decode,tp2dcp2,0,1,4,bf16,' "$tmp/decode.csv")" -eq 1 ]
  OPENBLAS_CORETYPE=Haswell expect 0 "a BLAS kernel set chosen by the user is kept and named" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1 --dtypes f32 --contexts 0 --batches 1 --new-tokens 3
  check "named as forced" stdout_has "Haswell kernels, forced by OPENBLAS_CORETYPE"
  expect 2 "bench decode refuses a DCP size that does not divide TP" -- bench decode --preset tiny --configs tp2dcp3
  check "bench decode names the item and the form" stderr_has "--configs item 'tp2dcp3' must be tpTdcpN"
  expect 2 "bench decode refuses an unknown weight dtype" -- bench decode --preset tiny --dtypes fp16
  check "bench decode names the legal dtypes" stderr_has "--dtypes: 'fp16' is not one of: f32, bf16, fp8"

}

# data parallelism: independent replicas of TP x DCP
case_run_dp() {
  expect 0 "two DP replicas" -- run --dp-size 2 --tp-size 2 --dcp-size 2 --batch 3 --prompt-len 120 --max-new-tokens 3 --json "$tmp/run.json"
  check "dp run verifies" json_has '"tokens_match": true'
  check "json has dp size" json_has '"dp_size": 2'
  check "every request answered" json_has '"id": 2'
}

# DP attention with DCP inside each attention group, dense and MoE (FP8) families; the reference
# is DP 1 / DCP 1 at the same TP
case_run_dp_attention() {
  expect 0 "tp 4 / dp 2 / dcp 2, dense" -- run --tp-size 4 --dp-size 2 --enable-dp-attention --dcp-size 2 --batch 3 --prompt-len 120 --max-new-tokens 3 --chunked-prefill-size 50 --json "$tmp/run.json"
  check "dense verifies" json_has '"passed": true'
  check "dense: tokens match" json_has '"tokens_match": true'
  check "json says DP attention" json_has '"enable_dp_attention": true'
  check "json has per-group KV" json_has '"dp_groups"'
  check "summary shows each group" stdout_has "^  dp group 1: 2 requests, "
  check "each group's KV holds its own requests only" stdout_has "^KV: logical capacity 512 tokens per DP group"
  expect 0 "gen-checkpoint deepseek-v3" -- gen-checkpoint --family deepseek-v3 --out "$tmp/v3"
  for dp in 2 4; do
    expect 0 "tp 8 / dp $dp / dcp 2 / ep 8, MoE FP8" -- run --model-path "$tmp/v3" --tp-size 8 --dp-size "$dp" --enable-dp-attention --dcp-size 2 --ep-size 8 --batch 5 --prompt-len 50 --max-new-tokens 4 --json "$tmp/run.json"
    check "dp $dp: MoE verifies" json_has '"passed": true'
    check "dp $dp: tokens match" json_has '"tokens_match": true'
    check "dp $dp: ep size in the json" json_has '"ep_size": 8'
  done
  expect 0 "expert parallelism without DP attention" -- run --model-path "$tmp/v3" --tp-size 4 --dcp-size 2 --ep-size 2 --batch 3 --prompt-len 40 --max-new-tokens 3 --json "$tmp/run.json"
  check "ep 2: verifies" json_has '"passed": true'
  expect 2 "ep on a dense model is refused" -- run --ep-size 2
  check "names the flag" stderr_has "--ep-size 2 needs a mixture-of-experts model; preset:tiny has no routed experts (legal: 1)"
  expect 2 "ep that does not divide tp is refused" -- run --model-path "$tmp/v3" --tp-size 4 --ep-size 3
  check "names the flag and the legal values" stderr_has "--ep-size 3 must divide --tp-size 4; legal --ep-size values: 1, 2, 4"
  expect 0 "more groups than requests: idle groups take part" -- run --model-path "$tmp/v3" --tp-size 8 --dp-size 4 --enable-dp-attention --dcp-size 2 --batch 1 --prompt-len 30 --max-new-tokens 3 --json "$tmp/run.json"
  check "idle groups: verifies" json_has '"passed": true'
  check "idle group reported" stdout_has "^  dp group 3: 0 requests, 0.00 MiB KV used"
  expect 2 "dcp across attention groups is refused" -- run --tp-size 4 --dp-size 2 --enable-dp-attention --dcp-size 4
  check "names the flag and the legal values" stderr_has "--dcp-size 4 must divide the attention TP size 2"
}

# forcing the local attention kernel
case_run_kernel() {
  expect 0 "run on the portable kernel" -- run --attention-kernel portable --batch 2 --prompt-len 70 --max-new-tokens 2 --json "$tmp/run.json"
  check "json names the kernel" json_has '"attention_kernel": "portable"'
  check "portable run verifies" json_has '"tokens_match": true'
  expect 0 "automatic names the path it resolves to" -- run --batch 1 --prompt-len 20 --max-new-tokens 1 --json "$tmp/run.json"
  check "no 'automatic' in the summary" json_has '"attention_kernel": "\(portable\|avx2\|avx512\)"'
  expect 2 "unknown kernel is refused" -- run --attention-kernel bogus
  check "names the flag and the legal paths" stderr_has "--attention-kernel bogus: kernel path 'bogus' is not one of: automatic, portable, avx2, avx512, amx_bf16, avx512_bf16"
  expect 2 "amx on fp32 KV is refused" -- run --attention-kernel amx_bf16 --kv-cache-dtype fp32
  check "says why" stderr_has "--attention-kernel amx_bf16: \(amx_bf16 needs --kv-cache-dtype bf16\|kernel path amx_bf16 is not available: it needs a CPU with AMX-BF16\)"
  expect 2 "avx512_bf16 on fp32 KV is refused" -- run --attention-kernel avx512_bf16 --kv-cache-dtype fp32
  check "says why" stderr_has "--attention-kernel avx512_bf16: \(avx512_bf16 needs --kv-cache-dtype bf16\|kernel path avx512_bf16 is not available: it needs a CPU with AVX-512 and AVX512-BF16\)"
  if grep -qw avx512_bf16 /proc/cpuinfo; then
    expect 0 "run on the AVX512-BF16 path" -- run --attention-kernel avx512_bf16 --kv-cache-dtype bf16 --batch 2 --prompt-len 70 --max-new-tokens 2 --json "$tmp/run.json"
    check "json names the bf16-pair path" json_has '"attention_kernel": "avx512_bf16"'
  fi
  # forcing the weight products' path
  expect 0 "run with the weight products on the portable path" -- run --weight-kernel portable --batch 2 --prompt-len 70 --max-new-tokens 2 --json "$tmp/run.json"
  check "json names the weight path" json_has '"weight_kernel": "portable"'
  check "portable weights verify" json_has '"tokens_match": true'
  expect 0 "automatic weights name the path they resolve to" -- run --batch 1 --prompt-len 20 --max-new-tokens 1 --json "$tmp/run.json"
  check "no 'automatic' weight path in the json" json_has '"weight_kernel": "\(portable\|avx2\|avx512\)"'
  expect 2 "unknown weight path is refused" -- run --weight-kernel bogus
  check "names the flag and the legal paths" stderr_has "--weight-kernel bogus: not one of: automatic, portable, avx2, avx512, avx512_bf16"
  expect 2 "an attention-only path is refused for the weights" -- run --weight-kernel amx_bf16
  check "says it is the attention kernel's" stderr_has "--weight-kernel amx_bf16: kernel path amx_bf16 is an attention path; the weight product runs on automatic, portable, avx2, avx512 or avx512_bf16"
  expect 2 "bf16 pairs on a model without bf16 weights are refused" -- run --weight-kernel avx512_bf16
  check "says why" stderr_has "--weight-kernel avx512_bf16\( multiplies bf16 and FP8 weights in pairs; this model holds neither (its weights are fp32, its lm_head fp32)\|: kernel path avx512_bf16 is not available: it needs a CPU with AVX-512 and AVX512-BF16\)"
  expect 2 "bench decode refuses bf16 pairs for fp32 weights" -- bench decode --preset tiny --num-layers 1 --weight-kernel avx512_bf16 --dtypes bf16,f32
  check "names both flags" stderr_has "--weight-kernel avx512_bf16\( multiplies bf16 and FP8 weights in pairs; --dtypes bf16,f32 includes f32\|: kernel path avx512_bf16 is not available\)"
  if grep -qw avx512_bf16 /proc/cpuinfo; then
    expect 0 "bf16 weights in pairs" -- run --preset deepseek-v2-lite --num-layers 1 --weight-kernel avx512_bf16 --batch 2 --prompt-len 70 --max-new-tokens 2 --json "$tmp/run.json"
    check "json names the pairs path" json_has '"weight_kernel": "avx512_bf16"'
    check "pairs verify" json_has '"passed": true'
    expect 0 "bench decode on bf16 pairs" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1 --dtypes bf16,fp8 --contexts 0 --batches 1 --new-tokens 2 --prefill-tokens 20 --weight-kernel avx512_bf16
    check "names the pairs and their ceilings" stdout_has "; bf16 pairs on bf16 weights [0-9.]* GFLOP/s; bf16 pairs on FP8 weights [0-9.]* GFLOP/s$"
    expect 0 "bench decode on bf16 pairs, bf16 only" -- bench decode --preset tiny --num-layers 1 --configs tp1dcp1 --dtypes bf16 --contexts 0 --batches 1 --new-tokens 2 --prefill-tokens 20 --weight-kernel avx512_bf16
    check "times the pairs of the dtypes it runs only" stdout_has "; bf16 pairs on bf16 weights [0-9.]* GFLOP/s$"
  fi
  # threads inside each rank: weight products split by rows, attention by tokens and KV ranges
  expect 0 "three threads per rank" -- run --threads-per-rank 3 --tp-size 2 --dcp-size 2 --batch 3 --prompt-len 300 --max-new-tokens 4 --json "$tmp/run.json"
  check "threads per rank in the json" json_has '"threads_per_rank": 3'
  check "threads per rank verify" json_has '"passed": true'
  check "threads per rank in the summary" stdout_has "3 thread(s) per rank"
  for bad in 0 257; do
    expect 2 "threads per rank $bad is refused" -- run --threads-per-rank "$bad"
    check "names the flag and the range" stderr_has "--threads-per-rank: Value $bad not in range 1 to 256"
  done
}

# the KV striped in runs of I tokens per rank, through prefill chunks, the prefix cache and
# disaggregation
case_run_interleave() {
  for il in 1 2 16 64; do
    expect 0 "interleave $il" -- run --dcp-kv-cache-interleave-size "$il" --batch 3 --prompt-len 300 --max-new-tokens 4 --chunked-prefill-size 70 --json "$tmp/run.json"
    check "interleave $il verifies" json_has '"passed": true'
    check "interleave $il in the json" json_has "\"dcp_kv_cache_interleave_size\": $il"
  done
  expect 0 "interleave 2 with the prefix cache, native extend and the host tier" -- run --dcp-kv-cache-interleave-size 2 --page-size 16 --dcp-extend native --enable-prefix-cache --host-kv-capacity-tokens 512 --shared-prefix-len 150 --max-running-requests 1 --batch 4 --prompt-len 300 --max-new-tokens 4 --json "$tmp/run.json"
  check "interleave + cache: hits" json_has '"hit_tokens": [1-9]'
  check "interleave + cache verifies" json_has '"passed": true'
  expect 0 "interleave 16, disaggregated 1 -> 4" -- run --dcp-kv-cache-interleave-size 16 --disaggregate --prefill-dcp-size 1 --batch 3 --prompt-len 200 --max-new-tokens 4 --json "$tmp/run.json"
  check "interleave + disaggregation verifies" json_has '"passed": true'
  expect 2 "interleave not dividing the page size" -- run --dcp-kv-cache-interleave-size 48
  check "names the flags and the legal values" stderr_has "--dcp-kv-cache-interleave-size 48 must divide --page-size 64 (a stripe may not straddle two pages); legal values: 1, 2, 4, 8, 16, 32, 64"
}

# disaggregated prefill and decode
case_run_disagg() {
  # Disaggregation.
  expect 0 "disaggregate 1 -> 4" -- run --disaggregate --prefill-dcp-size 1 --batch 3 --prompt-len 130 --max-new-tokens 4 --json "$tmp/run.json"
  check "json has bytes per decode rank" json_has '"bytes_per_decode_rank"'
  check "disaggregation verifies" json_has '"tokens_match": true'
  check "disaggregation times the loading of both sides" json_has '"model_load_ms": [1-9]'
  expect 0 "disaggregate 4 -> 4" -- run --disaggregate --prefill-dcp-size 4 --batch 2 --prompt-len 90 --max-new-tokens 3
  check "summary reports bytes moved" stdout_has "bytes received per decode rank"
  expect 0 "disaggregate with speculative decoding on the decode side" -- run --disaggregate --prefill-dcp-size 1 --speculative-num-draft-tokens 3 --speculative-draft target:1 --batch 3 --prompt-len 130 --max-new-tokens 8 --json "$tmp/run.json"
  check "disagg + speculation verifies" json_has '"passed": true'
  check "disagg + speculation: drafts accepted" json_has '"acceptance_rate": 0\.[0-9]*[1-9]'
  expect 0 "disaggregate with the prefix cache on the prefill side" -- run --disaggregate --prefill-dcp-size 1 --enable-prefix-cache --host-kv-capacity-tokens 1024 --shared-prefix-len 200 --batch 4 --prompt-len 260 --max-new-tokens 3 --max-running-requests 1 --json "$tmp/run.json"
  check "disagg + cache: hits" json_has '"hit_tokens": [1-9]'
  check "disagg + cache: the prefill rank's host tier" stdout_has "  rank 0: .* B to host"
  check "disagg + cache: no decode rank's" stdout_lacks "  rank 1: .* B to host"
  check "disagg + cache verifies" json_has '"passed": true'
  expect 2 "disaggregate 2 -> 4 is refused" -- run --disaggregate --prefill-dcp-size 2
  check "names both sizes" stderr_has "prefill DCP size 2 -> decode DCP size 4 is not supported"
  check "refused before any rank started" stderr_lines 1
  expect 0 "disaggregate onto two DP-attention groups" -- run --disaggregate --tp-size 4 --dp-size 2 --enable-dp-attention --dcp-size 2 --batch 4 --prompt-len 120 --max-new-tokens 4 --json "$tmp/run.json"
  check "disagg onto DP attention verifies" json_has '"passed": true'
  check "each group served requests" stdout_has "dp group 1: 2 requests"
  expect 2 "serve: disaggregate 2 -> 4 is refused" -- serve --disaggregate --prefill-dcp-size 2 --tp-size 4 --dcp-size 4 --port 0
  check "serve names both sizes" stderr_has "prefill DCP size 2 -> decode DCP size 4 is not supported"

}

# bad values stop a command while its flags parse: exit 2, the flag and the legal values, nothing on stdout
case_bad_values() {
  bad_value "run, negative comm timeout" "--comm-timeout: -1 must be >= 0" -- run --comm-timeout -1
  bad_value "run, --verify with --no-verify" "--verify excludes --no-verify" -- run --verify --no-verify
  expect 0 "run --help" -- run --help
  check "--help says verification is on by default" stdout_has "teacher forcing (on by default)"
  check "--help shows no false default beside --verify" stdout_lacks_verify_false
  bad_value "bench attention, context 0" "--contexts: 0 must be >= 1" -- bench attention --contexts 0
  bad_value "bench attention, heads 0" "--heads: 0 must be >= 1" -- bench attention --heads 0
  bad_value "bench attention, batch 0" "--batches: 0 must be >= 1" -- bench attention --batches 4,0
  bad_value "bench attention, dtype" "--dtypes: 'fp8' is not one of: fp32, bf16, bf16-amx" -- bench attention --dtypes fp32,fp8
  bad_value "bench attention, trailing junk" "--contexts: '12k' is not an integer" -- bench attention --contexts 12k
  bad_value "bench attention, 0 query tokens" "--query-tokens: 0 must be >= 1" -- bench attention --query-tokens 0
  bad_value "bench attention, a chunk longer than a context" "--query-tokens 300 exceeds the shortest of --contexts, 256" -- bench attention --query-tokens 300 --contexts 4096,256
  bad_value "bench comm, 0 repeats" "--repeats: 0 must be >= 1" -- bench comm --repeats 0
  bad_value "bench comm, 0 ranks" "--ranks: 0 must be >= 1" -- bench comm --ranks 2,0
  bad_value "bench comm, 0 tokens" "--tokens: 0 must be >= 1" -- bench comm --tokens 0
  bad_value "bench comm, 0 heads" "--heads-per-rank: 0 must be >= 1" -- bench comm --heads-per-rank 0
  bad_value "bench comm, unknown comm" "--comm: 'tcp' is not one of: threads, mpi" -- bench comm --comm tcp
  bad_value "bench engine, 0 layers" "--num-layers: 0 must be >= 1" -- bench engine --num-layers 0
  bad_value "bench engine, 0 concurrency" "--concurrency: 0 must be >= 1" -- bench engine --concurrency 0
  bad_value "bench engine, KV budget" "--kv-budget-mib: -1 must be > 0" -- bench engine --kv-budget-mib -1
  bad_value "bench engine, 1 new token" "--new-tokens: 1 must be >= 2" -- bench engine --new-tokens 1
  bad_value "bench engine, DP attention not dividing the ranks" "--dp-attention: 3 must be >= 2 and divide --ranks 4" -- bench engine --dp-attention 3
  bad_value "bench engine, ranks not dividing the heads" "^dcp: error: --ranks 3 must divide the model's 8 attention heads" -- bench engine --ranks 3
  bad_value "bench step, context 0" "--contexts: 0 must be >= 1" -- bench step --contexts 0
  bad_value "bench extend, 0 layers" "--num-layers: 0 must be >= 1" -- bench extend --num-layers 0
  bad_value "bench step, ranks not dividing the heads" "^dcp: error: --ranks 3 must divide the model's 8 attention heads" -- bench step --preset tiny --ranks 3
  bad_value "plan, TP not dividing the heads" "^dcp: error: --tp-size 3 must divide the model's 8 attention heads" -- plan --preset tiny --tp-size 3
  bad_value "bench extend, size not dividing the heads" "^dcp: error: --dcp-size 3 must divide the model's 8 attention heads" -- bench extend --dcp-size 3
  bad_value "plan, context not a number" "--contexts: 'x' is not an integer" -- plan --contexts 1024,x
  bad_value "plan, context 0" "--contexts: 0 must be >= 1" -- plan --contexts 0
  bad_value "plan, link bandwidth" "--link-gbps: -1 must be > 0" -- plan --link-gbps -1
  bad_value "plan, latency" "--link-latency-us: -5 must be >= 0" -- plan --link-latency-us -5
  bad_value "plan, memory" "--memory-gib: 0 must be > 0" -- plan --memory-gib 0
  bad_value "plan, dtype" "--kv-cache-dtype: 'fp8' is not one of: fp32, bf16" -- plan --kv-cache-dtype fp8
  bad_value "run, 0 layers" "--num-layers: 0 must be >= 1" -- run --num-layers 0
  bad_value "run, prefill DCP size" "--prefill-dcp-size: 0 must be >= 1" -- run --prefill-dcp-size 0
  bad_value "run, seed" "--seed: -1 must be >= 0" -- run --seed -1
  # Each refused while the flags parse: chunked-prefill-size and the host tier used to fail inside a
  # rank (after the ranks had started), the others after the workload options were read.
  bad_value "run, 0 batch" "--batch: 0 must be >= 1" -- run --batch 0
  bad_value "run, 0 prompt length" "--prompt-len: 0 must be >= 1" -- run --prompt-len 0
  bad_value "run, 0 new tokens" "--max-new-tokens: 0 must be >= 1" -- run --max-new-tokens 0
  bad_value "run, 0 page size" "--page-size: 0 must be >= 1" -- run --page-size 0
  bad_value "run, 0 prefill chunk" "--chunked-prefill-size: 0 must be >= 1" -- run --chunked-prefill-size 0
  bad_value "run, negative host tier" "--host-kv-capacity-tokens: -1 must be >= 0" -- run --enable-prefix-cache --host-kv-capacity-tokens -1
  bad_value "run, 0 running requests" "--max-running-requests: 0 must be >= 1" -- run --max-running-requests 0
  bad_value "run, negative draft tokens" "--speculative-num-draft-tokens: -1 must be >= 0" -- run --speculative-num-draft-tokens -1
  bad_value "run, negative shared prefix" "--shared-prefix-len: -1 must be >= 0" -- run --shared-prefix-len -1
  bad_value "run, shared prefix as long as the prompt" "--shared-prefix-len 4000 must be below --prompt-len 4000" -- run --shared-prefix-len 4000
  bad_value "run, extend mode" "--dcp-extend: 'scatter' is not one of: gather, native" -- run --dcp-extend scatter
  bad_value "demo, 0 DCP size" "--dcp-size: 0 must be >= 1" -- demo --dcp-size 0
  bad_value "demo, 0 heads" "--heads: 0 must be >= 1" -- demo --heads 0
  bad_value "demo, 0 context" "--context: 0 must be >= 1" -- demo --context 0
  bad_value "demo, 0 batch" "--batch: 0 must be >= 1" -- demo --batch 0
  bad_value "demo, 0 page size" "--page-size: 0 must be >= 1" -- demo --page-size 0
  bad_value "gen-checkpoint, dtype" "--dtype: 'F8' is not one of: BF16, F16, F32" -- gen-checkpoint --out "$tmp/x" --dtype F8
  bad_value "gen-checkpoint, 0 files" "--num-files: 0 must be >= 1" -- gen-checkpoint --out "$tmp/x" --num-files 0
  check "gen-checkpoint wrote nothing" [ ! -e "$tmp/x" ]
}

# output files are checked before the work
case_output_files() {
  bad_value "bench attention, CSV in a missing directory" "--csv: cannot write '$tmp/none/a.csv': no directory $tmp/none" -- bench attention --csv "$tmp/none/a.csv"
  bad_value "bench merge, plot onto a directory" "--svg: '$tmp' is a directory, not a file" -- bench merge --svg "$tmp"
  bad_value "run, JSON in a missing directory" "--json: cannot write '$tmp/none/r.json'" -- run --json "$tmp/none/r.json"
  bad_value "run, logits in a missing directory" "--dump-logits: cannot write '$tmp/none/l.bin'" -- run --dump-logits "$tmp/none/l.bin"
}

# workloads beyond this machine's memory are refused at once, naming what to lower
case_memory_limits() {
  expect 1 "run, prompts too long for memory" -- run --prompt-len 2000000000
  check "says the KV size and what to lower" stderr_has "a KV cache of 6500001110 tokens (the prompts and --max-new-tokens) over 2 layers, beside the weights, needs about .* GiB, more than the .* GiB of memory available (of .* GiB); lower --prompt-len, --batch or --max-new-tokens"
  expect 1 "run, weights too large for memory" -- run --preset deepseek-v3 --num-layers 4000 --tp-size 4 --dcp-size 4
  check "names the weights and what to raise" stderr_has "^dcp: error: loading the weights of 4000 layers at TP 4 (synthetic, bf16, FP8 projections) needs about .* GiB, more than the .* GiB of memory available (of .* GiB); raise --tp-size or lower --num-layers"
  check "refused before any work" stdout_empty
  expect 1 "run, capacity too large for memory" -- run --max-total-tokens 100000000000
  check "names --max-total-tokens" stderr_has "(--max-total-tokens) over 2 layers, beside the weights, needs about .*; lower --max-total-tokens"
  expect 1 "bench comm, too many thread ranks" -- bench comm --ranks 2,100000 --tokens 1
  check "says to lower --ranks" stderr_has "--ranks 100000 as threads with --tokens 1 needs about .*; lower --ranks or --tokens"
  check "ran nothing" stdout_empty
  expect 1 "demo over 2e9 rows" -- demo --context 2000000000 --heads 1 --dcp-size 1
  check "says the size and what to lower" stderr_has "^dcp: error: --context 2000000000 x --batch 2 needs about .*; lower --context or --batch"
  SECONDS=0
  expect 1 "run, a batch too large for memory" -- run --batch 2000000000
  check "refused from the batch, before storing a length per request" stderr_has "^dcp: error: --batch 2000000000 requests of at least 33 tokens each needs about .*; lower --batch or --max-new-tokens"
  check "refused at once" [ "$SECONDS" -lt 5 ]
  expect 2 "run, thousands of thread ranks" -- run --dp-size 1000 --tp-size 1 --dcp-size 1
  check "bounds the thread ranks and names --comm mpi" stderr_has "needs 1000 ranks (--tp-size x --dp-size); --comm threads runs at most 256 in one process (use --comm mpi under mpirun)"
  expect 1 "gen-checkpoint, too many layers for memory" -- gen-checkpoint --num-layers 100000 --out "$tmp/huge"
  check "names the layers and what to lower" stderr_has "^dcp: error: writing a checkpoint of 100000 layers (its tensors are held as fp32 until written) needs about .*; lower --num-layers"
  check "wrote nothing" [ ! -e "$tmp/huge" ]
  touch "$tmp/plain"
  expect 1 "gen-checkpoint under a file" -- gen-checkpoint --out "$tmp/plain/ckpt"
  check "names --out and says why, in one line" stderr_has "^dcp: error: --out: cannot create the checkpoint directory $tmp/plain/ckpt: Not a directory"

}

# `dcp bench plot` of Google Benchmark JSON
case_bench_plot() {
  # bench plot: the Google Benchmark binary's JSON as a table, CSV and SVG.
  if [ -n "$bench_kernels" ]; then
    # Two repetitions: the file then holds two runs per point plus aggregates, which are skipped.
    "$bench_kernels" --benchmark_filter='BM_Merge' --benchmark_min_time=0.01 \
      --benchmark_repetitions=2 --benchmark_out="$tmp/gb.json" --benchmark_out_format=json \
      >/dev/null 2>&1
    check "bench_kernels wrote its JSON" grep -q '"BM_Merge/parts:8/rows:2048"' "$tmp/gb.json"
    expect 0 "bench plot of bench_kernels" -- bench plot --json "$tmp/gb.json" --x parts --y read_B/s --csv "$tmp/gb.csv" --svg "$tmp/gb.svg"
    check "a row per parts" [ "$(grep -c '^BM_Merge rows=2048 ' "$out")" -eq 3 ]
    check "csv has a header and three rows" [ "$(wc -l <"$tmp/gb.csv")" -eq 4 ]
    check "one series plotted" [ "$(grep -c "<polyline" "$tmp/gb.svg")" -eq 1 ]
  fi
  # A file written by hand: positional arguments, two families, and only aggregates (with
  # --benchmark_report_aggregates_only), of which the medians count.
  cat >"$tmp/agg.json" <<'JSON'
{"benchmarks": [
 {"name": "BM_A/8/1_median", "run_name": "BM_A/8/1", "run_type": "aggregate", "aggregate_name": "median", "real_time": 2000, "time_unit": "us"},
 {"name": "BM_A/8/1_mean", "run_name": "BM_A/8/1", "run_type": "aggregate", "aggregate_name": "mean", "real_time": 5000, "time_unit": "us"},
 {"name": "BM_A/16/1_median", "run_name": "BM_A/16/1", "run_type": "aggregate", "aggregate_name": "median", "real_time": 3, "time_unit": "ms"},
 {"name": "BM_B/8/2_median", "run_name": "BM_B/8/2", "run_type": "aggregate", "aggregate_name": "median", "real_time": 7000000, "time_unit": "ns"}
]}
JSON
  # A run that failed (SkipWithError) is left out.
  cat >"$tmp/err.json" <<'JSON'
{"benchmarks": [
 {"name": "BM_C/1", "run_name": "BM_C/1", "run_type": "iteration", "real_time": 4, "time_unit": "ms"},
 {"name": "BM_C/2", "run_name": "BM_C/2", "run_type": "iteration", "error_occurred": true, "error_message": "no AMX", "real_time": 0, "time_unit": "ms"}
]}
JSON
  expect 0 "bench plot skips failed runs" -- bench plot --json "$tmp/err.json" --x arg0 --csv "$tmp/err.csv"
  check "only the run that worked" [ "$(wc -l <"$tmp/err.csv")" -eq 2 ]
  expect 0 "bench plot of aggregates" -- bench plot --json "$tmp/agg.json" --x arg0 --csv "$tmp/agg.csv"
  check "the median, in ms" grep -q '^BM_A arg1=1,8,2$' "$tmp/agg.csv"
  check "ms values kept" grep -q '^BM_A arg1=1,16,3$' "$tmp/agg.csv"
  check "a series per family and other arguments" grep -q '^BM_B arg1=2,8,7$' "$tmp/agg.csv"
  echo '{"benchmarks": [{"name": "BM_D/1", "real_time": 1, "time_unit": "fortnights"}]}' >"$tmp/unit.json"
  expect 1 "bench plot, unknown time unit" -- bench plot --json "$tmp/unit.json" --x arg0
  check "names the file and the unit" stderr_has "--json $tmp/unit.json: unknown time_unit 'fortnights'"
  expect 1 "bench plot of a missing file" -- bench plot --json "$tmp/none.json" --x parts
  check "names --json" stderr_has "--json $tmp/none.json: cannot open"
  echo '{"context": {}}' >"$tmp/nobench.json"
  expect 1 "bench plot of other JSON" -- bench plot --json "$tmp/nobench.json" --x parts
  check "says what is missing" stderr_has "no 'benchmarks' array"
  expect 2 "bench plot, unknown --x" -- bench plot --json "$tmp/agg.json" --x heads
  check "lists the arguments" stderr_has "--x heads is not an argument .*(arguments: arg0, arg1)"
  expect 2 "bench plot, unknown --y" -- bench plot --json "$tmp/agg.json" --x arg0 --y FLOP/s
  check "lists the measures" stderr_has "--y FLOP/s is not a measure .*(measures: real_time)"
}

# every MLA family as published: a generated checkpoint in its dtypes runs at TP 4 x DCP 4 and
# verifies against DCP 1
case_families() {
  for family in deepseek-v2-lite deepseek-v2 deepseek-v3 kimi-k2 kimi-k2-thinking moonlight; do
    expect 0 "gen-checkpoint $family" -- gen-checkpoint --family "$family" --out "$tmp/$family"
    check "$family: sharded with an index" [ -f "$tmp/$family/model.safetensors.index.json" ]
    check "$family: a tokenizer beside the weights" [ -f "$tmp/$family/tokenizer.json" -a -f "$tmp/$family/tokenizer_config.json" ]
    expect 0 "run $family" -- run --model-path "$tmp/$family" --tp-size 4 --dcp-size 4 --batch 3 --prompt-len 40 --max-new-tokens 4 --json "$tmp/run.json"
    check "$family verifies" json_has '"passed": true'
    check "$family: tokens match" json_has '"tokens_match": true'
  done
  expect 0 "run deepseek-v3" -- run --model-path "$tmp/deepseek-v3" --batch 1 --prompt-len 20 --max-new-tokens 2 --json "$tmp/run.json"
  check "the FP8 dtype is reported" json_has '"dtype": "fp8_e4m3"'
  check "weights per rank are reported" json_has '"bytes_per_rank"'
  check "the multi-token-prediction layer is skipped with a note" stderr_has "multi-token-prediction layer(s) (layer 3 on) are not part of the main model"
  check "the summary shows the weights" stdout_has "^weights: fp8_e4m3, MiB per rank: "
  expect 0 "run kimi-k2-thinking" -- run --model-path "$tmp/kimi-k2-thinking" --batch 1 --prompt-len 20 --max-new-tokens 2 --json "$tmp/run.json"
  check "INT4 experts are reported" json_has '"experts_dtype": "int4"'
  check "the summary names the experts' dtype" stdout_has "^weights: bf16 (routed experts int4), MiB per rank: "
  printf 'the thing' | "$dcp" tokenize --tokenizer-path "$tmp/deepseek-v3" >"$out" 2>"$err"
  check "the generated tokenizer encodes" stdout_has '^\[116,258,'
  echo '[{"role": "user", "content": "Hi"}]' | "$dcp" tokenize --tokenizer-path "$tmp/deepseek-v3" --chat --add-generation-prompt --print-prompt >"$out" 2>"$err"
  check "the generated chat template renders" stdout_has '^<s><|user|>Hi<|assistant|>$'
  # --jsonl: many texts in one run, each line answered as a run of its own would answer it
  local v3="$tmp/deepseek-v3"
  printf '"the thing"\n"a\\nb"\n""\n' | "$dcp" tokenize --tokenizer-path "$v3" --jsonl >"$out" 2>"$err"
  check "--jsonl: one line of ids a line" [ "$(wc -l <"$out")" -eq 3 ]
  check "--jsonl: a text's ids as alone" [ "$(sed -n 1p "$out")" = "$(printf 'the thing' | "$dcp" tokenize --tokenizer-path "$v3")" ]
  check "--jsonl: a newline inside a text" [ "$(sed -n 2p "$out")" = "$(printf 'a\nb' | "$dcp" tokenize --tokenizer-path "$v3")" ]
  check "--jsonl: an empty text has no ids" [ "$(sed -n 3p "$out")" = "[]" ]
  printf '"the"\n' | "$dcp" tokenize --tokenizer-path "$v3" --jsonl --add-special-tokens >"$tmp/bos" 2>"$err"
  check "--jsonl --add-special-tokens: as alone" [ "$(cat "$tmp/bos")" = "$(printf 'the' | "$dcp" tokenize --tokenizer-path "$v3" --add-special-tokens)" ]
  head -2 "$out" | "$dcp" tokenize --tokenizer-path "$v3" --jsonl --decode >"$tmp/texts" 2>"$err"
  check "--jsonl --decode: the texts back, one JSON string a line" [ "$(cat "$tmp/texts")" = "$(printf '"the thing"\n"a\\nb"')" ]
  printf '"ok"\n[1,2]\n' | "$dcp" tokenize --tokenizer-path "$v3" --jsonl >"$out" 2>"$err"
  check "--jsonl: a line that is not a string fails naming it" stderr_has "--jsonl: stdin line 2 must be a JSON string"
  printf '[1]\n[-1]\n' | "$dcp" tokenize --tokenizer-path "$v3" --jsonl --decode >"$out" 2>"$err"
  check "--jsonl --decode: names the line and the legal ids" stderr_has "--jsonl: stdin line 2: -1 is not a token id in \[0, "
  # --chat --jsonl: a conversation a line (a list of messages, or an object of variables)
  local chats='[{"role": "user", "content": "Hi"}]
{"messages": [{"role": "user", "content": "a\nb"}], "add_generation_prompt": false}'
  printf '%s\n' "$chats" | "$dcp" tokenize --tokenizer-path "$v3" --chat --jsonl --add-generation-prompt --print-prompt >"$out" 2>"$err"
  check "--chat --jsonl --print-prompt: each prompt as a JSON string" [ "$(cat "$out")" = "$(printf '"<s><|user|>Hi<|assistant|>"\n"<s><|user|>a\\nb"')" ]
  printf '%s\n' "$chats" | "$dcp" tokenize --tokenizer-path "$v3" --chat --jsonl --add-generation-prompt >"$out" 2>"$err"
  check "--chat --jsonl: a conversation's ids as alone" [ "$(sed -n 1p "$out")" = "$(printf '%s' "$chats" | sed -n 1p | "$dcp" tokenize --tokenizer-path "$v3" --chat --add-generation-prompt)" ]
  check "--chat --jsonl: its own add_generation_prompt kept" [ "$(sed -n 2p "$out")" = "$(printf '%s' "$chats" | sed -n 2p | "$dcp" tokenize --tokenizer-path "$v3" --chat --add-generation-prompt)" ]
  printf '[]\n3\n' | "$dcp" tokenize --tokenizer-path "$v3" --chat --jsonl >"$out" 2>"$err"
  check "--chat --jsonl: a line that is not a conversation fails naming it" stderr_has "--jsonl: stdin line 2: chat input must be a list of messages or an object with 'messages'"
  # --chat-template FILE: the file's template instead of tokenizer_config.json's
  printf '{%% for m in messages %%}[{{ m.role }}] {{ m.content }}|{%% endfor %%}{%% if add_generation_prompt %%}[assistant]{%% endif %%}' >"$tmp/template.jinja"
  echo '[{"role": "user", "content": "Hi"}]' | "$dcp" tokenize --tokenizer-path "$v3" --chat --chat-template "$tmp/template.jinja" --add-generation-prompt --print-prompt >"$out" 2>"$err"
  check "--chat-template: the file's template renders" [ "$(cat "$out")" = "[user] Hi|[assistant]" ]
  echo '[]' | "$dcp" tokenize --tokenizer-path "$v3" --chat --chat-template "$tmp/none.jinja" >"$out" 2>"$err"
  check "--chat-template: a missing file is named" stderr_has "--chat-template: cannot read '$tmp/none.jinja'"
  printf '{%% if messages %%}open' >"$tmp/unclosed.jinja"
  echo '[]' | "$dcp" tokenize --tokenizer-path "$v3" --chat --chat-template "$tmp/unclosed.jinja" >"$out" 2>"$err"
  check "--chat-template: a template that does not parse is refused naming the flag" stderr_has "--chat-template: chat template line 1: "
  expect 2 "--chat-template without --chat" -- tokenize --tokenizer-path "$v3" --chat-template "$tmp/template.jinja"
  check "names --chat" stderr_has "--chat-template requires --chat"
  expect 2 "gen-checkpoint, unknown family" -- gen-checkpoint --family llama --out "$tmp/x"
  check "names the flag and the families" stderr_has "--family: 'llama' is not one of: deepseek-v2-lite, deepseek-v2, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight"
  expect 2 "gen-checkpoint, --family with --preset" -- gen-checkpoint --family kimi-k2 --preset tiny --out "$tmp/x"
}

# flags: no empty value or list item taken as "not given", no contradictory pair run silently,
# output files that cannot be written refused before any work
case_strict_flags() {
  bad_value "empty --json" "--json: an empty value is not allowed" -- run --json ""
  bad_value "empty --prompt-tokens" "--prompt-tokens: an empty value is not allowed" -- run --prompt-tokens ""
  bad_value "empty --model-path" "--model-path: an empty value is not allowed" -- run --model-path ""
  bad_value "empty --contexts of a bench" "--contexts: the list is empty" -- bench attention --contexts ""
  bad_value "an empty token id" "prompt 1 has an empty item ('1,,2')" -- run --prompt-tokens "1,,2"
  bad_value "a trailing comma" "prompt 1 has an empty item ('1,2,')" -- run --prompt-tokens "1,2,"
  bad_value "an empty prompt" "prompt 2 is an empty prompt" -- run --prompt-tokens "1,2;;3"
  printf '1,2\n\n3\n' >"$tmp/prompts.txt"
  bad_value "an empty line of a prompt file" "prompts.txt line 2 is an empty prompt" -- run --prompt-tokens "$tmp/prompts.txt"
  bad_value "an empty list item" "--contexts: an empty item in '1024,,2048'" -- bench attention --contexts 1024,,2048
  bad_value "--model-path with --preset" "--model-path excludes --preset" -- run --model-path "$tmp/x" --preset tiny
  bad_value "--prompt-tokens with --batch" "--batch excludes --prompt-tokens" -- run --prompt-tokens 1,2 --batch 2
  bad_value "--prompt-tokens with --prompt-len" "--prompt-len excludes --prompt-tokens" -- run --prompt-tokens 1,2 --prompt-len 9
  bad_value "--speculative-draft alone" "--speculative-draft requires --speculative-num-draft-tokens" -- run --speculative-draft target:1
  bad_value "--prefill-dcp-size alone" "--prefill-dcp-size requires --disaggregate" -- run --prefill-dcp-size 2
  bad_value "--json and --dump-logits on one file" "--json and --dump-logits name the same file" -- run --json "$tmp/same" --dump-logits "$tmp/./same"
  bad_value "--json on a full device" "--json: cannot write '/dev/full': No space left on device" -- run --json /dev/full
  bad_value "--json on a kernel file" "--json: cannot write '/proc/version': a kernel interface file" -- run --json /proc/version
  bad_value "--dump-logits on a full device" "--dump-logits: cannot write '/dev/full'" -- run --dump-logits /dev/full
}

# the published geometries at full width as synthetic presets, and one MoE layer's benchmark
case_presets() {
  expect 0 "run deepseek-v2-lite, 2 layers (one MoE)" -- run --preset deepseek-v2-lite --num-layers 2 --tp-size 2 --dcp-size 2 --batch 2 --prompt-len 30 --max-new-tokens 3 --json "$tmp/run.json"
  check "deepseek-v2-lite verifies" json_has '"passed": true'
  check "deepseek-v2-lite holds bf16 weights" json_has '"dtype": "bf16"'
  expect 0 "bench moe (small)" -- bench moe --batches 1,2 --threads 1 --dtypes fp8,int4 --repeats 1 --cache warm --csv "$tmp/moe.csv"
  # DeepSeek-V2-Lite routes each token to 6 of its 64 experts.
  check "bench moe: one token runs 6 experts" grep -q '^deepseek-v2-lite,fp8,1,1,6,' "$tmp/moe.csv"
  check "bench moe: two tokens run 6 to 12" grep -qE '^deepseek-v2-lite,fp8,1,2,([6-9]|1[0-2]),' "$tmp/moe.csv"
  check "bench moe: INT4 experts run" grep -q '^deepseek-v2-lite,int4,1,1,6,' "$tmp/moe.csv"
  bad_value "bench moe, a preset without experts" "--preset: 'tiny' is not one of: deepseek-v2-lite, deepseek-v3, kimi-k2, kimi-k2-thinking, moonlight" -- bench moe --preset tiny
  bad_value "bench moe, unknown dtype" "--dtypes" -- bench moe --dtypes fp16
  # Over two ranks: the TP-sliced layer sends only the all-reduce (2 ranks x 2048 floats); the
  # expert-parallel one also sends, per entry for the other rank, its row with the expert id out
  # (2049 x 4 bytes) and the output back (2048 x 4).
  expect 0 "bench moe, TP-sliced vs EP" -- bench moe --ranks 2 --ep-sizes 1,2 --batches 1 --dtypes fp8 --repeats 1 --cache warm --csv "$tmp/moe_ep.csv"
  check "bench moe: TP-sliced sends the all-reduce only" grep -qE '^deepseek-v2-lite,fp8,2,1,1,[^,]+,16384,0,' "$tmp/moe_ep.csv"
  check "bench moe: EP sends whole entries" awk -F, '$4 == 2 { found = 1; if ($8 % 16388 != 0 || $8 > 6 * 16388) exit 1 } END { exit !found }' "$tmp/moe_ep.csv"
  bad_value "bench moe, ep without ranks" "--ep-sizes 2 needs --ranks > 1" -- bench moe --ep-sizes 2
  bad_value "bench moe, ep not dividing the ranks" "--ep-sizes: 3 must divide --ranks 2" -- bench moe --ranks 2 --ep-sizes 3 --dtypes fp8
  bad_value "bench moe, threads with ranks" "--threads 2 with --ranks > 1" -- bench moe --ranks 2 --threads 2
}

# `dcp serve`'s refusals, before anything listens: each names its flag
case_serve_flags() {
  bad_value "a port past 65535" "--port" -- serve --port 70000
  expect 1 "a tokenizer folder that is not one" -- serve --preset tiny --tokenizer-path "$tmp/none" --port 0
  check "names --tokenizer-path" stderr_has "--tokenizer-path: tokenizer directory $tmp/none has none of tokenizer.json, tiktoken.model and tokenizer.model"
  expect 0 "gen-checkpoint" -- gen-checkpoint --out "$tmp/ck"
  bad_value "--max-queued-requests 0" "--max-queued-requests" -- serve --model-path "$tmp/ck" --max-queued-requests 0
  bad_value "an empty --api-key" "--api-key: must not be empty" -- serve --model-path "$tmp/ck" --api-key "" --port 0
  expect 2 "--chat-template with no tokenizer" -- serve --preset tiny --chat-template "$tmp/ck/config.json" --port 0
  check "says it needs a tokenizer" stderr_has "--chat-template needs a tokenizer: --tokenizer-path, or a --model-path that has one"
  printf '{{ messages' >"$tmp/broken.jinja"
  expect 2 "--chat-template that does not parse" -- serve --model-path "$tmp/ck" --chat-template "$tmp/broken.jinja" --port 0
  check "refused before serving, naming the flag" stderr_has "^dcp: error: --chat-template: chat template line 1: "
  # A port in use: exit 1 naming --port, before the model loads.
  /usr/bin/python3 -c 'import socket,time; s=socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(); print(s.getsockname()[1], flush=True); time.sleep(30)' >"$tmp/port" &
  local holder=$!
  for _ in $(seq 1 50); do [ -s "$tmp/port" ] && break; sleep 0.1; done
  expect 1 "a port in use" -- serve --model-path "$tmp/ck" --port "$(cat "$tmp/port")"
  check "names --host and --port" stderr_has "--host 127.0.0.1 --port $(cat "$tmp/port"): cannot listen there"
  kill "$holder" 2>/dev/null
  bad_value "--seed is not a serve flag" "--seed" -- serve --model-path "$tmp/ck" --seed 3
  bad_value "--max-model-len past the model's" "--max-model-len 200000 passes the model's context, max_position_embeddings = 163840 (legal: 1 to 163840)" -- serve --model-path "$tmp/ck" --max-model-len 200000 --port 0
  bad_value "--max-model-len 0" "--max-model-len" -- serve --model-path "$tmp/ck" --max-model-len 0 --port 0
  bad_value "serve, --pcp-size 2" "--pcp-size 2: prefill context parallelism is not implemented" -- serve --pcp-size 2 --port 0
}

# layouts `dcp topology` describes but this build cannot run are refused at startup (exit 2)
case_run_not_here() {
  bad_value "--pcp-size 2" "--pcp-size 2: prefill context parallelism is not implemented by the deployment (legal: 1)" -- run --pcp-size 2 --dcp-size 1
  bad_value "--platform blackwell-mnnvl" "--platform 'blackwell-mnnvl' cannot run in this build" -- run --platform blackwell-mnnvl
  bad_value "--platform cuda" "(legal: cpu)" -- run --platform cuda --disaggregate
  expect 0 "topology still describes them" -- topology --tp-size 4 --dcp-size 4 --platform blackwell-mnnvl
}

cases="topology demo run_summary run_rejected run_combine run_refusals run_checkpoint run_speculative run_extend run_prefix_cache plan bench_comm bench_attention bench_merge bench_guide bench_serve bench_step_engine run_dp run_dp_attention run_kernel run_interleave run_disagg bad_values output_files memory_limits bench_plot families presets strict_flags serve_flags run_not_here"
if [ "$case_name" = "--list" ]; then
  echo "$cases"
  exit 0
fi
if ! declare -F "case_$case_name" >/dev/null || [ -z "$dcp" ]; then
  echo "usage: test_cli.sh CASE path/to/dcp [path/to/bench_kernels]; cases: $cases" >&2
  exit 2
fi
"case_$case_name"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
