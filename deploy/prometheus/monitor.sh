#!/usr/bin/env bash
# Debian's Prometheus against the local cluster of `make serve` (`make
# monitor`): copies the shipped prometheus.yml and ringlane-alerts.yml into
# $RUN (build/monitor), writes the file_sd targets from the daemons'
# `LISTENING` lines in $LOGS (build/serve: router.out, rank*.out,
# kvstore.out) and rewrites them every second, so a cluster restarted on new
# ports is followed; then serves Prometheus on http://$PROM_LISTEN
# (127.0.0.1:9090) in the foreground until Ctrl-C. Start it beside `make
# serve` (another terminal); alerts are at /alerts, targets at /targets.
#
#   deploy/prometheus/monitor.sh
#   (BUILD, LOGS, RUN, PROM_LISTEN, SCRAPE_INTERVAL from the env;
#    SCRAPE_INTERVAL replaces the shipped 5s scrape and evaluation interval)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD=${BUILD:-build}
LOGS=${LOGS:-$BUILD/serve}
RUN=${RUN:-$BUILD/monitor}
PROM_LISTEN=${PROM_LISTEN:-127.0.0.1:9090}
SCRAPE_INTERVAL=${SCRAPE_INTERVAL:-}
PROMETHEUS=${PROMETHEUS:-prometheus}

command -v "$PROMETHEUS" >/dev/null 2>&1 ||
  { echo "monitor: $PROMETHEUS not found (tools/install_deps.sh installs Debian's prometheus)" >&2; exit 1; }

mkdir -p "$RUN/targets" "$RUN/data"
cp "$HERE/ringlane-alerts.yml" "$RUN/ringlane-alerts.yml"
if [ -n "$SCRAPE_INTERVAL" ]; then
  sed -E "s/^(  (scrape|evaluation)_interval:).*/\1 $SCRAPE_INTERVAL/" \
    "$HERE/prometheus.yml" >"$RUN/prometheus.yml"
else
  cp "$HERE/prometheus.yml" "$RUN/prometheus.yml"
fi

# The address after "LISTENING $2=" in file $1, or nothing.
listening() {
  [ -f "$1" ] || return 0
  sed -n "s/^LISTENING $2=//p" "$1" | head -n1
}

# Writes targets/$1.json (a file_sd list) from the addresses that follow,
# through a rename so Prometheus never reads half a file.
write_targets() {
  local job=$1 tmp
  shift
  tmp="$RUN/targets/.$job.json.tmp"
  {
    printf '[{"targets": ['
    local sep=""
    for a in "$@"; do printf '%s"%s"' "$sep" "$a"; sep=", "; done
    printf "], \"labels\": {}}]\n"
  } >"$tmp"
  if ! cmp -s "$tmp" "$RUN/targets/$job.json"; then mv "$tmp" "$RUN/targets/$job.json"; else rm -f "$tmp"; fi
}

update_targets() {
  local router workers=() kvstore f a
  router=$(listening "$LOGS/router.out" http)
  for f in "$LOGS"/rank*.out; do
    [ -e "$f" ] || continue
    a=$(listening "$f" metrics)
    if [ -n "$a" ]; then workers+=("$a"); fi
  done
  kvstore=$(listening "$LOGS/kvstore.out" metrics)
  write_targets router ${router:+"$router"}
  write_targets worker ${workers[@]+"${workers[@]}"}
  write_targets kvstore ${kvstore:+"$kvstore"}
}

update_targets
[ -s "$LOGS/router.out" ] ||
  echo "monitor: no cluster in $LOGS yet (start \`make serve\`); targets follow it once it runs" >&2
"$PROMETHEUS" --config.file="$RUN/prometheus.yml" --storage.tsdb.path="$RUN/data" \
  --web.listen-address="$PROM_LISTEN" --storage.tsdb.retention.time=1d \
  >"$RUN/prometheus.out" 2>"$RUN/prometheus.log" &
prom=$!
cleanup() {
  kill -TERM "$prom" 2>/dev/null || true
  wait "$prom" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "monitor: Prometheus at http://$PROM_LISTEN (targets of $LOGS, log $RUN/prometheus.log; Ctrl-C stops it)" >&2
echo "http://$PROM_LISTEN"
while kill -0 "$prom" 2>/dev/null; do
  update_targets
  sleep 1
done
wait "$prom" || { rc=$?; echo "monitor: prometheus exited with $rc; its log:" >&2; tail -n 20 "$RUN/prometheus.log" >&2; exit "$rc"; }
