# Helpers the time-to-first-token benchmarks share (kvstore_bench.sh,
# hybrid_resend_bench.sh): sourced, not run. The caller sets BENCH (its name
# for messages) and OUT (its output directory), and `http` once the router
# listens.

pids=()
bench_cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap bench_cleanup EXIT

# file name, daemon's port name -> host:port once the daemon printed
# LISTENING name=...
listening() {
  for _ in $(seq 600); do
    if a=$(grep -m1 "^LISTENING $2=" "$1" 2>/dev/null | sed "s/^LISTENING $2=//") && [ -n "$a" ]; then
      echo "$a"
      return 0
    fi
    sleep 0.1
  done
  echo "$BENCH: $2 did not start; see $1" >&2
  return 1
}

wait_ready() {
  for _ in $(seq 300); do
    curl -sf "http://$http/ready" >/dev/null && return 0
    sleep 0.2
  done
  echo "$BENCH: the router never became ready; see $OUT/router.log" >&2
  return 1
}

# seed, words, model name -> a JSON completion request of that many words
# (from the bundled tokenizer's vocabulary), max_tokens 1, greedy.
prompt_body() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, random, sys
r = random.Random(int(sys.argv[1]))
words = ["the", "little", "girl", "saw", "a", "big", "red", "ball", "in", "park", "and", "her",
         "dog", "ran", "to", "tree", "happy", "sun", "day", "mom", "said", "play", "with", "friend"]
text = " ".join(r.choice(words) for _ in range(int(sys.argv[2])))
print(json.dumps({"model": sys.argv[3], "prompt": text, "max_tokens": 1, "temperature": 0}))
PY
}

# body file -> "seconds cached_tokens prompt_tokens"
ask() {
  if ! curl -sf -o "$OUT/resp.json" -w '%{time_total}' -H 'Content-Type: application/json' \
    --data @"$1" "http://$http/v1/completions" >"$OUT/t"; then
    echo "$BENCH: a request failed; see $OUT/router.log" >&2
    return 1
  fi
  echo "$(cat "$OUT/t") $(python3 -c 'import json,sys; u=json.load(open(sys.argv[1]))["usage"]; print((u.get("prompt_tokens_details") or {}).get("cached_tokens", 0), u["prompt_tokens"])' "$OUT/resp.json")"
}

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
