#!/usr/bin/env bash
# The shipped monitoring against a live local cluster (ctest: monitoring_test):
# starts the cluster of deploy/local/serve.sh on free loopback ports (logs in
# BUILD/monitoring_test/cluster/), Debian's Prometheus through
# deploy/prometheus/monitor.sh (the shipped prometheus.yml and alert rules,
# targets from the daemons' LISTENING lines, scraped every second), and then:
#   - promtool check config / check rules / test rules (every alert fires on
#     synthetic series, ringlane-alerts.test.yml);
#   - one HTTP completion, one gRPC generation, and one greedy generation that
#     the loop watchdog flags;
#   - check.mjs healthy: every target up, ringlane series stored per job, every
#     alert rule evaluated, its input and its whole expression as expected, the
#     Grafana dashboard parsed and each panel query naming exported series;
#   - the kvstore killed: its two alerts' expressions return data and Prometheus
#     has them pending; rank 1 killed: the same for the worker alerts.
# Always stops what it started.
#
#   tests/monitoring/run.sh [BUILD]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT="$BUILD/monitoring_test"
LOGS="$OUT/cluster"
RUN="$OUT/prometheus"
PROMDIR="$ROOT/deploy/prometheus"

die() { echo "monitoring: $*" >&2; exit 1; }
for t in prometheus promtool node curl; do
  command -v "$t" >/dev/null 2>&1 || die "$t not found (tools/install_deps.sh)"
done
for b in worker/ringlane-worker router/ringlane-router kvstore/ringlane-kvstore tools/ringlane-generate-client; do
  [ -x "$BUILD/$b" ] || die "$BUILD/$b not built"
done

echo "== promtool" >&2
promtool check rules "$PROMDIR/ringlane-alerts.yml"
(cd "$PROMDIR" && promtool test rules ringlane-alerts.test.yml)

rm -rf "$OUT"
mkdir -p "$LOGS" "$RUN"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits up to 60 s for a line matching $2 in file $1 and prints it.
wait_line() {
  local f=$1 re=$2 pid=$3
  for _ in $(seq 1 600); do
    if grep -m1 -E "$re" "$f" 2>/dev/null; then return 0; fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

(cd "$ROOT" && BUILD="$BUILD" LOGS="$LOGS" CERTS="$OUT/certs" PORT0=0 PORT1=0 \
  ROUTER_LISTEN=127.0.0.1:0 HTTP_LISTEN=127.0.0.1:0 KVSTORE_LISTEN=127.0.0.1:0 \
  exec deploy/local/serve.sh </dev/null >"$OUT/serve.out" 2>"$OUT/serve.log") &
serve=$!
pids+=("$serve")
base=$(wait_line "$OUT/serve.out" '^http://' "$serve") ||
  { cat "$OUT/serve.log" >&2; die "the cluster did not start"; }
http=${base#http://}; http=${http%/v1}
router=$(sed -n 's/^LISTENING router=//p' "$LOGS/router.out")
echo "monitoring: cluster at $base (logs in $LOGS/)" >&2

# A free port for Prometheus (it cannot report one it picked itself).
port=$(node -e 'const s=require("net").createServer().listen(0,"127.0.0.1",()=>{console.log(s.address().port);s.close()})')
PROM_URL="http://127.0.0.1:$port"
(cd "$ROOT" && BUILD="$BUILD" LOGS="$LOGS" RUN="$RUN" PROM_LISTEN="127.0.0.1:$port" SCRAPE_INTERVAL=1s \
  exec deploy/prometheus/monitor.sh >"$OUT/monitor.out" 2>"$OUT/monitor.log") &
pids=("$!" "${pids[@]}")
wait_line "$OUT/monitor.out" '^http://' "${pids[0]}" >/dev/null || { cat "$OUT/monitor.log" >&2; die "monitor.sh did not start"; }
promtool check config "$RUN/prometheus.yml"
for _ in $(seq 1 100); do
  curl -fs "$PROM_URL/-/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fs "$PROM_URL/-/ready" >/dev/null || { tail "$RUN/prometheus.log" >&2; die "Prometheus not ready"; }

echo "== traffic" >&2
curl -fsS "$base/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Once upon a time, there was a little girl named Lily who loved to play", "max_tokens": 24}' >/dev/null
"$BUILD/tools/ringlane-generate-client" --router="$router" --prompt="Once upon a time" --max_tokens=16 >/dev/null
export PROM_URL
node "$HERE/check.mjs" scraped
# The bundled model's greedy "Tom" loops after about 360 tokens (README: the loop watchdog).
curl -fsS "$base/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Tom", "max_tokens": 480, "temperature": 0}' >/dev/null
# Read whole before grep: `grep -q` exits at the first match and, with
# pipefail, curl's failed write would fail the check it passed.
metrics=$(curl -fsS "http://$http/metrics")
grep -Eq '^ringlane_loops_detected_total\{[^}]*\} [1-9]' <<<"$metrics" ||
  die "the looping generation was not flagged"

metrics="http://$http/metrics"
for f in "$LOGS"/rank*.out "$LOGS/kvstore.out"; do
  metrics+=" http://$(sed -n 's/^LISTENING metrics=//p' "$f")/metrics"
done
export DASHBOARD="$ROOT/deploy/grafana/ringlane.json" METRICS_URLS="$metrics"

echo "== healthy cluster" >&2
node "$HERE/check.mjs" healthy

# The daemons are children of serve.sh; kill them by id, found by their flags.
child() {
  local c
  for c in $(ps -o pid= --ppid "$serve"); do
    if tr '\0' ' ' </proc/"$c"/cmdline 2>/dev/null | grep -q -- "$1"; then echo "$c"; return 0; fi
  done
  return 1
}
echo "== kvstore killed" >&2
kv=$(child ringlane-kvstore) || die "no kvstore child of serve.sh"
kill -KILL "$kv"
# A prompt with full blocks, so the workers try to offload to the dead store.
curl -fsS "$base/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Lily and Ben went to the park to play with the big red ball and the dog", "max_tokens": 40}' >/dev/null
node "$HERE/check.mjs" kvstore-down

echo "== rank 1 killed" >&2
r1=$(child -- '--rank=1') || die "no rank 1 child of serve.sh"
kill -KILL "$r1"
node "$HERE/check.mjs" worker-down
echo "monitoring: PASSED" >&2
