// The checks of tests/monitoring/run.sh against a live local cluster and a
// real Prometheus scraping it with deploy/prometheus/prometheus.yml. No npm
// packages: Node's fetch and the Prometheus HTTP API.
//
//   node check.mjs scraped        waits until the router was scraped twice
//   node check.mjs healthy        every target up, ringlane series stored, every
//                                 alert rule loaded and evaluated, every
//                                 dashboard query against live /metrics
//   node check.mjs kvstore-down   after the kvstore was killed
//   node check.mjs worker-down    after rank 1 was killed
// Env: PROM_URL, METRICS_URLS (space-separated /metrics URLs of every daemon),
// DASHBOARD (path of the Grafana JSON).
import { readFileSync } from 'node:fs';

const PROM = process.env.PROM_URL;
const phase = process.argv[2];

// Alert name -> how it must evaluate on the healthy cluster of run.sh. probe is
// the expression's input (the alert without its threshold): it must return
// data, except where `pending` says why it is deliberately empty. healthy is
// what the whole expression returns: empty (all is well), or data where run.sh
// provoked it (a looping generation).
const ALERTS = {
  RinglaneWorkerDown: { probe: 'up{job="ringlane-worker"}', healthy: 'empty' },
  RinglaneWorkerGroupNotReady: { probe: 'ringlane_group_ready', healthy: 'empty' },
  RinglaneKvPoolExhausted: {
    probe: 'ringlane_kv_blocks_used / ringlane_kv_blocks_capacity', healthy: 'empty' },
  RinglaneKvstoreDown: { probe: 'up{job="ringlane-kvstore"}', healthy: 'empty' },
  RinglaneKvstoreUnreachable: { probe: 'ringlane_worker_kvstore_up', healthy: 'empty' },
  RinglaneLoopsDetected: { probe: 'increase(ringlane_loops_detected_total[10m])', healthy: 'data' },
  RinglaneTimeToFirstTokenHigh: {
    probe: 'histogram_quantile(0.95, sum by (model, le) (rate(ringlane_time_to_first_token_seconds_bucket[5m])))',
    healthy: 'empty' },
  RinglaneSpecAcceptanceCollapsed: {
    probe: 'sum by (model, drafter, temperature) (rate(ringlane_spec_drafted_tokens_total[10m]))',
    healthy: 'empty' },
  RinglaneHttpErrors: {
    probe: 'sum by (endpoint) (rate(ringlane_http_requests_total[5m]))', healthy: 'empty' },
};
// Series the rules and the dashboard name before any daemon exports them.
// None since the router exports ringlane_spec_* (issue 15; make serve drafts).
const PENDING_SERIES = [];
// Series Prometheus makes itself, not any /metrics.
const PROMETHEUS_SERIES = ['up'];

let failures = 0;
function fail(msg) { failures++; console.log(`FAIL ${msg}`); }
function ok(msg) { console.log(`ok   ${msg}`); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function api(path, params = {}) {
  const url = `${PROM}/api/v1/${path}?${new URLSearchParams(params)}`;
  const res = await fetch(url);
  const body = await res.json();
  if (body.status !== 'success') throw new Error(`${path} ${JSON.stringify(params)}: ${body.error}`);
  return body.data;
}
const query = async (q) => (await api('query', { query: q })).result;

// Polls fn until it returns true or timeout_ms passes.
async function until(what, timeout_ms, fn) {
  const end = Date.now() + timeout_ms;
  let last;
  for (;;) {
    try { if (await fn()) { ok(what); return true; } } catch (e) { last = e; }
    if (Date.now() > end) { fail(`${what} (within ${timeout_ms} ms)${last ? ': ' + last.message : ''}`); return false; }
    await sleep(250);
  }
}

async function rules() {
  const data = await api('rules', { type: 'alert' });
  return data.groups.flatMap((g) => g.rules);
}

async function healthy() {
  const jobs = { 'ringlane-router': 1, 'ringlane-worker': 2, 'ringlane-kvstore': 1 };
  await until('every daemon target is up (router 1, workers 2, kvstore 1)', 20000, async () => {
    const t = (await api('targets', { state: 'active' })).activeTargets;
    return Object.entries(jobs).every(([job, n]) =>
      t.filter((x) => x.labels.job === job && x.health === 'up').length === n);
  });
  for (const job of Object.keys(jobs)) {
    await until(`${job}: ringlane series stored`, 10000, async () => {
      const r = await query(`count({__name__=~"ringlane_.+", job="${job}"})`);
      return r.length === 1 && Number(r[0].value[1]) > 0;
    });
  }
  await until('the requests of run.sh are counted (generated tokens > 0, a gRPC call)', 10000, async () => {
    const a = await query('sum(ringlane_generation_tokens_total) > 0');
    const b = await query('sum(ringlane_grpc_requests_total) > 0');
    return a.length === 1 && b.length === 1;
  });
  // rate() and increase() need two samples of a series in their window.
  await until('three scrapes of the router since the traffic', 15000, async () => {
    const r = await query('min(count_over_time(ringlane_loops_detected_total[1m]))');
    return r.length === 1 && Number(r[0].value[1]) >= 3;
  });

  // Every rule loaded, healthy in Prometheus' own evaluation, and as expected.
  await until('every alert rule evaluated by Prometheus without error', 10000, async () => {
    const r = await rules();
    return r.length > 0 && r.every((x) => x.health === 'ok' && x.lastEvaluation !== '0001-01-01T00:00:00Z');
  });
  const loaded = await rules();
  const names = loaded.map((r) => r.name).sort();
  const expected = Object.keys(ALERTS).sort();
  if (JSON.stringify(names) !== JSON.stringify(expected)) {
    fail(`alert rules ${names.join(',')} != the table of check.mjs ${expected.join(',')}`);
  }
  for (const r of loaded) {
    const want = ALERTS[r.name];
    if (!want) continue;
    const probe = await query(want.probe);
    if (want.pending) {
      if (probe.length === 0) ok(`${r.name}: input deliberately empty (${want.pending})`);
      else fail(`${r.name}: input has data, so drop its pending note: ${JSON.stringify(probe)}`);
    } else if (probe.length > 0) ok(`${r.name}: input ${want.probe} has ${probe.length} series`);
    else fail(`${r.name}: input ${want.probe} returned nothing`);
    const whole = await query(r.query);
    const got = whole.length > 0 ? 'data' : 'empty';
    if (got === want.healthy) ok(`${r.name}: expression returns ${got} on the healthy cluster`);
    else fail(`${r.name}: expression returns ${got}, expected ${want.healthy}: ${JSON.stringify(whole)}`);
  }
  await dashboard();
}

// Every metric name in the dashboard's queries is one a daemon exports (read
// from each live /metrics, not from Prometheus), and every query runs.
async function dashboard() {
  const dash = JSON.parse(readFileSync(process.env.DASHBOARD, 'utf8'));
  const exported = new Set(PROMETHEUS_SERIES);
  for (const url of process.env.METRICS_URLS.split(/\s+/).filter(Boolean)) {
    const text = await (await fetch(url)).text();
    for (const line of text.split('\n')) {
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]/.exec(line);
      if (m) exported.add(m[1]);
    }
  }
  for (const s of PENDING_SERIES) {
    if (exported.has(s)) fail(`pending series ${s} is exported now: drop it from PENDING_SERIES`);
  }
  const panels = [];
  const walk = (ps) => { for (const p of ps || []) { panels.push(p); walk(p.panels); } };
  walk(dash.panels);
  if (!dash.templating.list.some((v) => v.name === 'datasource')) fail('dashboard has no datasource variable');
  let queries = 0;
  const funcs = new Set(['sum', 'rate', 'increase', 'histogram_quantile', 'avg', 'min', 'max', 'by',
    'le', 'count', 'on', 'and', 'or', 'without']);
  for (const p of panels.filter((x) => x.type !== 'row')) {
    if (!p.targets || p.targets.length === 0) { fail(`panel "${p.title}" has no query`); continue; }
    for (const t of p.targets) {
      queries++;
      // Grafana's variables as Prometheus sees them with every model selected.
      const expr = t.expr.replaceAll('$__rate_interval', '1m').replaceAll('$model', '.*');
      // Metric names: identifiers outside label matchers and by (...) lists.
      const bare = expr.replace(/\{[^}]*\}/g, '').replace(/\b(by|without|on)\s*\([^)]*\)/g, '')
        .replace(/\[[^\]]*\]/g, '');
      const idents = [...bare.matchAll(/[a-zA-Z_:][a-zA-Z0-9_:]*/g)].map((m) => m[0])
        .filter((w) => !funcs.has(w));
      if (idents.length === 0) fail(`panel "${p.title}" ${t.refId}: no metric in ${t.expr}`);
      const pending = idents.some((w) => PENDING_SERIES.includes(w));
      for (const w of idents) {
        if (!exported.has(w) && !PENDING_SERIES.includes(w)) {
          fail(`panel "${p.title}" ${t.refId}: ${w} is exported by no daemon`);
        }
      }
      const got = await query(expr);
      if (pending) {
        if (got.length === 0) ok(`panel "${p.title}" ${t.refId}: deliberately empty (pending series)`);
        else fail(`panel "${p.title}" ${t.refId}: pending series have data now`);
      } else if (got.length > 0) ok(`panel "${p.title}" ${t.refId}: ${idents.join(' ')} (${got.length} series)`);
      else fail(`panel "${p.title}" ${t.refId}: ${expr} returned nothing`);
    }
  }
  ok(`dashboard: ${panels.length} panels, ${queries} queries`);
}

// The named alert's own expression returns data, and Prometheus has it pending
// or firing.
async function fires(name, timeout_ms) {
  const rule = (await rules()).find((r) => r.name === name);
  if (!rule) { fail(`no rule ${name}`); return; }
  await until(`${name}: expression returns data`, timeout_ms, async () => (await query(rule.query)).length > 0);
  await until(`${name}: alert pending or firing in Prometheus`, timeout_ms, async () => {
    const a = (await api('alerts')).alerts;
    return a.some((x) => x.labels.alertname === name && (x.state === 'pending' || x.state === 'firing'));
  });
}

if (phase === 'scraped') {
  // Counters Prometheus has seen at their old value, so that an increase made
  // afterwards shows in increase().
  await until('the router scraped twice', 15000, async () => {
    const r = await query('min(count_over_time(ringlane_loops_detected_total[1m]))');
    return r.length === 1 && Number(r[0].value[1]) >= 2;
  });
} else if (phase === 'healthy') await healthy();
else if (phase === 'kvstore-down') {
  await fires('RinglaneKvstoreDown', 10000);
  await fires('RinglaneKvstoreUnreachable', 10000);
} else if (phase === 'worker-down') {
  await fires('RinglaneWorkerDown', 10000);
  await fires('RinglaneWorkerGroupNotReady', 15000);
} else { console.log(`unknown phase ${phase}`); process.exit(2); }
if (failures > 0) { console.log(`${failures} check(s) failed`); process.exit(1); }
