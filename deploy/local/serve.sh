#!/usr/bin/env bash
# The local cluster of `make serve`: two ringlane-worker ranks as one TP2
# group, a ringlane-kvstore beside them (DRAM tier plus a disk tier in
# $KVSTORE_DIR, on $KVSTORE_LISTEN, 127.0.0.1:50071, which the workers offload
# full KV blocks to and the router restores evicted prefixes from) and a ringlane-router in front of them, all on loopback: the
# OpenAI-compatible API on http://$HTTP_LISTEN/v1 (127.0.0.1:8080, printed as
# the base URL) and the gRPC Generate API on $ROUTER_LISTEN (127.0.0.1:50051).
# With PROMPT it runs the
# gRPC client once and stops everything (a smoke test); without, it runs the
# client on stdin lines when stdin is a terminal, then keeps serving until
# Ctrl-C, which stops every process it started. Workers and router talk over
# mutual TLS with certificates that tools/make_certs.sh keeps in $CERTS
# (made on the first run; TLS=off for plaintext).
#
#   deploy/local/serve.sh [PROMPT]
#   (BUILD, MODEL, TOKENIZER, THREADS, ROUTER_LISTEN, HTTP_LISTEN, KVSTORE_LISTEN, KVSTORE_DIR,
#    LOGS, CERTS, TLS, WORLD (2, or 1 for one rank) from the env)
set -euo pipefail

BUILD=${BUILD:-build}
MODEL=${MODEL:-deploy/models/stories260K/stories260K.bin}
TOKENIZER=${TOKENIZER:-deploy/models/stories260K/tok512.bin}
THREADS=${THREADS:-1}  # per rank
WORLD=${WORLD:-2}
if [ "$WORLD" != 1 ] && [ "$WORLD" != 2 ]; then
  echo "serve: WORLD must be 1 or 2, got $WORLD" >&2
  exit 2
fi
ROUTER_LISTEN=${ROUTER_LISTEN:-127.0.0.1:50051}
HTTP_LISTEN=${HTTP_LISTEN:-127.0.0.1:8080}
PROMPT=${1:-}
LOGS=${LOGS:-$BUILD/serve}
WORKER="$BUILD/worker/ringlane-worker"
ROUTER="$BUILD/router/ringlane-router"
KVSTORE="$BUILD/kvstore/ringlane-kvstore"
KVSTORE_LISTEN=${KVSTORE_LISTEN:-127.0.0.1:50071}
CLIENT="$BUILD/tools/ringlane-generate-client"
CERTS=${CERTS:-$BUILD/certs}
TLS=${TLS:-on}
# Speculative decoding's draft sources (the router's --spec_drafters; none = off).
SPEC_DRAFTERS=${SPEC_DRAFTERS:-ngram,suffix}
KVSTORE_DIR=${KVSTORE_DIR:-$LOGS/kvstore}
mkdir -p "$LOGS"

tls=()
if [ "$TLS" != off ]; then
  "$(dirname "$0")/../../tools/make_certs.sh" "$CERTS"
  tls=(--tls_ca="$CERTS/ca.pem" --tls_cert="$CERTS/node.pem" --tls_key="$CERTS/node.key")
fi

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits for "LISTENING $3=HOST:PORT" in $1 (stdout of process $2).
listening() {
  local out=$1 pid=$2 name=$3
  for _ in $(seq 1 600); do
    if grep -q "^LISTENING $name=" "$out" 2>/dev/null; then
      sed -n "s/^LISTENING $name=//p" "$out" | head -n1
      return 0
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "serve: $name exited; its log:" >&2
      cat "${out%.out}.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "serve: $name did not start within 60 s; see ${out%.out}.log" >&2
  return 1
}

# The kvstore first: the workers dial it (lazily) at start.
"$KVSTORE" --listen="$KVSTORE_LISTEN" --metrics_port=0 --disk_dir="$KVSTORE_DIR" \
  --dram_bytes=$((256 << 20)) --disk_bytes=$((2 << 30)) "${tls[@]}" \
  >"$LOGS/kvstore.out" 2>"$LOGS/kvstore.log" &
pids+=($!)
kvstore=$(listening "$LOGS/kvstore.out" "${pids[0]}" kvstore)

# Ranks listen on their default ports (50061 + rank); PORT0/PORT1=0 picks free ones.
common=(--model="$MODEL" --world_size="$WORLD" --threads="$THREADS" --group=local
  --metrics_port=0 --kvstore="$kvstore" "${tls[@]}")
"$WORKER" "${common[@]}" --rank=0 --listen="127.0.0.1:${PORT0:-50061}" \
  >"$LOGS/rank0.out" 2>"$LOGS/rank0.log" &
pids+=($!)
rank0=$(listening "$LOGS/rank0.out" "${pids[1]}" worker)
workers=$rank0
group="TP1 group: rank 0 $rank0"
if [ "$WORLD" = 2 ]; then
  "$WORKER" "${common[@]}" --rank=1 --rendezvous="$rank0" --listen="127.0.0.1:${PORT1:-50062}" \
    >"$LOGS/rank1.out" 2>"$LOGS/rank1.log" &
  pids+=($!)
  rank1=$(listening "$LOGS/rank1.out" "${pids[2]}" worker)
  workers="$rank0,$rank1"
  group="TP2 group: rank 0 $rank0, rank 1 $rank1"
fi
"$ROUTER" --workers="$workers" --tokenizer="$TOKENIZER" --listen="$ROUTER_LISTEN" \
  --http_listen="$HTTP_LISTEN" --spec_drafters="$SPEC_DRAFTERS" "${tls[@]}" \
  >"$LOGS/router.out" 2>"$LOGS/router.log" &
pids+=($!)
router_pid=${pids[${#pids[@]} - 1]}
router=$(listening "$LOGS/router.out" "$router_pid" router)
http=$(listening "$LOGS/router.out" "$router_pid" http)
# The workers' model id: a directory's name (a llama2.c file's directory's).
if [ -d "$MODEL" ]; then model=$(basename "$MODEL"); else model=$(basename "$(dirname "$MODEL")"); fi
echo "serve: gRPC Generate API at $router ($group$([ "$TLS" != off ] && echo ", mutual TLS with $CERTS")); logs in $LOGS/" >&2
echo "serve: kvstore at $kvstore (blocks in $KVSTORE_DIR; offload and restore on)" >&2
echo "serve: speculative decoding: $SPEC_DRAFTERS (SPEC_DRAFTERS=none turns it off)" >&2
echo "serve: OpenAI API base URL (metrics at http://$http/metrics):" >&2
echo "http://$http/v1"
echo "serve: try  curl http://$http/v1/completions -H 'Content-Type: application/json' \\" >&2
echo "              -d '{\"model\": \"$model\", \"prompt\": \"Once upon a time\", \"max_tokens\": 40}'" >&2
echo "serve:  or  $CLIENT --router=$router --prompt='Once upon a time'" >&2

if [ -n "$PROMPT" ]; then
  exec_rc=0
  "$CLIENT" --router="$router" --prompt="$PROMPT" || exec_rc=$?
  exit $exec_rc
elif [ -t 0 ]; then
  echo "serve: type a prompt per line (Ctrl-D: keep serving, Ctrl-C: stop)" >&2
  "$CLIENT" --router="$router" || true
fi
echo "serve: serving at $router until Ctrl-C" >&2
wait "$router_pid"
