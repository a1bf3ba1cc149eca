#!/usr/bin/env bash
# Time to first token of one long prompt (a benchmark, not a test; issue 14):
# cold, from the device pool, from the kvstore's DRAM tier after the pool
# evicted it, and from its disk tier after the kvstore restarted, in one run
# on one local cluster (a kvstore, one worker of a synthetic model, the
# router). Each figure is the median of REPEATS requests of max_tokens 1,
# timed by curl; between phases two other long prompts evict the first from
# a pool sized for little more than one. Prints a table and the ratios to cold.
#
#   tools/kvstore_bench.sh [BUILD] [PROMPT_WORDS] [REPEATS]    e.g. tools/kvstore_bench.sh build 2400 3
set -euo pipefail
BUILD=${1:-build}
WORDS=${2:-2400}
REPEATS=${3:-3}
OUT=${OUT:-$BUILD/kvstore-bench}
rm -rf "$OUT"
mkdir -p "$OUT"
MODEL="$OUT/model"
# A synthetic Llama with GQA (hidden 512, 8 layers, 2 KV heads) and the
# bundled tokenizer's 512-token vocabulary; bf16 KV.
"$BUILD/tools/ringlane-synth-model" --preset=tiny --hidden=512 --intermediate=1408 --layers=8 \
  --heads=8 --kv_heads=2 --vocab=512 --max_position=8192 --out="$MODEL" >/dev/null

BENCH=kvstore_bench
# shellcheck source=tools/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
start_kvstore() {
  "$BUILD/kvstore/ringlane-kvstore" --listen="${1:-127.0.0.1:0}" --disk_dir="$OUT/store" \
    --dram_bytes=$((512 << 20)) --disk_bytes=$((4 << 30)) >"$OUT/kvstore.out" 2>>"$OUT/kvstore.log" &
  kv_pid=$!
  pids+=("$kv_pid")
  kvstore=$(listening "$OUT/kvstore.out" kvstore)
}
start_kvstore
# Blocks of 16: a 2400-word prompt is about 3,000 tokens, 190 blocks; the pool
# holds 260, so the next long prompt evicts most of it.
"$BUILD/worker/ringlane-worker" --model="$MODEL" --threads=2 --kv_blocks=260 --block_size=16 \
  --kv_dtype=bf16 --listen=127.0.0.1:0 --kvstore="$kvstore" --kvstore_deadline_ms=5000 \
  >"$OUT/worker.out" 2>"$OUT/worker.log" &
pids+=($!)
worker=$(listening "$OUT/worker.out" worker)
"$BUILD/router/ringlane-router" --workers="$worker" \
  --tokenizer=deploy/models/stories260K/tok512.bin --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --kvstore_restore_deadline_ms=10000 --round_token_budget=2048 --itl_target_ms=0 ${ROUTER_FLAGS:-} \
  >"$OUT/router.out" 2>"$OUT/router.log" &
pids+=($!)
http=$(listening "$OUT/router.out" http)
wait_ready
prompt() { prompt_body "$1" "$WORDS" model; }
prompt 2 >"$OUT/q.json"
prompt 3 >"$OUT/r.json"
evict() { ask "$OUT/q.json" >/dev/null; ask "$OUT/r.json" >/dev/null; }

declare -A t c
phase() {  # name, then the command that readies each repeat
  local name=$1 prep=$2 times=() line
  for i in $(seq "$REPEATS"); do
    $prep
    line=$(ask "$OUT/p.json")
    times+=("${line%% *}")
    c[$name]=$(echo "$line" | cut -d' ' -f2-)
  done
  t[$name]=$(printf '%s\n' "${times[@]}" | median)
  echo "kvstore_bench: $name ${t[$name]} s (cached/prompt tokens ${c[$name]})" >&2
}
# Cold: each repeat a prompt of its own, never seen; then p once, untimed,
# so that it is in the pool and the store.
n=0
cold_prep() { n=$((n + 1)); prompt $((100 + n)) >"$OUT/p.json"; }
phase cold cold_prep
prompt 1 >"$OUT/p.json"
ask "$OUT/p.json" >/dev/null
phase device :
phase dram evict
disk_prep() {
  kill -TERM "$kv_pid"; wait "$kv_pid" 2>/dev/null || true  # DRAM is written to disk
  start_kvstore "$kvstore"
  evict
}
phase disk disk_prep
{
  echo "| time to first token | seconds (median of $REPEATS) | of cold | cached / prompt tokens |"
  echo "|---|---:|---:|---:|"
  for n in cold device dram disk; do
    printf '| %s | %s | %.3f | %s |\n' "$n" "${t[$n]}" "$(echo "${t[$n]} / ${t[cold]}" | bc -l)" "${c[$n]// / \/ }"
  done
} | tee "$OUT/report.md"
