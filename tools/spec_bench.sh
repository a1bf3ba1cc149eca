#!/usr/bin/env bash
# A/B of speculative decoding through the whole stack (a benchmark, not a
# test): for each of REPEATS rounds, in alternating order so drift on a shared
# machine hits both, starts a local cluster (one worker, the router with its
# HTTP gateway) once with SPEC_OFF_FLAGS and once with SPEC_ON_FLAGS on the
# router, and runs ringlane-bench's copy and agentic workloads against it
# with the same seed (so both sides get the same prompts). Prints one table:
# per workload, concurrency and phase, the medians over the rounds of output
# tokens/s (all streams), TPOT p50, tokens per step and draft acceptance, the
# on/off speed-up in tokens/s, and how many outputs the two sides agree on
# (at temperature 0, speculation must not change the text).
#
#   tools/spec_bench.sh [REPEATS]                       e.g. tools/spec_bench.sh 3
#   MODEL=build/models/synth-1b1-fp8 tools/spec_bench.sh 1
#
# Environment (defaults in brackets):
#   BUILD [build]           the build whose daemons and ringlane-bench run
#   MODEL [deploy/models/stories260K/stories260K.bin]
#                           a model file or HF model directory for the worker
#   TOKENIZER               the router's --tokenizer; default: MODEL when it is
#                           a directory holding a tokenizer, else the bundled
#                           deploy/models/stories260K/tok512.bin
#   THREADS [2]             the worker's --threads
#   SPEC_OFF_FLAGS [--spec_drafters=none]   router flags of the off side
#   SPEC_ON_FLAGS [--spec_drafters=ngram,suffix]
#                           router flags of the on side (e.g. add
#                           --spec_max_drafts=4); set either to "" for none
#   ROUTER_FLAGS, WORKER_FLAGS []   extra flags for both sides
#   SPEC_ON_WORKER_FLAGS []  worker flags of the on side only (a draft model:
#                           --draft_model=DIR, --draft_layers=N, --draft_mtp),
#                           so the off side runs without one
#   WORKLOADS [copy agentic]        shipped workloads or workload files
#   LENGTH_SCALE [1]        ringlane-bench --length_scale (the shipped
#                           workloads fit a 512-token context)
#   SEED [7]                ringlane-bench --seed, the same for every run
#   OUT [$BUILD/spec-bench] where each run's logs, report.md, samples.json and
#                           both daemons' /metrics after the run go
#
# A router without a flag named in SPEC_OFF_FLAGS runs the off side without it
# (a router that cannot speculate is off); one without a flag named in
# SPEC_ON_FLAGS has no on side: the script says so and measures the off side
# alone.
set -euo pipefail
REPEATS=${1:-${REPEATS:-3}}
BUILD=${BUILD:-build}
MODEL=${MODEL:-deploy/models/stories260K/stories260K.bin}
THREADS=${THREADS:-2}
SPEC_OFF_FLAGS=${SPEC_OFF_FLAGS-"--spec_drafters=none"}
SPEC_ON_FLAGS=${SPEC_ON_FLAGS-"--spec_drafters=ngram,suffix"}
ROUTER_FLAGS=${ROUTER_FLAGS:-}
WORKER_FLAGS=${WORKER_FLAGS:-}
SPEC_ON_WORKER_FLAGS=${SPEC_ON_WORKER_FLAGS:-}
WORKLOADS=${WORKLOADS:-copy agentic}
LENGTH_SCALE=${LENGTH_SCALE:-1}
SEED=${SEED:-7}
OUT=${OUT:-$BUILD/spec-bench}
WORKER="$BUILD/worker/ringlane-worker"
ROUTER="$BUILD/router/ringlane-router"
BENCH="$BUILD/tools/ringlane-bench"
say() { echo "spec_bench: $*" >&2; }

for b in "$WORKER" "$ROUTER" "$BENCH"; do
  if [ ! -x "$b" ]; then
    say "$b is missing: cmake --build $BUILD --target ringlane-worker ringlane-router ringlane-bench"
    exit 1
  fi
done
if [ -d "$MODEL" ] && [ ! -f "$MODEL/config.json" ]; then
  say "MODEL=$MODEL is a directory without config.json"
  exit 1
fi
if [ ! -e "$MODEL" ]; then
  say "MODEL=$MODEL does not exist (make bench writes the synthetic 1.1B one to $BUILD/models/synth-1b1-fp8)"
  exit 1
fi
if [ -z "${TOKENIZER:-}" ]; then
  TOKENIZER=deploy/models/stories260K/tok512.bin
  if [ -d "$MODEL" ]; then
    for f in tokenizer.json tokenizer.model; do
      if [ -f "$MODEL/$f" ]; then TOKENIZER=$MODEL; fi
    done
  fi
fi
if [ -f "$MODEL/config.json" ] && [ "$TOKENIZER" = deploy/models/stories260K/tok512.bin ]; then
  vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("vocab_size", 0))' \
    "$MODEL/config.json")
  if [ "$vocab" -gt 512 ]; then
    # The router gives ids outside its tokenizer no text: the outputs (and so
    # copy's documents) lose those tokens, while the token counts stay exact.
    say "note: $MODEL has a $vocab-token vocabulary but the bundled tokenizer has 512;" \
      "generated ids >= 512 have no text, so copy's documents are mostly empty" \
      "(agentic is unaffected). Set TOKENIZER to the model's own tokenizer if it has one."
  fi
fi

# The flags a router takes, from its --helpfull.
router_help=$("$ROUTER" --helpfull 2>&1 || true)
has_flag() { grep -qE -- "^ *--$1 \(" <<<"$router_help"; }
missing_flags() {  # flags... -> the names this router does not take
  local f name
  for f in "$@"; do
    name=${f#--}
    name=${name%%=*}
    name=${name#no}
    if ! has_flag "$name" && ! has_flag "${f#--}"; then echo "--${f#--}"; fi
  done
}
# shellcheck disable=SC2206  # word splitting of flag lists is intended
off_flags=($SPEC_OFF_FLAGS)
# shellcheck disable=SC2206
on_flags=($SPEC_ON_FLAGS)
# shellcheck disable=SC2206
router_extra=($ROUTER_FLAGS)
# shellcheck disable=SC2206
worker_extra=($WORKER_FLAGS)
# shellcheck disable=SC2206
worker_on=($SPEC_ON_WORKER_FLAGS)
missing_off=$(missing_flags "${off_flags[@]}")
if [ -n "$missing_off" ]; then
  say "note: $ROUTER does not take $(echo "$missing_off" | tr '\n' ' ')(speculative" \
    "decoding is not in this build?): the off side runs without them"
  kept=()
  for f in "${off_flags[@]}"; do
    if ! grep -qxF -- "--${f#--}" <<<"$missing_off"; then kept+=("$f"); fi
  done
  off_flags=("${kept[@]}")
fi
sides="off on"
missing_on=$(missing_flags "${on_flags[@]}")
if [ -n "$missing_on" ]; then
  say "$ROUTER does not take $(echo "$missing_on" | tr '\n' ' ')(speculative decoding is not" \
    "in this build?): no on side; measuring the off side alone"
  sides="off"
fi
say "off: router ${off_flags[*]:-(no flags)}"
if [ "$sides" = "off on" ]; then say "on:  router ${on_flags[*]:-(no flags)}"; fi

rm -rf "$OUT"
mkdir -p "$OUT"
pids=()
stop_cluster() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_cluster EXIT
wait_listening() {  # pid, stdout file, LISTENING name, daemon: prints host:port
  for _ in $(seq 1 600); do
    if grep -q "^LISTENING $3=" "$2" 2>/dev/null; then sed -n "s/^LISTENING $3=//p" "$2"; return; fi
    if ! kill -0 "$1" 2>/dev/null; then
      say "the $4 exited before listening; the end of ${2%.out}.log:"
      tail -n 15 "${2%.out}.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  say "the $4 did not start in 60 s; see ${2%.out}.log"
  exit 1
}
run_side() {  # side (off|on), run directory
  local side=$1 dir=$2 worker http wl
  local flags=("${off_flags[@]}") wflags=("${worker_extra[@]}")
  if [ "$side" = on ]; then
    flags=("${on_flags[@]}")
    wflags+=("${worker_on[@]}")
  fi
  mkdir -p "$dir"
  "$WORKER" --model="$MODEL" --threads="$THREADS" --listen=127.0.0.1:0 --metrics_port=0 \
    "${wflags[@]}" >"$dir/worker.out" 2>"$dir/worker.log" &
  pids+=($!)
  worker=$(wait_listening "${pids[-1]}" "$dir/worker.out" worker worker)
  "$ROUTER" --workers="$worker" --tokenizer="$TOKENIZER" --listen=127.0.0.1:0 \
    --http_listen=127.0.0.1:0 "${flags[@]}" "${router_extra[@]}" \
    >"$dir/router.out" 2>"$dir/router.log" &
  pids+=($!)
  http=$(wait_listening "${pids[-1]}" "$dir/router.out" http router)
  # The router listens before its group is ready (a large model loads for a
  # while): the bench needs the model listed.
  for _ in $(seq 1 1200); do
    curl -sf "http://$http/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  for wl in $WORKLOADS; do
    if ! "$BENCH" --base_url="http://$http/v1" --server=ringlane --workload="$wl" \
      --seed="$SEED" --length_scale="$LENGTH_SCALE" --progress=false \
      --out="$dir/$(basename "$wl" .json)" >"$dir/$(basename "$wl" .json).md" \
      2>"$dir/$(basename "$wl" .json).err"; then
      say "ringlane-bench failed on $wl ($side); see $dir/$(basename "$wl" .json).err:"
      tail -n 5 "$dir/$(basename "$wl" .json).err" >&2
      exit 1
    fi
  done
  # Both daemons' counters after the run (round times, draft passes), for
  # finding out why a figure moved.
  curl -sf "http://$http/metrics" >"$dir/router-metrics.txt" 2>/dev/null || true
  local wm
  wm=$(sed -n 's/^LISTENING metrics=//p' "$dir/worker.out")
  [ -n "$wm" ] && { curl -sf "http://$wm/metrics" >"$dir/worker-metrics.txt" 2>/dev/null || true; }
  stop_cluster
}

for r in $(seq 1 "$REPEATS"); do
  order=$sides
  if [ "$sides" = "off on" ] && [ $((r % 2)) -eq 0 ]; then order="on off"; fi
  for side in $order; do
    say "round $r/$REPEATS, speculation $side"
    run_side "$side" "$OUT/$side-$r"
  done
done

# shellcheck disable=SC2086  # one argument per workload
python3 - "$OUT" "$REPEATS" "$sides" $WORKLOADS <<'PY' | tee "$OUT/summary.md"
import json, os, statistics, sys
out, repeats, sides, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4:]
rows = {}   # (workload, conc, phase) -> side -> list of group dicts, one per round
order = []
texts = {}  # (workload, side, round) -> {(stage, conc, phase, n): text}
for wl in workloads:
    name = os.path.basename(wl)
    if name.endswith(".json"):
        name = name[:-5]
    for side in sides:
        for r in range(1, repeats + 1):
            s = json.load(open(os.path.join(out, f"{side}-{r}", name, "samples.json")))
            for g in s["groups"]:
                key = (name, g["concurrency"], g["phase"] or "-")
                if key not in rows:
                    rows[key] = {}
                    order.append(key)
                rows[key].setdefault(side, []).append(g)
            # The same seed gives both sides the same prompts, but at
            # concurrency > 1 not in the same sample order: outputs are
            # compared as multisets per group.
            t = {}
            for x in s["samples"]:
                k = (name, x["concurrency"], x["phase"] or "-")
                t.setdefault(k, []).append(x["text"] if not x["error"] else None)
            texts[(name, side, r)] = t

def med(side_rows, field, sub=None):
    vals = []
    for g in side_rows:
        v = g.get(field)
        if sub is not None and isinstance(v, dict):
            v = v.get(sub)
        if v is not None and v == v:  # not null, not NaN
            vals.append(v)
    return statistics.median(vals) if vals else None

def f(v, fmt):
    return "-" if v is None else fmt.format(v)

print(f"speculative decoding off vs on: medians over {repeats} round(s); "
      "tok/s = output tokens/s of all streams; speed-up = on / off tok/s\n")
print("| workload | conc | phase | tok/s off | tok/s on | speed-up | TPOT p50 ms off | TPOT p50 ms on "
      "| tokens/step off | tokens/step on | acceptance on | same text |")
print("|---|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
for key in order:
    off, on = rows[key].get("off", []), rows[key].get("on", [])
    t_off, t_on = med(off, "aggregate_tokens_per_s"), med(on, "aggregate_tokens_per_s")
    speed = t_on / t_off if t_off and t_on else None
    same = total = 0
    if "on" in sides:
        for r in range(1, repeats + 1):
            a = sorted(x for x in texts[(key[0], "off", r)].get(key, []) if x is not None)
            b = sorted(x for x in texts[(key[0], "on", r)].get(key, []) if x is not None)
            total += max(len(a), len(b))
            bb = list(b)
            for x in a:
                if x in bb:
                    bb.remove(x)
                    same += 1
    acc = med(on, "draft_acceptance")
    print(f"| {key[0]} | {key[1]} | {key[2]} | {f(t_off, '{:.1f}')} | {f(t_on, '{:.1f}')} "
          f"| {f(speed, '{:.3f}')} | {f(med(off, 'tpot_ms', 'p50'), '{:.3f}')} "
          f"| {f(med(on, 'tpot_ms', 'p50'), '{:.3f}')} | {f(med(off, 'tokens_per_step'), '{:.2f}')} "
          f"| {f(med(on, 'tokens_per_step'), '{:.2f}')} "
          f"| {f(None if acc is None else 100 * acc, '{:.1f}%')} "
          f"| {f'{same}/{total}' if total else '-'} |")
print("\n'-': not measured (no on side, or the router does not export the counter); "
      "tokens/step = generated tokens / sampling rows; acceptance = accepted / drafted tokens; "
      "same text: outputs of the on side equal to the off side's (per group, over all rounds).")
print(f"Per-run reports: {out}/{{off,on}}-N/WORKLOAD/report.md")
PY
