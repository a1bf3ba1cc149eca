#!/usr/bin/env bash
# An image of deploy/images (ctest: image_cpu_test, image_cuda_test), checked
# the way these machines allow (no container can start here): from the
# filesystem that deploy/images/build.sh put in IMAGE_BUILD/images/VARIANT/rootfs
# (`make image-cpu`, `make image-cuda`; the test skips, exit 77, when it is not
# built or not root):
#   - its daemons are the ones built in IMAGE_BUILD (same GNU build ids), no
#     compiler or build tool is in it, user ringlane is 10001;
#   - under chroot as user 10001, the kvstore, two workers as one TP2 group and
#     the router start on free loopback ports from the image's own binaries
#     and libraries, load the bundled model from the image and serve a
#     completion over HTTP whose greedy text is the model's golden text (the
#     CUDA image's worker on its CPU backend: it loads its CUDA libraries from
#     the image, and no GPU is needed to start);
#   - where podman is installed, the image ringlane-VARIANT:VERSION runs as
#     10001:10001 and holds the same worker (podman export).
#
#   tests/images/run.sh cpu [IMAGE_BUILD]     (default build-cpu)
#   tests/images/run.sh cuda [IMAGE_BUILD]    (default build)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
VARIANT=${1:-cpu}
case "$VARIANT" in cpu) IMAGE_BUILD=${2:-build-cpu} ;; cuda) IMAGE_BUILD=${2:-build} ;; *) echo "image: VARIANT is cpu or cuda" >&2; exit 2 ;; esac
case "$IMAGE_BUILD" in /*) ;; *) IMAGE_BUILD="$ROOT/$IMAGE_BUILD" ;; esac
ROOTFS="$IMAGE_BUILD/images/$VARIANT/rootfs"
OUT="$IMAGE_BUILD/images/test-$VARIANT"
VERSION=$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/deploy/helm/ringlane/Chart.yaml")
MODEL=/usr/share/ringlane/models/stories260K

die() { echo "image: $*" >&2; exit 1; }
skip() { echo "image: SKIPPED: $*" >&2; exit 77; }
[ -x "$ROOTFS/usr/bin/ringlane-worker" ] || skip "no image filesystem in $ROOTFS (make image-$VARIANT)"
[ "$(id -u)" -eq 0 ] || skip "chroot needs root"

build_id() { readelf -n "$1" | sed -n 's/.*Build ID: //p'; }
for d in worker/ringlane-worker router/ringlane-router kvstore/ringlane-kvstore; do
  b=$(basename "$d")
  # An image older than the build is not a failure of the code: say so, skip.
  [ "$(build_id "$ROOTFS/usr/bin/$b")" = "$(build_id "$IMAGE_BUILD/$d")" ] ||
    skip "$b in the image is older than $IMAGE_BUILD's (make image-$VARIANT rebuilds it)"
done
echo "ok   the image's daemons are $IMAGE_BUILD's" >&2
for t in gcc cc c++ g++ clang ld as make cmake; do
  [ ! -e "$ROOTFS/usr/bin/$t" ] || die "build tool $t in the image"
done
echo "ok   no compiler or build tool in the image" >&2
grep -q '^ringlane:x:10001:10001:' "$ROOTFS/etc/passwd" || die "no user ringlane (10001)"
echo "ok   user ringlane is 10001" >&2
# What the Helm chart runs besides the daemons: the workers' start script
# (/bin/sh -ec) and the kvstore's init container (/bin/chown).
POD_NAME=ringlane-worker-3 chroot "$ROOTFS" /bin/sh -ec 'rank="${POD_NAME##*-}"; [ "$rank" = 3 ]' </dev/null ||
  die "/bin/sh of the image cannot run the workers' start script"
[ -x "$ROOTFS/bin/chown" ] || die "no /bin/chown for the kvstore's init container"
echo "ok   the chart's /bin/sh start script and /bin/chown run in the image" >&2

rm -rf "$OUT" "$ROOTFS/tmp/image-test"
mkdir -p "$OUT" "$ROOTFS/tmp/image-test"
chown 10001:10001 "$ROOTFS/tmp/image-test"
pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$ROOTFS/tmp/image-test"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Runs a daemon of the image under chroot as 10001; $1 names its logs.
run() {
  local name=$1
  shift
  chroot --userspec=10001:10001 "$ROOTFS" "$@" >"$OUT/$name.out" 2>"$OUT/$name.log" &
  pids+=($!)
}
listening() {
  local name=$1 what=$2 pid=$3
  for _ in $(seq 1 300); do
    if grep -q "^LISTENING $what=" "$OUT/$name.out" 2>/dev/null; then
      sed -n "s/^LISTENING $what=//p" "$OUT/$name.out" | head -n1
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$OUT/$name.log" >&2; die "$name exited"; }
    sleep 0.1
  done
  die "$name did not start; see $OUT/$name.log"
}

run kvstore /usr/bin/ringlane-kvstore --listen=127.0.0.1:0 --metrics_port=0 \
  --disk_dir=/tmp/image-test/kvstore --dram_bytes=$((64 << 20)) --disk_bytes=$((256 << 20))
kvstore=$(listening kvstore kvstore "${pids[0]}")
common=(--model="$MODEL/stories260K.bin" --world_size=2 --group=image --metrics_port=0 --kvstore="$kvstore")
run rank0 /usr/bin/ringlane-worker "${common[@]}" --rank=0 --listen=127.0.0.1:0
rank0=$(listening rank0 worker "${pids[1]}")
run rank1 /usr/bin/ringlane-worker "${common[@]}" --rank=1 --rendezvous="$rank0" --listen=127.0.0.1:0
rank1=$(listening rank1 worker "${pids[2]}")
run router /usr/bin/ringlane-router --workers="$rank0,$rank1" --tokenizer="$MODEL/tok512.bin" \
  --listen=127.0.0.1:0 --http_listen=127.0.0.1:0
http=$(listening router http "${pids[3]}")
echo "ok   kvstore, two workers and the router of the image run under chroot as 10001 (http $http)" >&2
for _ in $(seq 1 100); do
  curl -fs "http://$http/ready" >/dev/null 2>&1 && break
  sleep 0.1
done
curl -fsS "http://$http/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}' >"$OUT/completion.json" ||
  die "the completion failed; router log: $(tail -n 5 "$OUT/router.log")"
node -e '
const fs = require("fs");
const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const golden = JSON.parse(fs.readFileSync(process.argv[2], "utf8")).cases.find((c) => c.prompt === "Once upon a time");
const text = r.choices[0].text;
const full = golden.greedy_text;
if (r.usage.completion_tokens !== 40 || !full.startsWith(golden.prompt + text) || text.length < 40) {
  console.error(`image: completion ${JSON.stringify(text)} is not in the golden text ${JSON.stringify(full.slice(0, 300))}`);
  process.exit(1);
}
' "$OUT/completion.json" "$ROOT/deploy/models/stories260K/golden.json"
echo "ok   a greedy completion from the image's model equals the golden text" >&2

if command -v podman >/dev/null 2>&1; then
  user=$(podman image inspect --format '{{.Config.User}}' "ringlane-$VARIANT:$VERSION" 2>/dev/null) ||
    die "podman has no image ringlane-$VARIANT:$VERSION (make image-$VARIANT)"
  [ "$user" = "10001:10001" ] || die "the image runs as '$user', not 10001:10001"
  c=$(podman create "ringlane-$VARIANT:$VERSION")
  podman export "$c" | tar -xO usr/bin/ringlane-worker >"$OUT/worker-from-image"
  podman rm "$c" >/dev/null
  cmp -s "$OUT/worker-from-image" "$ROOTFS/usr/bin/ringlane-worker" || die "the podman image holds another worker"
  rm -f "$OUT/worker-from-image"
  echo "ok   podman image ringlane-$VARIANT:$VERSION runs as 10001:10001 and holds the same worker" >&2
fi
echo "image: PASSED" >&2
