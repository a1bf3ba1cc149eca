#!/usr/bin/env bash
# The soak of issue 13 (a benchmark, not a test): a local TP2 cluster of the
# bundled model under ringlane-bench (5 concurrent conversation streams, the
# whole conversation resent every turn) for SOAK_SECONDS (default 600), with
# the resident memory and open descriptors of every daemon sampled every
# SAMPLE_S seconds. Fails when a daemon's RSS or descriptor count at the end
# (the last fifth of the samples) exceeds its level after warm-up (the first
# fifth) by more than RSS_BOUND_MIB / FD_BOUND.
#
#   make soak                       (or: BUILD=build SOAK_SECONDS=600 tools/soak.sh)
set -euo pipefail
BUILD=${BUILD:-build}
SOAK_SECONDS=${SOAK_SECONDS:-600}
SAMPLE_S=${SAMPLE_S:-5}
RSS_BOUND_MIB=${RSS_BOUND_MIB:-32}
FD_BOUND=${FD_BOUND:-8}
MODEL=${MODEL:-deploy/models/stories260K/stories260K.bin}
TOKENIZER=${TOKENIZER:-deploy/models/stories260K/tok512.bin}
OUT="$BUILD/soak"
rm -rf "$OUT"
mkdir -p "$OUT"

# shellcheck source=tools/lib/cluster.sh
source "$(dirname "$0")/lib/cluster.sh"
trap stop_cluster EXIT
start_cluster "$BUILD" "$OUT"

cat >"$OUT/workload.json" <<JSON
{
  "name": "soak-${SOAK_SECONDS}s",
  "description": "Issue 13 soak: 5 streams of conversations resent every turn.",
  "temperature": 0,
  "ignore_eos": true,
  "loop_watchdog": true,
  "stages": [
    {"name": "soak", "mode": "conversation", "concurrency": 5,
     "prompt_tokens": {"uniform": [60, 160]}, "turn_tokens": 12, "turns": 4,
     "output_tokens": 40, "duration_s": ${SOAK_SECONDS}}
  ]
}
JSON

sample() {
  echo "t_s,daemon,rss_kib,fds" >"$OUT/samples.csv"
  local start=$SECONDS
  while :; do
    for i in "${!pids[@]}"; do
      local p=${pids[$i]}
      [ -d "/proc/$p" ] || continue
      local rss fds
      rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$p/status")
      fds=$(ls "/proc/$p/fd" | wc -l)
      echo "$((SECONDS - start)),${names[$i]},$rss,$fds" >>"$OUT/samples.csv"
    done
    sleep "$SAMPLE_S"
  done
}
sample &
sampler=$!

echo "soak: ${SOAK_SECONDS}s against http://$http/v1 (logs and samples in $OUT)" >&2
"$BUILD/tools/ringlane-bench" --base_url="http://$http/v1" --workload="$OUT/workload.json" \
  --out="$OUT/bench" || { kill "$sampler"; echo "soak: ringlane-bench failed" >&2; exit 1; }
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true

python3 - "$OUT/samples.csv" "$RSS_BOUND_MIB" "$FD_BOUND" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
rss_bound, fd_bound = float(sys.argv[2]), int(sys.argv[3])
ok = True
print(f"{'daemon':8} {'samples':>7} {'RSS MiB warm':>12} {'RSS MiB end':>11} {'growth':>7} "
      f"{'fds warm':>8} {'fds end':>7}")
for d in sorted({r['daemon'] for r in rows}):
    s = [r for r in rows if r['daemon'] == d]
    k = max(1, len(s) // 5)
    warm, end = s[:k], s[-k:]
    rss_w = max(int(r['rss_kib']) for r in warm) / 1024
    rss_e = max(int(r['rss_kib']) for r in end) / 1024
    fd_w = max(int(r['fds']) for r in warm)
    fd_e = max(int(r['fds']) for r in end)
    bad = rss_e - rss_w > rss_bound or fd_e - fd_w > fd_bound
    ok = ok and not bad
    print(f"{d:8} {len(s):7} {rss_w:12.1f} {rss_e:11.1f} {rss_e - rss_w:+7.1f} {fd_w:8} {fd_e:7}"
          + ("  OVER BOUND" if bad else ""))
print(f"bounds: RSS +{rss_bound} MiB, fds +{fd_bound}: {'flat' if ok else 'GROWING'}")
sys.exit(0 if ok else 1)
PY
