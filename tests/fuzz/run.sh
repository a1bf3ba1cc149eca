#!/usr/bin/env bash
# Runs the libFuzzer targets of a RINGLANE_FUZZ build (make fuzz, make
# fuzz-smoke): for each target, first every input in regressions/<target>/
# once (a crash fixed must stay fixed), then fuzzing for SECONDS from its
# seeds (corpus/<target>/, read only) and its working corpus, which is kept
# in BUILD_DIR/fuzz-corpus/<target>/ so that long runs build on each other.
# Crash inputs go to tests/fuzz/crashes/<target>/ for review; a reviewed one
# is fixed and moved to regressions/<target>/. Prints libFuzzer's final
# stats per target and fails if any target crashed.
#
# usage: tests/fuzz/run.sh BUILD_DIR SECONDS [TARGET...]   (default: all)
# FUZZ_JOBS: targets fuzzed at once (default: the number of cores).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="$(cd "$1" && pwd)"
seconds="$2"
shift 2
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(openai_request_fuzz http_server_fuzz chat_template_fuzz tokenizer_fuzz
           tokenizer_load_fuzz safetensors_fuzz llama2c_loader_fuzz round_plan_fuzz)
fi
jobs="${FUZZ_JOBS:-$(nproc)}"
logs="$build/fuzz-logs"
mkdir -p "$logs"

# One target: regressions, then fuzzing. Its exit status is the verdict.
run_one() {
  local t="$1" bin="$build/tests/fuzz/$1" log="$logs/$1.log"
  local work="$build/fuzz-corpus/$t" crashes="$here/crashes/$t"
  mkdir -p "$work" "$crashes"
  if [[ ! -x "$bin" ]]; then
    echo "$t: $bin is missing (build the fuzz_targets target)" >"$log"
    return 1
  fi
  local regressions=()
  if [[ -d "$here/regressions/$t" ]]; then
    mapfile -t regressions < <(find "$here/regressions/$t" -type f | sort)
  fi
  if [[ ${#regressions[@]} -gt 0 ]]; then
    if ! "$bin" "${regressions[@]}" >"$log.regressions" 2>&1; then
      echo "$t: a regression input crashes again; see $log.regressions" >"$log"
      return 1
    fi
  fi
  local dict=() flags=()
  [[ -f "$here/$t.dict" ]] && dict=(-dict="$here/$t.dict")
  # <target>.flags: extra libFuzzer flags, one per line, '#' comments.
  [[ -f "$here/$t.flags" ]] && mapfile -t flags < <(grep -v '^\s*\(#\|$\)' "$here/$t.flags")
  # -timeout: an input that takes seconds is a hang worth a report.
  "$bin" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "${dict[@]}" "${flags[@]}" "$work" "$here/corpus/$t" >"$log" 2>&1
}

pids=()
names=()
for t in "${targets[@]}"; do
  while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do sleep 1; done
  run_one "$t" &
  pids+=($!)
  names+=("$t")
done

failed=0
for i in "${!pids[@]}"; do
  t="${names[$i]}"
  log="$logs/$t.log"
  if wait "${pids[$i]}"; then verdict=ok; else verdict=FAILED; failed=1; fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  corpus=$(grep -o 'corp: [0-9]*/[0-9a-zA-Z]*' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  printf '%-22s %-6s %10s execs in %ss  %s  %s  (log %s)\n' "$t" "$verdict" "${runs:-0}" \
    "$seconds" "${cov:-cov: ?}" "${corpus:-corp: ?}" "$log"
  if [[ $verdict == FAILED ]]; then
    grep -E 'ERROR: |FUZZ_CHECK|SUMMARY|artifact|a regression' "$log" | head -8 | sed 's/^/    /'
  fi
done
exit $failed
