# Sourced by the benchmark scripts (soak.sh, ab_stack.sh, peer_bench.sh): a
# local TP2 cluster of one model, two worker ranks and the router on free
# loopback ports (start_cluster), or one worker of THREADS threads and the
# router (start_single). The caller sets MODEL and TOKENIZER; the daemons' pids go into the
# array `pids` (names into `names`), the gateway's host:port into `http`.
pids=()
names=()
http=
stop_cluster() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
  names=()
}
wait_listening() {  # stdout file, name
  for _ in $(seq 1 600); do
    if grep -q "^LISTENING $2=" "$1" 2>/dev/null; then sed -n "s/^LISTENING $2=//p" "$1"; return; fi
    sleep 0.1
  done
  echo "$(basename "$0"): $2 did not start; see ${1%.out}.log" >&2
  exit 1
}
start_cluster() {  # build directory, directory for the daemons' output and logs
  local build=$1 dir=$2 w0 w1
  mkdir -p "$dir"
  "$build/worker/ringlane-worker" --model="$MODEL" --threads=1 --rank=0 --world_size=2 \
    --listen=127.0.0.1:0 >"$dir/worker0.out" 2>"$dir/worker0.log" &
  pids+=($!); names+=(worker0)
  w0=$(wait_listening "$dir/worker0.out" worker)
  "$build/worker/ringlane-worker" --model="$MODEL" --threads=1 --rank=1 --world_size=2 \
    --listen=127.0.0.1:0 --rendezvous="$w0" >"$dir/worker1.out" 2>"$dir/worker1.log" &
  pids+=($!); names+=(worker1)
  w1=$(wait_listening "$dir/worker1.out" worker)
  "$build/router/ringlane-router" --workers="$w0,$w1" --tokenizer="$TOKENIZER" \
    --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 >"$dir/router.out" 2>"$dir/router.log" &
  pids+=($!); names+=(router)
  http=$(wait_listening "$dir/router.out" http)
}
start_single() {  # build directory, directory for the daemons' output and logs
  local build=$1 dir=$2 w0
  mkdir -p "$dir"
  "$build/worker/ringlane-worker" --model="$MODEL" --threads="${THREADS:-2}" \
    --listen=127.0.0.1:0 >"$dir/worker0.out" 2>"$dir/worker0.log" &
  pids+=($!); names+=(worker0)
  w0=$(wait_listening "$dir/worker0.out" worker)
  "$build/router/ringlane-router" --workers="$w0" --tokenizer="$TOKENIZER" \
    --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 >"$dir/router.out" 2>"$dir/router.log" &
  pids+=($!); names+=(router)
  http=$(wait_listening "$dir/router.out" http)
}
