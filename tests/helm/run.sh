#!/usr/bin/env bash
# Renders deploy/helm/ringlane without helm (ctest: helm_chart_test) and
# validates what comes out:
#   - builds tools/helm_render (Go's text/template + sprig, Debian's Go
#     packages, offline) into BUILD/tools/ringlane-helm-render;
#   - renders values.yaml alone, values-cpu.yaml and values-reference.yaml, and
#     runs validate.mjs on each: every object against kubernetes-models and
#     @kubernetes-models/prometheus-operator (pinned in package-lock.json,
#     installed with npm ci), the wiring between objects, and the daemons'
#     flags, ranks, world size and ports against the binaries in BUILD;
#   - renders that must fail do, with their message (ringNodes that do not
#     match worldSize, a router without API keys that is not allowed to be, an
#     empty collective port range);
#   - a rendering with a port that is not a number fails validation.
#
#   tests/helm/run.sh [BUILD]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT="$BUILD/helm_chart_test"
CHART="$ROOT/deploy/helm/ringlane"
RENDER="$BUILD/tools/ringlane-helm-render"

die() { echo "helm: $*" >&2; exit 1; }
for t in go node npm; do
  command -v "$t" >/dev/null 2>&1 || die "$t not found (tools/install_deps.sh installs golang-go, nodejs, npm)"
done
for b in worker/ringlane-worker router/ringlane-router kvstore/ringlane-kvstore; do
  [ -x "$BUILD/$b" ] || die "$BUILD/$b not built"
done

rm -rf "$OUT"
mkdir -p "$OUT" "$BUILD/tools"
# GOPATH mode over Debian's packaged sources: no module download.
(cd "$ROOT/tools/helm_render" &&
  GO111MODULE=off GOPATH=/usr/share/gocode GOCACHE="$BUILD/go-cache" GOFLAGS= \
    go build -o "$RENDER" .) || die "building tools/helm_render failed (golang-github-masterminds-sprig-dev, golang-gopkg-yaml.v3-dev)"

if [ ! -f "$HERE/node_modules/.package-lock.json" ] ||
   [ "$HERE/package-lock.json" -nt "$HERE/node_modules/.package-lock.json" ]; then
  echo "helm: npm ci in tests/helm" >&2
  (cd "$HERE" && npm ci --no-audit --no-fund --prefer-offline --loglevel=error) >&2 ||
    die "npm ci failed (the npm registry or its cache is needed once)"
fi

for set in default cpu reference; do
  files=()
  [ "$set" = default ] || files=(-f "$CHART/values-$set.yaml")
  echo "== $set" >&2
  "$RENDER" -chart "$CHART" ${files[@]+"${files[@]}"} >"$OUT/$set.yaml" || die "rendering $set failed"
  vals=$CHART/values.yaml
  [ "$set" = default ] || vals="$CHART/values-$set.yaml"
  node "$HERE/validate.mjs" "$OUT/$set.yaml" "$vals" "$BUILD" >"$OUT/$set.log" ||
    { grep -v '^ok' "$OUT/$set.log" >&2; die "$set: validation failed (all checks in $OUT/$set.log)"; }
  tail -n1 "$OUT/$set.log" >&2
done

# Renders that must fail, with the reason.
must_fail() {
  local what=$1 want=$2 extra=$3 err
  printf '%s\n' "$extra" >"$OUT/bad.yaml"
  if err=$("$RENDER" -chart "$CHART" -f "$CHART/values-reference.yaml" -f "$OUT/bad.yaml" 2>&1 >/dev/null); then
    die "$what: rendered"
  fi
  grep -q -- "$want" <<<"$err" || die "$what: failed without '$want': $err"
  echo "ok   refused: $what" >&2
}
must_fail "3 ring nodes for 4 ranks" "worker.ringNodes has 3 entries for worker.worldSize 4" \
  'worker: {ringNodes: [{name: a, address: 1.1.1.1}, {name: b, address: 1.1.1.2}, {name: c, address: 1.1.1.3}]}'
must_fail "no API keys, not allowed" "router.allowUnauthenticated" 'apiKeys: {secretName: ""}'
must_fail "an empty collective port range" "worker.collectivePorts" 'worker: {collectivePorts: {min: 50090, max: 50089}}'

# The validator itself catches a broken rendering.
printf 'worker: {ports: {grpc: "grpc-port"}}\n' >"$OUT/bad.yaml"
"$RENDER" -chart "$CHART" -f "$CHART/values-cpu.yaml" -f "$OUT/bad.yaml" >"$OUT/bad-render.yaml"
if node "$HERE/validate.mjs" "$OUT/bad-render.yaml" "$CHART/values-cpu.yaml,$OUT/bad.yaml" "$BUILD" >"$OUT/bad.log"; then
  die "a port that is not a number passed validation"
fi
grep -q 'containerPort must be integer' "$OUT/bad.log" || die "the bad port failed for another reason: $(grep FAIL "$OUT/bad.log" | head -3)"
echo "ok   a non-numeric port fails the Kubernetes schema" >&2
echo "helm: PASSED" >&2
