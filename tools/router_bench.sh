#!/usr/bin/env bash
# Runs ringlane-router-bench (time to first token cold/warm, inter-token gaps
# with and without a long prompt arriving) on a local cluster of one worker
# and the router, over a synthetic model with a 4096-token context written
# once to $BUILD/models/synth-long (vocab 512, so the bundled tokenizer fits).
#
#   tools/router_bench.sh          (BUILD, THREADS, PROMPT_TOKENS from the env;
#                                   ROUTER_FLAGS: more router flags, e.g.
#                                   --partial_block_reuse=false; SCENARIOS:
#                                   "ttft itl" by default)
set -euo pipefail
BUILD=${BUILD:-build}
THREADS=${THREADS:-2}
PROMPT_TOKENS=${PROMPT_TOKENS:-3000}
ROUTER_FLAGS=${ROUTER_FLAGS:-}
SCENARIOS=${SCENARIOS:-ttft itl}
MODEL="$BUILD/models/synth-long"
LOGS="$BUILD/router-bench"
mkdir -p "$LOGS"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/tools/ringlane-synth-model" --out="$MODEL" --dtype=bf16 --hidden=512 \
    --intermediate=1408 --layers=8 --heads=8 --kv_heads=2 --vocab=512 --max_position=4096
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
wait_listening() {  # file name
  for _ in $(seq 1 600); do
    if grep -q "^LISTENING $2=" "$1" 2>/dev/null; then sed -n "s/^LISTENING $2=//p" "$1"; return; fi
    sleep 0.1
  done
  echo "router_bench: $2 did not start; see ${1%.out}.log" >&2
  exit 1
}
"$BUILD/worker/ringlane-worker" --model="$MODEL" --threads="$THREADS" --listen=127.0.0.1:0 \
  --kv_blocks=1024 >"$LOGS/worker.out" 2>"$LOGS/worker.log" &
pids+=($!)
worker=$(wait_listening "$LOGS/worker.out" worker)
"$BUILD/router/ringlane-router" --workers="$worker" \
  --tokenizer=deploy/models/stories260K/tok512.bin --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  $ROUTER_FLAGS >"$LOGS/router.out" 2>"$LOGS/router.log" &
pids+=($!)
router=$(wait_listening "$LOGS/router.out" router)
for scenario in $SCENARIOS; do
  "$BUILD/tools/ringlane-router-bench" --router="$router" --scenario="$scenario" \
    --prompt_tokens="$PROMPT_TOKENS"
done
