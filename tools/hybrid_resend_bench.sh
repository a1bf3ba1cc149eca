#!/usr/bin/env bash
# Time to first token of a long prompt on GLM-5.3-Flash's hybrid (glm5_next;
# a benchmark, not a test; issue 19): cold; resent, when it resumes from the
# state checkpoint of its longest cached prefix (the KDA layers' state) with
# the MLA layer's latent rows from the pool; and resent after two other long
# prompts evicted it from the pool and its checkpoints from the ledger, when
# the latent rows, indexer keys and checkpoints come back from the kvstore.
# One local cluster (a kvstore, one worker of the synthetic glm5-next-small,
# the router); each figure is the median of REPEATS requests of max_tokens 1,
# timed by curl.
#
#   tools/hybrid_resend_bench.sh [BUILD] [PROMPT_WORDS] [REPEATS]    e.g. ... build 1200 3
set -euo pipefail
BUILD=${1:-build}
WORDS=${2:-1200}
REPEATS=${3:-3}
OUT=${OUT:-$BUILD/hybrid-bench}
rm -rf "$OUT"
mkdir -p "$OUT"
MODEL="$BUILD/models/glm5-next-small"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/tools/ringlane-synth-model" --preset=glm5-next-small --out="$MODEL" >/dev/null
fi

BENCH=hybrid_resend_bench
# shellcheck source=tools/bench_lib.sh
source "$(dirname "$0")/bench_lib.sh"
"$BUILD/kvstore/ringlane-kvstore" --listen=127.0.0.1:0 --disk_dir="$OUT/store" \
  --dram_bytes=$((1 << 30)) --disk_bytes=$((4 << 30)) >"$OUT/kvstore.out" 2>"$OUT/kvstore.log" &
pids+=($!)
kvstore=$(listening "$OUT/kvstore.out" kvstore)
# A 1200-word prompt is about 1,700 tokens: 106 blocks of 16 and 6 checkpoints
# of 256. The pool holds 160 blocks and the ledger 8 checkpoints, so two other
# such prompts leave none of the first in either.
"$BUILD/worker/ringlane-worker" --model="$MODEL" --threads=2 --block_size=16 --kv_dtype=fp8 \
  --kv_blocks=160 --state_checkpoints=8 --state_checkpoint_interval=256 --kvstore="$kvstore" \
  --kvstore_deadline_ms=5000 --listen=127.0.0.1:0 >"$OUT/worker.out" 2>"$OUT/worker.log" &
pids+=($!)
worker=$(listening "$OUT/worker.out" worker)
"$BUILD/router/ringlane-router" --workers="$worker" \
  --tokenizer=deploy/models/stories260K/tok512.bin --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --kvstore_restore_deadline_ms=10000 --round_token_budget=2048 --itl_target_ms=0 \
  >"$OUT/router.out" 2>"$OUT/router.log" &
pids+=($!)
http=$(listening "$OUT/router.out" http)
wait_ready

prompt() { prompt_body "$1" "$WORDS" glm5-next-small; }
prompt 2 >"$OUT/q.json"
prompt 3 >"$OUT/r.json"
cold=() warm=() store=()
for i in $(seq "$REPEATS"); do
  echo "hybrid_resend_bench: repeat $i/$REPEATS" >&2
  prompt $((100 + i)) >"$OUT/p$i.json"
  line=$(ask "$OUT/p$i.json")
  cold+=("${line%% *}")
  c_cold=${line#* }
  line=$(ask "$OUT/p$i.json")
  warm+=("${line%% *}")
  c_warm=${line#* }
  sleep 1  # the uploads are asynchronous
  ask "$OUT/q.json" >/dev/null
  ask "$OUT/r.json" >/dev/null
  line=$(ask "$OUT/p$i.json")
  store+=("${line%% *}")
  c_store=${line#* }
done
tc=$(printf '%s\n' "${cold[@]}" | median)
tw=$(printf '%s\n' "${warm[@]}" | median)
ts=$(printf '%s\n' "${store[@]}" | median)
{
  echo "| time to first token | seconds (median of $REPEATS) | of cold | cached / prompt tokens |"
  echo "|---|---:|---:|---:|"
  printf '| cold | %s | 1.000 | %s |\n' "$tc" "${c_cold// / \/ }"
  printf '| resent (checkpoint hit in the pool) | %s | %.3f | %s |\n' "$tw" \
    "$(echo "$tw / $tc" | bc -l)" "${c_warm// / \/ }"
  printf '| resent after eviction (from the kvstore) | %s | %.3f | %s |\n' "$ts" \
    "$(echo "$ts / $tc" | bc -l)" "${c_store// / \/ }"
} | tee "$OUT/report.md"
