#!/usr/bin/env bash
# Starts two ringlane-worker ranks as one TP2 group on loopback and drives it
# with the command-line generator (what `make serve` runs until the router
# exists). The workers stop when the generator exits.
#
#   deploy/local/serve_tp2.sh [PROMPT]     (BUILD, MODEL, TOKENIZER, THREADS from the env)
set -euo pipefail

BUILD=${BUILD:-build}
MODEL=${MODEL:-deploy/models/stories260K/stories260K.bin}
TOKENIZER=${TOKENIZER:-deploy/models/stories260K/tok512.bin}
THREADS=${THREADS:-1}  # per rank
PROMPT=${1:-}
LOGS="$BUILD/serve"
WORKER="$BUILD/worker/ringlane-worker"
mkdir -p "$LOGS"

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits for "LISTENING worker=HOST:PORT" in $1 (stdout of process $2).
listening() {
  local out=$1 pid=$2
  for _ in $(seq 1 600); do
    if grep -q '^LISTENING worker=' "$out" 2>/dev/null; then
      sed -n 's/^LISTENING worker=//p' "$out" | head -n1
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "serve: worker exited; its log:" >&2
      cat "${out%.out}.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "serve: worker did not start within 60 s; see ${out%.out}.log" >&2
  return 1
}

# Ranks listen on their default ports (50061 + rank); PORT0/PORT1=0 picks free ones.
common=(--model="$MODEL" --world_size=2 --threads="$THREADS" --group=local --metrics_port=0)
"$WORKER" "${common[@]}" --rank=0 --listen="127.0.0.1:${PORT0:-50061}" \
  >"$LOGS/rank0.out" 2>"$LOGS/rank0.log" &
pids+=($!)
rank0=$(listening "$LOGS/rank0.out" "${pids[0]}")
"$WORKER" "${common[@]}" --rank=1 --rendezvous="$rank0" --listen="127.0.0.1:${PORT1:-50062}" \
  >"$LOGS/rank1.out" 2>"$LOGS/rank1.log" &
pids+=($!)
rank1=$(listening "$LOGS/rank1.out" "${pids[1]}")
echo "serve: TP2 worker group 'local': rank 0 at $rank0, rank 1 at $rank1" \
     "(metrics: $(sed -n 's/^LISTENING metrics=//p' "$LOGS"/rank*.out | tr '\n' ' ')); logs in $LOGS/" >&2

args=(--workers="$rank0,$rank1" --model="$MODEL" --tokenizer="$TOKENIZER")
if [ -n "$PROMPT" ]; then args+=(--prompt="$PROMPT"); fi
"$BUILD/tools/ringlane-generate" "${args[@]}"
