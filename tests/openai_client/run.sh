#!/usr/bin/env bash
# The real `openai` npm client against a local ringlane cluster: starts the
# cluster of deploy/local/serve.sh (two worker ranks as one TP2 group and a
# router with its OpenAI gateway) on free loopback ports, with its own logs in
# BUILD/openai_client_test/ so that it never clashes with `make serve`;
# installs the pinned client (npm ci) when node_modules is missing or older
# than package-lock.json; runs `node --test`; always stops the cluster.
#
#   tests/openai_client/run.sh [BUILD]      (BUILD defaults to build; ctest: openai_client_test)
#   (MODEL, TOKENIZER, THREADS from the env, as serve.sh)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
MODEL=${MODEL:-$ROOT/deploy/models/stories260K/stories260K.bin}
TOKENIZER=${TOKENIZER:-$ROOT/deploy/models/stories260K/tok512.bin}
THREADS=${THREADS:-1}  # per rank
WORKER="$BUILD/worker/ringlane-worker"
ROUTER="$BUILD/router/ringlane-router"
KVSTORE="$BUILD/kvstore/ringlane-kvstore"
LOGS="$BUILD/openai_client_test"

die() { echo "openai_client: $*" >&2; exit 1; }

# Node.js and npm come from tools/install_deps.sh; without them this test fails
# rather than skips.
command -v node >/dev/null 2>&1 ||
  die "node not found: run tools/install_deps.sh (installs nodejs and npm)"
command -v npm >/dev/null 2>&1 ||
  die "npm not found: run tools/install_deps.sh (installs nodejs and npm)"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 18 ] || die "node $(node --version) is too old (the openai client needs 20+)"
for b in "$WORKER" "$ROUTER" "$KVSTORE"; do
  [ -x "$b" ] || die "$b not built (cmake --build $BUILD --target ringlane-worker ringlane-router ringlane-kvstore)"
done

# The client, as pinned by package-lock.json. npm ci refreshes
# node_modules/.package-lock.json, so it is the stamp of the last install.
if [ ! -f "$HERE/node_modules/.package-lock.json" ] ||
   [ "$HERE/package-lock.json" -nt "$HERE/node_modules/.package-lock.json" ]; then
  echo "openai_client: npm ci in tests/openai_client" >&2
  (cd "$HERE" && npm ci --no-audit --no-fund --prefer-offline --loglevel=error) >&2 ||
    die "npm ci failed (the npm registry or its cache is needed once)"
fi

rm -rf "$LOGS"
mkdir -p "$LOGS"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The cluster of `make serve` on free ports; it prints the base URL first.
(cd "$ROOT" && BUILD="$BUILD" MODEL="$MODEL" TOKENIZER="$TOKENIZER" THREADS="$THREADS" \
  LOGS="$LOGS" PORT0=0 PORT1=0 ROUTER_LISTEN=127.0.0.1:0 HTTP_LISTEN=127.0.0.1:0 KVSTORE_LISTEN=127.0.0.1:0 \
  exec deploy/local/serve.sh </dev/null >"$LOGS/serve.out" 2>"$LOGS/serve.log") &
pids+=($!)
base=""
for _ in $(seq 1 600); do
  base=$(grep -m1 '^http://' "$LOGS/serve.out" 2>/dev/null || true)
  [ -n "$base" ] && break
  kill -0 "${pids[0]}" 2>/dev/null || { cat "$LOGS/serve.log" >&2; die "the cluster did not start"; }
  sleep 0.1
done
[ -n "$base" ] || die "the cluster did not start within 60 s; see $LOGS/serve.log"
export RINGLANE_BASE_URL="$base"
echo "openai_client: cluster at $RINGLANE_BASE_URL (logs in $LOGS/)" >&2

# In the background so that a TERM (ctest's timeout) stops the cluster at once.
(cd "$HERE" && exec node --test --test-reporter=spec openai_client.test.mjs) &
pids=("$!" "${pids[@]}")
rc=0
wait "${pids[0]}" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "openai_client: FAILED (rc $rc); cluster logs in $LOGS/" >&2
  # The router log's tail helps when the failure is on the server side.
  tail -n 20 "$LOGS/router.log" >&2 || true
fi
exit "$rc"
