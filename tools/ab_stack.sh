#!/usr/bin/env bash
# A/B of two builds through the whole stack (a benchmark, not a test): for
# each of REPEATS rounds, in alternating order so drift on a shared machine
# hits both, starts a local TP2 cluster of the bundled model from each build
# and runs ringlane-bench's single-stream and 5-stream decode against it.
# Prints, per build, TPOT p50 and aggregate tokens/s of every run, and the
# CPU seconds the three daemons spent per 1,000 output tokens (less
# sensitive than wall time to what else the machine runs).
#
#   tools/ab_stack.sh A_BUILD B_BUILD [REPEATS]     e.g. tools/ab_stack.sh ../base/build build 3
#
# The client (ringlane-bench) is B's for both, so only the servers differ.
set -euo pipefail
A=${1:?usage: tools/ab_stack.sh A_BUILD B_BUILD [REPEATS]}
B=${2:?usage: tools/ab_stack.sh A_BUILD B_BUILD [REPEATS]}
REPEATS=${3:-3}
MODEL=${MODEL:-deploy/models/stories260K/stories260K.bin}
TOKENIZER=${TOKENIZER:-deploy/models/stories260K/tok512.bin}
OUT=${OUT:-$B/ab-stack}
BENCH="$B/tools/ringlane-bench"
rm -rf "$OUT"
mkdir -p "$OUT"

cat >"$OUT/workload.json" <<'JSON'
{
  "name": "ab-decode",
  "description": "Decode through the stack: one stream, then five.",
  "temperature": 0,
  "ignore_eos": true,
  "loop_watchdog": false,
  "stages": [
    {"name": "single", "concurrency": 1, "prompt_tokens": 16, "output_tokens": 128,
     "requests": 6, "warmup": 1},
    {"name": "five", "concurrency": 5, "prompt_tokens": 16, "output_tokens": 128,
     "requests_per_stream": 3, "warmup": 1}
  ]
}
JSON

# shellcheck source=tools/lib/cluster.sh
source "$(dirname "$0")/lib/cluster.sh"
trap stop_cluster EXIT
cpu_ticks() {  # utime + stime of the cluster's daemons
  local t=0
  for p in "${pids[@]}"; do
    t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$t"
}

run_one() {  # build, run directory
  local build=$1 dir=$2
  start_cluster "$build" "$dir"
  local before after
  before=$(cpu_ticks)
  "$BENCH" --base_url="http://$http/v1" --workload="$OUT/workload.json" --seed=7 \
    --progress=false --out="$dir/bench" >/dev/null
  after=$(cpu_ticks)
  echo $(((after - before))) >"$dir/cpu_ticks"
  stop_cluster
}

for r in $(seq 1 "$REPEATS"); do
  if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
  for x in $order; do
    if [ "$x" = A ]; then build=$A; else build=$B; fi
    echo "ab_stack: repeat $r/$REPEATS, build $x ($build)" >&2
    run_one "$build" "$OUT/$x-$r"
  done
done

python3 - "$OUT" "$REPEATS" "$(getconf CLK_TCK)" <<'PY'
import json, sys, os
out, repeats, hz = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rows = {}
for x in "AB":
    for r in range(1, repeats + 1):
        d = os.path.join(out, f"{x}-{r}")
        s = json.load(open(os.path.join(d, "bench", "samples.json")))
        ticks = int(open(os.path.join(d, "cpu_ticks")).read())
        tokens = 0
        for g in s["groups"]:
            if g.get("phase", "") == "warmup":
                continue
            key = (x, g["stage"])
            rows.setdefault(key, []).append((g["tpot_ms"]["p50"], g["aggregate_tokens_per_s"]))
            tokens += g["output_tokens"]
        rows.setdefault((x, "cpu"), []).append(ticks / hz * 1000.0 / max(tokens, 1))
def fmt(v): return " ".join(f"{a:.2f}/{b:.0f}" for a, b in v)
for stage in ("single", "five"):
    a, b = rows[("A", stage)], rows[("B", stage)]
    ma = sorted(t for t, _ in a)[len(a) // 2]
    mb = sorted(t for t, _ in b)[len(b) // 2]
    print(f"{stage:6} TPOT p50 ms / tok/s   A: {fmt(a)}   B: {fmt(b)}   B/A median TPOT {mb / ma:.3f}")
ca, cb = sorted(rows[("A", "cpu")]), sorted(rows[("B", "cpu")])
print(f"daemon CPU s per 1k output tokens   A: {' '.join(f'{v:.2f}' for v in ca)}"
      f"   B: {' '.join(f'{v:.2f}' for v in cb)}   B/A median {cb[len(cb)//2] / ca[len(ca)//2]:.3f}")
PY
