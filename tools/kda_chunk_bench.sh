#!/usr/bin/env bash
# Prefill of GLM-5.3-Flash's hybrid (the synthetic glm5-next-small: three KDA
# layers of 8 heads of 128, one NoPE MLA layer) with the KDA layers in the
# recurrent form (--kda_chunk=0) and in the chunked form (chunks of CHUNK),
# alternating, REPEATS times each, in one run: a benchmark, not a test
# (issue 19). Each run is ringlane-logits over TOKENS tokens in prefill rows
# of 512 on two threads; the figure is the median wall time and the ratio.
#
#   tools/kda_chunk_bench.sh [BUILD] [TOKENS] [REPEATS] [CHUNK]    e.g. ... build 2048 3 64
set -euo pipefail
BUILD=${1:-build}
TOKENS=${2:-2048}
REPEATS=${3:-3}
CHUNK=${4:-64}
MODEL="$BUILD/models/glm5-next-small"
if [ ! -f "$MODEL/config.json" ]; then
  "$BUILD/tools/ringlane-synth-model" --preset=glm5-next-small --out="$MODEL" >/dev/null
fi
tokens=$(seq 0 $((TOKENS - 1)) | awk '{ printf "%s%d", (NR > 1 ? "," : ""), ($1 * 131 + 7) % 512 }')
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
run() {
  local start end
  start=$(date +%s.%N)
  "$BUILD/tools/ringlane-logits" --model="$MODEL" --tokens="$tokens" --chunk=512 --threads=2 \
    --kda_chunk="$1" --out="$out/logits.f32" >/dev/null
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f", b - a }'
}
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
recurrent=() chunked=()
for i in $(seq "$REPEATS"); do
  echo "kda_chunk_bench: repeat $i/$REPEATS" >&2
  recurrent+=("$(run 0)")
  chunked+=("$(run "$CHUNK")")
done
r=$(median "${recurrent[@]}")
c=$(median "${chunked[@]}")
printf '| prefill of %d tokens, glm5-next-small | recurrent %.2f s | chunked (%d) %.2f s | chunked/recurrent %.2f |\n' \
  "$TOKENS" "$r" "$CHUNK" "$c" "$(awk -v c="$c" -v r="$r" 'BEGIN { print c / r }')"
