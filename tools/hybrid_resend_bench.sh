#!/usr/bin/env bash
# Time to first token of a long prompt on GLM-5.3-Flash's hybrid (glm5_next;
# a benchmark, not a test; issue 19): cold, and resent, when it resumes from
# the state checkpoint of its longest cached prefix (the KDA layers' state)
# with the MLA layer's latent rows from the pool. One local cluster (one
# worker of the synthetic glm5-next-small, the router); each figure is the
# median of REPEATS requests of max_tokens 1, timed by curl.
#
#   tools/hybrid_resend_bench.sh [BUILD] [PROMPT_WORDS] [REPEATS]    e.g. ... build 1200 3
set -euo pipefail
BUILD=${1:-build}
WORDS=${2:-1200}
REPEATS=${3:-3}
OUT=${OUT:-$BUILD/hybrid-bench}
rm -rf "$OUT"
mkdir -p "$OUT"
MODEL="$BUILD/models/glm5-next-small"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/tools/ringlane-synth-model" --preset=glm5-next-small --out="$MODEL" >/dev/null
fi

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
listening() {  # file name -> host:port once the daemon printed LISTENING name
  for _ in $(seq 600); do
    if a=$(grep -m1 "^LISTENING $2=" "$1" 2>/dev/null | sed "s/^LISTENING $2=//") && [ -n "$a" ]; then
      echo "$a"
      return 0
    fi
    sleep 0.1
  done
  echo "hybrid_resend_bench: $2 did not start; see $1" >&2
  return 1
}
"$BUILD/worker/ringlane-worker" --model="$MODEL" --threads=2 --block_size=16 --kv_dtype=fp8 \
  --state_checkpoint_interval=256 --listen=127.0.0.1:0 >"$OUT/worker.out" 2>"$OUT/worker.log" &
pids+=($!)
worker=$(listening "$OUT/worker.out" worker)
"$BUILD/router/ringlane-router" --workers="$worker" \
  --tokenizer=deploy/models/stories260K/tok512.bin --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --round_token_budget=2048 --itl_target_ms=0 >"$OUT/router.out" 2>"$OUT/router.log" &
pids+=($!)
http=$(listening "$OUT/router.out" http)
for _ in $(seq 300); do
  curl -sf "http://$http/ready" >/dev/null && break
  sleep 0.2
done

prompt() {  # seed -> a JSON request body of WORDS words, max_tokens 1
  python3 - "$1" "$WORDS" <<'PY'
import json, random, sys
r = random.Random(int(sys.argv[1]))
words = ["the", "little", "girl", "saw", "a", "big", "red", "ball", "in", "park", "and", "her",
         "dog", "ran", "to", "tree", "happy", "sun", "day", "mom", "said", "play", "with", "friend"]
text = " ".join(r.choice(words) for _ in range(int(sys.argv[2])))
print(json.dumps({"model": "glm5-next-small", "prompt": text, "max_tokens": 1, "temperature": 0}))
PY
}
ask() {  # body file -> "seconds cached_tokens prompt_tokens"
  if ! curl -sf -o "$OUT/resp.json" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data @"$1" "http://$http/v1/completions" >"$OUT/t"; then
    echo "hybrid_resend_bench: a request failed; see $OUT/router.log" >&2
    return 1
  fi
  echo "$(cat "$OUT/t") $(python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; print((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0), u["prompt_tokens"])' "$OUT/resp.json")"
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
cold=() warm=()
for i in $(seq "$REPEATS"); do
  echo "hybrid_resend_bench: repeat $i/$REPEATS" >&2
  prompt $((100 + i)) >"$OUT/p$i.json"
  line=$(ask "$OUT/p$i.json") || exit 1
  cold+=("${line%% *}")
  c_cold=${line#* }
  line=$(ask "$OUT/p$i.json") || exit 1
  warm+=("${line%% *}")
  c_warm=${line#* }
done
tc=$(printf '%s\n' "${cold[@]}" | median)
tw=$(printf '%s\n' "${warm[@]}" | median)
{
  echo "| time to first token | seconds (median of $REPEATS) | of cold | cached / prompt tokens |"
  echo "|---|---:|---:|---:|"
  printf '| cold | %s | 1.000 | %s |\n' "$tc" "${c_cold// / \/ }"
  printf '| resent (checkpoint hit) | %s | %.3f | %s |\n' "$tw" "$(echo "$tw / $tc" | bc -l)" \
    "${c_warm// / \/ }"
} | tee "$OUT/report.md"
