#!/usr/bin/env bash
# ringlane-worker --collective_ports (ctest: collective_ports_test): every port
# a worker opens is declared, so the Helm chart, a firewall or a NetworkPolicy
# can allow them. Two ranks of one TP2 group with the TCP collectives in
# ranges of two ports each, and a router, on loopback:
#   - each worker listens only on its --listen port, its --metrics_port and
#     its --collective_ports range, and every TCP connection of a worker has a
#     declared port at one end, the collectives' in a range (ss, by pid): the
#     rules a firewall needs are the declared ports;
#   - a greedy completion through the router is the bundled model's golden text;
#   - rank 1 killed and started again: the group re-forms (rank 0 binds the
#     new formation's socket in its range while the old one may still be
#     open) and serves the golden text again, still inside the ranges;
#   - a malformed range is refused with exit status 2.
#
#   tests/collective_ports/run.sh [BUILD]
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BUILD=${1:-build}
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
OUT="$BUILD/collective_ports_test"
MODEL="$ROOT/deploy/models/stories260K"
WORKER="$BUILD/worker/ringlane-worker"
ROUTER="$BUILD/router/ringlane-router"

die() { echo "collective_ports: $*" >&2; exit 1; }
for b in "$WORKER" "$ROUTER"; do [ -x "$b" ] || die "$b not built"; done
command -v ss >/dev/null 2>&1 || die "ss not found (iproute2)"
rm -rf "$OUT"
mkdir -p "$OUT"

if "$WORKER" --model="$MODEL/stories260K.bin" --collective_ports=50-40 >/dev/null 2>"$OUT/bad.log"; then
  die "--collective_ports=50-40 was accepted"
else
  rc=$?
  [ "$rc" -eq 2 ] && grep -q -- '--collective_ports' "$OUT/bad.log" || die "--collective_ports=50-40: exit $rc: $(cat "$OUT/bad.log")"
fi
echo "ok   --collective_ports=50-40 refused with status 2" >&2

# Eight consecutive free ports: the ranks' gRPC and metrics ports (fixed, as
# the chart has them), then two collective ports per rank.
base=$(node -e '
const net = require("net");
const free = (p) => new Promise((r) => { const s = net.createServer(); s.once("error", () => r(false)); s.listen(p, "127.0.0.1", () => s.close(() => r(true))); });
(async () => {
  for (let tries = 0; tries < 200; tries++) {
    const b = 20000 + Math.floor(Math.random() * 40000);
    let ok = true;
    for (let p = b; p < b + 8 && ok; p++) ok = await free(p);
    if (ok) { console.log(b); return; }
  }
  process.exit(1);
})();') || die "no eight consecutive free ports"
grpc0=$base grpc1=$((base + 1)) metrics0=$((base + 2)) metrics1=$((base + 3))
range0="$((base + 4))-$((base + 5))"
range1="$((base + 6))-$((base + 7))"
declared=" $grpc0 $grpc1 $metrics0 $metrics1 $((base + 4)) $((base + 5)) $((base + 6)) $((base + 7)) "

pids=()
cleanup() {
  local p
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
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
common=(--model="$MODEL/stories260K.bin" --world_size=2 --group=ports --transport=tcp)
"$WORKER" "${common[@]}" --rank=0 --listen=127.0.0.1:$grpc0 --metrics_port=$metrics0 --collective_ports="$range0" \
  >"$OUT/rank0.out" 2>"$OUT/rank0.log" &
pids+=($!)
rank0=$(listening rank0 worker "${pids[0]}")
start_rank1() {
  "$WORKER" "${common[@]}" --rank=1 --rendezvous="$rank0" --listen=127.0.0.1:$grpc1 \
    --metrics_port=$metrics1 --collective_ports="$range1" >"$OUT/rank1.out" 2>"$OUT/rank1.log" &
  pids[1]=$!
  rank1=$(listening rank1 worker "${pids[1]}")
}
start_rank1
"$ROUTER" --workers="$rank0,$rank1" --tokenizer="$MODEL/tok512.bin" --listen=127.0.0.1:0 \
  --http_listen=127.0.0.1:0 --round_deadline_ms=5000 >"$OUT/router.out" 2>"$OUT/router.log" &
pids[2]=$!
http=$(listening router http "${pids[2]}")

# Rank $1 (pid $2): it listens on declared ports only, and each of its TCP
# connections has a declared port at one end (the server's); prints the
# collective ports (in a range) its connections use.
check_ports() {
  local name=$1 pid=$2 l r p bad=""
  for p in $(ss -ltnpH | grep "pid=$pid," | awk '{print $4}' | sed 's/.*://'); do
    case "$declared" in *" $p "*) ;; *) bad+=" listening:$p" ;; esac
  done
  while read -r l r; do
    l=${l##*:} r=${r##*:}
    case "$declared" in *" $l "* | *" $r "*) ;; *) bad+=" connection:$l->$r" ;; esac
  done < <(ss -tnpH state established | grep "pid=$pid," | awk '{print $3, $4}')
  [ -z "$bad" ] || die "$name uses undeclared ports:$bad (declared:$declared)"
  echo "ok   $name: every listening socket and connection on a declared port" >&2
}
# The group's collective connection: between the ranks, on a port of a range.
check_collective() {
  local n
  n=$(ss -tnpH state established | grep -E "pid=(${pids[0]}|${pids[1]})," | awk '{print $3, $4}' |
    sed 's/[^ ]*://g' | awk -v lo="$((base + 4))" -v hi="$((base + 7))" \
      '($1 >= lo && $1 <= hi) || ($2 >= lo && $2 <= hi)' | wc -l)
  [ "$n" -ge 1 ] || die "no connection between the ranks on a collective port"
  echo "ok   the ranks' collectives connect on ports of their ranges ($n socket ends)" >&2
}
complete() {
  local out=$1
  for _ in $(seq 1 150); do
    curl -fs "http://$http/ready" >/dev/null 2>&1 && break
    sleep 0.1
  done
  # After a re-formation the router may answer 503 until it reconnected.
  for _ in $(seq 1 100); do
    curl -fs "http://$http/v1/completions" -H 'Content-Type: application/json' \
      -d '{"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}' >"$out" && break
    sleep 0.1
  done
  [ -s "$out" ] || die "no completion within 10 s; router log: $(tail -n 3 "$OUT/router.log")"
  node -e '
const fs = require("fs");
const r = JSON.parse(fs.readFileSync(process.argv[1], "utf8"));
const g = JSON.parse(fs.readFileSync(process.argv[2], "utf8")).cases.find((c) => c.prompt === "Once upon a time");
if (!g.greedy_text.startsWith(g.prompt + r.choices[0].text) || r.usage.completion_tokens !== 40) {
  console.error("collective_ports: not the golden text: " + JSON.stringify(r.choices[0].text)); process.exit(1);
}' "$out" "$MODEL/golden.json"
}

complete "$OUT/first.json"
echo "ok   the TP2 group serves the golden text" >&2
check_ports rank0 "${pids[0]}"
check_ports rank1 "${pids[1]}"
check_collective

kill -KILL "${pids[1]}"
wait "${pids[1]}" 2>/dev/null || true
start_rank1
# Rank 1 is back on its port: the router reconnects the group by itself.
for _ in $(seq 1 200); do
  grep -q 'epoch 2' "$OUT/rank0.log" && break
  sleep 0.1
done
grep -q 'epoch 2' "$OUT/rank0.log" || die "the group did not re-form at epoch 2: $(tail -n 5 "$OUT/rank0.log")"
complete "$OUT/second.json"
echo "ok   after rank 1's restart the group re-formed (epoch 2) and serves the golden text" >&2
check_ports rank0 "${pids[0]}"
check_ports rank1 "${pids[1]}"
check_collective
echo "collective_ports: PASSED" >&2
