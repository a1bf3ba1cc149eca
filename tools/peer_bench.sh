#!/usr/bin/env bash
# ringlane's engine against llama.cpp on this machine (a benchmark, not a
# test; `make bench-peer`): the same synthetic TinyLlama-1.1B shape on both
# (ringlane FP8 with 128x128 scales, llama.cpp Q8_0), interleaved in
# alternating order REPEATS times so drift on a shared machine hits both, and
# one table of medians with ratios: single-stream decode at 1 and 2 threads
# (against the read roofline ringlane-engine-bench measures in the same
# run), a batch of 5 at 2 threads, and prefill of 512 tokens at 2 threads.
#
#   GIT_DIR_LLAMACPP=DIR tools/peer_bench.sh [REPEATS]     (default 3)
#
# Environment:
#   GIT_DIR_LLAMACPP  a git directory holding llama.cpp tag b10573 (the search
#                     tool's fetch of github:ngxson/llama.cpp); needed only
#                     until the peer is built (../shared/peers/llamacpp/build.sh,
#                     cached under ~/.cache/ringlane-peer)
#   PEER_DIR [../shared/peers/llamacpp]  the recipe
#   BUILD [build]     ringlane's build (ringlane-engine-bench, ringlane-synth-model)
#   MODEL [$BUILD/models/synth-1b1-fp8]  written by ringlane-synth-model when absent
#   OUT [$BUILD/peer-bench]  raw outputs of every run and table.md
#
#   TOKENIZER         the Llama-2 SentencePiece tokenizer.model (the 32000-token
#                     vocabulary of both models; github:karpathy/llama2.c has
#                     one): when set, also through HTTP, one stream and five
#                     concurrent (tools/bench/1b1/decode.json by ringlane-bench),
#                     and time to first token of a 510-token prompt cold and
#                     resent identically (tools/bench/1b1/resend.json), with
#                     the cached tokens each server reports; ringlane's router
#                     over one worker of 2 threads against llama-server -np 5
#                     -t 2, interleaved the same way
set -euo pipefail
repeats=${1:-3}
root=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$root/build}
PEER_DIR=${PEER_DIR:-$root/../shared/peers/llamacpp}
MODEL=${MODEL:-$BUILD/models/synth-1b1-fp8}
OUT=${OUT:-$BUILD/peer-bench}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ringlane-peer
bin=${LLAMACPP_SRC:-$cache/llamacpp}/build/bin
gguf=${MODELS:-$cache/models}/synth-tinyllama-1.1b-q8_0.gguf

if ! [[ "$repeats" =~ ^[1-9][0-9]*$ ]]; then
  echo "peer_bench: REPEATS must be a positive integer, got '$repeats'" >&2
  exit 2
fi
for t in ringlane-engine-bench ringlane-synth-model; do
  if [ ! -x "$BUILD/tools/$t" ]; then
    echo "peer_bench: $BUILD/tools/$t is missing (run make build)" >&2
    exit 2
  fi
done
if [ ! -x "$bin/llama-bench" ] || [ ! -f "$gguf" ]; then
  if [ -z "${GIT_DIR_LLAMACPP:-}" ]; then
    echo "peer_bench: llama.cpp is not built under $cache; set GIT_DIR_LLAMACPP to a git" \
      "directory with tag b10573 (see $PEER_DIR/README.md)" >&2
    exit 2
  fi
  echo "peer_bench: building llama.cpp b10573 and its model (once; minutes)" >&2
  # Debian's python3 (the recipe needs its numpy), ahead of any other on PATH.
  PATH=/usr/bin:$PATH GIT_DIR_LLAMACPP=$GIT_DIR_LLAMACPP bash "$PEER_DIR/build.sh" >&2
fi
# The recipe builds with GGML_NATIVE, which compiles llama.cpp's AMX kernels
# where CPUID lists AMX; a virtual machine can list it without letting a
# process use the tiles, and the first prompt dies with SIGILL in TILEZERO
# (seen 2026-12-06 on an Intel Xeon VM). Then prompts and batches run on the
# same build without AMX (every other extension native would have chosen
# there: AVX-512 with VNNI, VBMI, BF16), and single-stream decode, which never
# reaches the AMX kernels, stays on the native build, the faster of the two
# for it (tg32 at 1 thread: 9.98 against 5.77 tok/s). The table says so.
runs() {  # llama-bench directory, llama-bench arguments: 0 when it completes
  # A second command keeps the subshell from exec'ing llama-bench, so the
  # report of its signal goes to the subshell's silenced stderr.
  ("$1/llama-bench" -m "$gguf" "${@:2}" -r 1 >/dev/null 2>&1; exit $?) 2>/dev/null
}
bin_tg=$bin
peer_note=
if ! runs "$bin" -p 8 -n 1 -t 1; then
  src=$(dirname "$(dirname "$bin")")
  if [ ! -x "$src/build-noamx/bin/llama-bench" ]; then
    echo "peer_bench: llama.cpp's native build fails here (AMX listed but unusable?);" \
      "building it without AMX (once; minutes)" >&2
    cmake -S "$src" -B "$src/build-noamx" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
      -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON \
      -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON \
      -DGGML_AVX512_BF16=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF \
      -DLLAMA_BUILD_NUMBER=10573 -DLLAMA_BUILD_COMMIT=d775b89 >/dev/null
    cmake --build "$src/build-noamx" -j"$(nproc)" --target llama-bench llama-batched-bench \
      llama-server >&2
  fi
  if runs "$bin" -p 0 -n 2 -t 1; then bin_tg=$bin; else bin_tg=$src/build-noamx/bin; fi
  bin=$src/build-noamx/bin
  if ! runs "$bin" -p 8 -n 1 -t 1; then
    echo "peer_bench: llama-bench fails in $bin too; run it by hand to see why" >&2
    exit 1
  fi
  peer_note="llama.cpp: its native build dies in AMX tile instructions on this machine; prompts, \
batches and llama-server ran its build without AMX ($bin), single-stream decode the native one \
($bin_tg)."
  echo "peer_bench: $peer_note" >&2
fi
if [ ! -f "$MODEL/config.json" ]; then
  echo "peer_bench: writing the synthetic 1.1B FP8 model to $MODEL" >&2
  "$BUILD/tools/ringlane-synth-model" --preset=1b1 --out="$MODEL" >&2
fi

if [ -n "${TOKENIZER:-}" ] && [ ! -f "$TOKENIZER" ]; then
  echo "peer_bench: TOKENIZER=$TOKENIZER is not a file" >&2
  exit 2
fi
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=tools/lib/cluster.sh
source "$root/tools/lib/cluster.sh"
llama_pid=
cleanup() {
  stop_cluster
  if [ -n "$llama_pid" ]; then kill -TERM "$llama_pid" 2>/dev/null || true; fi
}
trap cleanup EXIT
workload=$root/tools/bench/1b1/decode.json
resend=$root/tools/bench/1b1/resend.json
bench_http() {  # base URL, output directory, extra ringlane-bench flags: both workloads
  "$BUILD/tools/ringlane-bench" --base_url="$1" --workload="$workload" --out="$2" \
    --progress=false "${@:3}" >/dev/null 2>"$2/bench.err"
  "$BUILD/tools/ringlane-bench" --base_url="$1" --workload="$resend" --out="$2/resend" \
    --progress=false "${@:3}" >/dev/null 2>"$2/resend.err"
}
http_ringlane() {
  echo "peer_bench: round $1/$repeats, through HTTP: ringlane" >&2
  THREADS=2 start_single "$BUILD" "$OUT/http-ringlane-$1"
  for _ in $(seq 1 600); do  # the model is listed once the worker group is ready
    curl -sf "http://$http/v1/models" 2>/dev/null | grep -q '"id"' && break
    sleep 0.2
  done
  bench_http "http://$http/v1" "$OUT/http-ringlane-$1"
  stop_cluster
}
http_llamacpp() {
  echo "peer_bench: round $1/$repeats, through HTTP: llama-server" >&2
  local port dir=$OUT/http-llamacpp-$1
  mkdir -p "$dir"
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$bin/llama-server" -m "$gguf" -np 5 -c 10240 --host 127.0.0.1 --port "$port" -t 2 -tb 2 \
    --no-webui >"$dir/server.log" 2>&1 &
  llama_pid=$!
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
    sleep 0.2
  done
  # Random weights emit byte-fallback tokens (3..258) the server cannot
  # return as UTF-8: banned, as the recipe says.
  local extra
  extra=$(python3 -c 'import json; print(json.dumps({"ignore_eos": True,
    "logit_bias": [[t, False] for t in range(3, 259)]}))')
  bench_http "http://127.0.0.1:$port/v1" "$dir" --server=generic --extra_body="$extra"
  kill -TERM "$llama_pid" 2>/dev/null || true
  wait "$llama_pid" 2>/dev/null || true
  llama_pid=
}
run_ringlane() {
  echo "peer_bench: round $1/$repeats, ringlane-engine-bench" >&2
  "$BUILD/tools/ringlane-engine-bench" --model="$MODEL" --threads=2 --batch=5 \
    --prefill_tokens=512 --json="$OUT/ringlane-$1.json" >"$OUT/ringlane-$1.md" 2>"$OUT/ringlane-$1.err"
}
run_llamacpp() {
  echo "peer_bench: round $1/$repeats, llama-bench and llama-batched-bench" >&2
  if [ "$bin_tg" != "$bin" ]; then
    "$bin_tg/llama-bench" -m "$gguf" -p 0 -n 128 -t 1,2 -r 1 -o jsonl \
      >"$OUT/llama-bench-$1.jsonl" 2>"$OUT/llama-bench-$1.err"
    "$bin/llama-bench" -m "$gguf" -p 512 -n 0 -t 2 -r 1 -o jsonl \
      >>"$OUT/llama-bench-$1.jsonl" 2>>"$OUT/llama-bench-$1.err"
  else
    "$bin/llama-bench" -m "$gguf" -p 512 -n 128 -t 1,2 -r 1 -o jsonl \
      >"$OUT/llama-bench-$1.jsonl" 2>"$OUT/llama-bench-$1.err"
  fi
  "$bin/llama-batched-bench" -m "$gguf" -c 2048 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 1,5 \
    -t 2 -tb 2 --output-format jsonl >"$OUT/llama-batched-$1.jsonl" 2>"$OUT/llama-batched-$1.err"
}
for ((i = 1; i <= repeats; ++i)); do
  if ((i % 2)); then
    run_ringlane "$i"
    run_llamacpp "$i"
  else
    run_llamacpp "$i"
    run_ringlane "$i"
  fi
  if [ -n "${TOKENIZER:-}" ]; then
    if ((i % 2)); then
      http_ringlane "$i"
      http_llamacpp "$i"
    else
      http_llamacpp "$i"
      http_ringlane "$i"
    fi
  fi
done

python3 - "$OUT" "$repeats" "$peer_note" <<'EOF' | tee "$OUT/table.md"
import json, statistics, sys
out, repeats, note = sys.argv[1], int(sys.argv[2]), sys.argv[3]
med = statistics.median
def records(path):  # JSON lines; the tools also print blank ones
    return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
rl = {"d1": [], "d2": [], "roof1": [], "roof2": [], "p1": [], "p2": [], "b5": [], "pp": []}
lc = {"d1": [], "d2": [], "b5": [], "pp": []}
for i in range(1, repeats + 1):
    j = json.load(open(f"{out}/ringlane-{i}.json"))
    rows = {r["threads"]: r for r in j["rows"]}
    rl["d1"].append(rows[1]["decode_tps"]); rl["roof1"].append(rows[1]["roofline_tps"])
    rl["d2"].append(rows[2]["decode_tps"]); rl["roof2"].append(rows[2]["roofline_tps"])
    for t in (1, 2):  # engine benches before the paired reads lack the figure
        if "paired_of_read" in rows[t]:
            rl[f"p{t}"].append(rows[t]["paired_of_read"])
    rl["b5"].append(j["batched_decode_tps"])
    rl["pp"].append(j["prefill_tokens"] / j["prefill_seconds"])
    for r in records(f"{out}/llama-bench-{i}.jsonl"):
        if r["n_gen"] > 0 and r["n_prompt"] == 0:
            lc["d1" if r["n_threads"] == 1 else "d2"].append(r["avg_ts"])
        elif r["n_prompt"] == 512 and r["n_gen"] == 0 and r["n_threads"] == 2:
            lc["pp"].append(r["avg_ts"])
    for r in records(f"{out}/llama-batched-{i}.jsonl"):
        if r["pl"] == 5:
            lc["b5"].append(r["speed_tg"])
print(f"ringlane vs llama.cpp b10573 (Q8_0), synthetic TinyLlama-1.1B shape, medians of {repeats} "
      "interleaved run(s); ratio = ringlane / llama.cpp\n")
print("| | ringlane | llama.cpp | ratio | ringlane of its read roofline |")
print("|---|--:|--:|--:|--:|")
def row(name, key, roof=None, paired=None):
    a, b = med(rl[key]), med(lc[key])
    r = f"{100 * a / med(rl[roof]):.0f}%" if roof else "-"
    if paired and rl[paired]:
        r += f" (paired with reads: {100 * med(rl[paired]):.0f}%)"
    print(f"| {name} | {a:.1f} | {b:.1f} | {a / b:.2f}x | {r} |")
row("decode, 1 thread (tok/s; llama.cpp tg128)", "d1", "roof1", "p1")
row("decode, 2 threads (tok/s)", "d2", "roof2", "p2")
row("batch of 5, 2 threads (aggregate tok/s; llama-batched-bench)", "b5")
row("prefill of 512 tokens, 2 threads (tok/s; pp512)", "pp")
def http(side, i, conc, decode_only=False):
    path = f"{out}/http-{side}-{i}/samples.json"
    try:
        j = json.load(open(path))
    except OSError:
        return None
    for l in j["levels"]:
        if l["concurrency"] == conc:
            got = [s for s in j["samples"] if s["stage"] == l["stage"] and s["concurrency"] == conc
                   and s.get("phase", "") != "warmup"]
            errors = sum(1 for s in got if s["error"])
            if errors:
                print(f"(http-{side}-{i}: {errors} failed request(s) at concurrency {conc})")
            if decode_only:
                tpot = [s["tpot_ms"] for s in got if not s["error"] and s["tpot_ms"] > 0]
                return 1000 / med(tpot) if tpot else None
            return sum(s["usage_completion_tokens"] for s in got) / l["wall_s"]
    return None
# The wall-clock rows count each request's time to first token (a 16-token
# prompt's prefill, and the level's first request cold); the decode-only row
# (1000 / the median time per output token after the first) is the figure
# to set against the engine's decode, which has neither.
for conc, decode_only, name in (
        (1, False, "through HTTP, one stream (tok/s, wall clock)"),
        (1, True, "through HTTP, one stream, decode only (1000 / TPOT p50)"),
        (5, False, "through HTTP, 5 concurrent (aggregate tok/s)")):
    a = [x for x in (http("ringlane", i, conc, decode_only) for i in range(1, repeats + 1)) if x]
    b = [x for x in (http("llamacpp", i, conc, decode_only) for i in range(1, repeats + 1)) if x]
    if a and b:
        extra = f"{100 * med(a) / med(rl['d2']):.0f}% of the engine" if decode_only else "-"
        print(f"| {name} | {med(a):.1f} | {med(b):.1f} | {med(a) / med(b):.2f}x | {extra} |")
def resend(side, i):  # [(TTFT ms, cached tokens, prompt tokens)] of the cold and warm phases
    try:
        j = json.load(open(f"{out}/http-{side}-{i}/resend/samples.json"))
    except OSError:
        return None
    got = {"cold": [], "warm": []}
    for s in j["samples"]:
        if s.get("phase") in got:
            if s["error"]:
                print(f"(http-{side}-{i} resend: a failed {s['phase']} request: {s['error'][:80]})")
            else:
                got[s["phase"]].append((s["ttft_ms"], s["usage_cached_tokens"],
                                        s["usage_prompt_tokens"]))
    return got if got["cold"] and got["warm"] else None
rs = {side: [x for x in (resend(side, i) for i in range(1, repeats + 1)) if x]
      for side in ("ringlane", "llamacpp")}
if rs["ringlane"] and rs["llamacpp"]:
    def ttft(side, phase):
        return med([t for g in rs[side] for t, _, _ in g[phase]])
    def cached(side):
        c = [f"{k}/{p}" for g in rs[side] for _, k, p in g["warm"]]
        return ", ".join(sorted(set(c)))
    for phase, name in (("cold", "time to first token, 510-token prompt, cold (ms)"),
                        ("warm", "identical resend, time to first token (ms)")):
        a, b = ttft("ringlane", phase), ttft("llamacpp", phase)
        extra = (f"{100 * a / ttft('ringlane', 'cold'):.2f}% of cold; cached {cached('ringlane')}"
                 f" (llama.cpp {cached('llamacpp')})" if phase == "warm" else "-")
        print(f"| {name} | {a:.0f} | {b:.0f} | {b / a:.2f}x (as speed) | {extra} |")
if note:
    print(f"\n{note}")
print(f"\nread roofline (ringlane-engine-bench, same runs): {med(rl['roof1']):.1f} tok/s at 1 thread, "
      f"{med(rl['roof2']):.1f} at 2. Raw outputs: {out}/")
EOF
