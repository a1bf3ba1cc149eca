// Validates one rendering of deploy/helm/ringlane (tests/helm/run.sh):
//   node validate.mjs RENDERED.yaml VALUES.yaml[,VALUES.yaml...] BUILD
// - every object against the Kubernetes schemas of kubernetes-models and the
//   prometheus-operator models (@kubernetes-models/prometheus-operator);
// - Services select their workload's pods and name its ports; probes name
//   container ports; ServiceMonitors select the Services and give the jobs
//   the names of deploy/prometheus;
// - the worker's start script run for every rank (with the daemon's exec
//   replaced by printing its argv), the router's and kvstore's args: every flag
//   is one the daemon built in BUILD accepts (its --helpfull), ranks 0..W-1
//   once each, --world_size and replicas = worker.worldSize, the rendezvous
//   only on ranks other than 0 and equal to rank 0's address, the router's
//   --workers = every rank's address in rank order, listen and metrics ports =
//   the declared container ports, the workers' --kvstore = the kvstore's port;
// - the dashboard ConfigMap is deploy/grafana/ringlane.json and the
//   PrometheusRule is deploy/prometheus/ringlane-alerts.yml (TTFT threshold
//   from values).
import { readFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { parseAllDocuments, parse } from 'yaml';
import * as core from 'kubernetes-models/v1';
import * as apps from 'kubernetes-models/apps/v1';
import * as monitoring from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';

const [renderedFile, valuesFiles, build] = process.argv.slice(2);
const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../..');
const models = { v1: core, 'apps/v1': apps, 'monitoring.coreos.com/v1': monitoring };

let failures = 0;
const fail = (m) => { failures++; console.log(`FAIL ${m}`); };
const ok = (m) => console.log(`ok   ${m}`);
const check = (cond, m) => (cond ? ok(m) : fail(m));
// JSON with sorted keys: deep equality whatever the key order.
const canon = (v) => JSON.stringify(v, (k, x) => (x && typeof x === 'object' && !Array.isArray(x)
  ? Object.fromEntries(Object.keys(x).sort().map((key) => [key, x[key]])) : x));

// values.yaml with the value files over it, merged as the renderer does.
const merge = (a, b) => {
  for (const [k, v] of Object.entries(b || {})) {
    if (v && typeof v === 'object' && !Array.isArray(v) && a[k] && typeof a[k] === 'object' && !Array.isArray(a[k])) merge(a[k], v);
    else a[k] = v;
  }
  return a;
};
const values = [path.join(root, 'deploy/helm/ringlane/values.yaml'), ...valuesFiles.split(',')]
  .reduce((acc, f) => merge(acc, parse(readFileSync(f, 'utf8'))), {});

// 1. Schemas.
const docs = parseAllDocuments(readFileSync(renderedFile, 'utf8'));
const objs = [];
for (const d of docs) {
  if (d.errors.length) { fail(`YAML: ${d.errors[0].message}`); continue; }
  const o = d.toJS();
  if (!o) continue;
  const Model = models[o.apiVersion]?.[o.kind];
  const name = `${o.kind} ${o.metadata?.name}`;
  if (!Model) { fail(`${name}: no model for ${o.apiVersion}`); continue; }
  try { new Model(o).validate(); ok(`${name} (${o.apiVersion}) is valid`); } catch (e) { fail(`${name}: ${e.message}`); }
  objs.push(o);
}
const find = (kind, suffix) => objs.find((o) => o.kind === kind && o.metadata.name.endsWith(suffix));
const sts = find('StatefulSet', '-worker');
const ds = find('DaemonSet', '-kvstore');
const dep = find('Deployment', '-router');
if (!sts || !dep || (values.kvstore.enabled && !ds)) { fail('worker StatefulSet, router Deployment or kvstore DaemonSet missing'); process.exit(1); }

// 2. Wiring between objects.
const podOf = (w) => w.spec.template;
const containerPorts = (w) => Object.fromEntries(podOf(w).spec.containers[0].ports.map((p) => [p.name, p.containerPort]));
const matches = (sel, labels) => Object.entries(sel).every(([k, v]) => labels[k] === v);
for (const svc of objs.filter((o) => o.kind === 'Service')) {
  const w = [sts, ds, dep].filter(Boolean).find((x) => matches(svc.spec.selector, podOf(x).metadata.labels));
  if (!w) { fail(`Service ${svc.metadata.name} selects no workload`); continue; }
  check(matches(w.spec.selector.matchLabels, podOf(w).metadata.labels), `${w.kind} ${w.metadata.name}: its selector matches its pods`);
  const cp = containerPorts(w);
  for (const p of svc.spec.ports) {
    check(cp[p.targetPort] !== undefined, `Service ${svc.metadata.name} port ${p.name} -> ${w.kind} port ${p.targetPort} (${cp[p.targetPort]})`);
  }
}
check(sts.spec.serviceName === find('Service', '-worker')?.metadata.name && find('Service', '-worker').spec.clusterIP === 'None',
  'the StatefulSet names the headless worker Service');
for (const w of [sts, ds, dep].filter(Boolean)) {
  const c = podOf(w).spec.containers[0];
  const cp = containerPorts(w);
  for (const kind of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
    const p = c[kind];
    if (!p) { fail(`${w.kind} ${w.metadata.name}: no ${kind}`); continue; }
    const port = p.grpc?.port ?? p.tcpSocket?.port ?? p.httpGet?.port;
    const known = typeof port === 'string' ? cp[port] !== undefined : Object.values(cp).includes(port);
    check(known, `${w.kind} ${w.metadata.name} ${kind}: ${Object.keys(p).find((k) => ['grpc', 'tcpSocket', 'httpGet'].includes(k))} on a declared port (${port})`);
  }
  const sc = podOf(w).spec.securityContext;
  check(sc.runAsNonRoot === true && c.securityContext.allowPrivilegeEscalation === false, `${w.kind} ${w.metadata.name}: non-root, no privilege escalation`);
}
const grpcProbes = !values.tls.enabled;
const wc = podOf(sts).spec.containers[0];
if (grpcProbes) {
  check(wc.startupProbe.grpc?.service === 'ringlane.v1.Worker' && wc.readinessProbe.grpc?.service === 'ringlane.v1.Worker',
    'workers: native gRPC startup and readiness probes of ringlane.v1.Worker');
  if (ds) check(podOf(ds).spec.containers[0].readinessProbe.grpc?.service === 'ringlane.v1.KvStore', 'kvstore: native gRPC probes of ringlane.v1.KvStore');
} else {
  // The kubelet speaks no TLS to gRPC probes: they ask the plaintext,
  // health-only port (--health_listen).
  check(wc.startupProbe.grpc?.port === values.worker.ports.health && wc.readinessProbe.grpc?.service === 'ringlane.v1.Worker',
    'workers under mutual TLS: gRPC probes of ringlane.v1.Worker on the health port');
  if (ds) {
    const kp = podOf(ds).spec.containers[0].readinessProbe.grpc;
    check(kp?.port === values.kvstore.ports.health && kp?.service === 'ringlane.v1.KvStore',
      'kvstore under mutual TLS: gRPC probes of ringlane.v1.KvStore on the health port');
  }
}
const startupS = wc.startupProbe.periodSeconds * wc.startupProbe.failureThreshold;
check(startupS === values.worker.startupProbe.periodSeconds * values.worker.startupProbe.failureThreshold,
  `workers: startup probe allows ${startupS} s for the model to load`);
const rc = podOf(dep).spec.containers[0];
check(rc.readinessProbe.httpGet?.path === '/ready' && rc.livenessProbe.httpGet?.path === '/health', 'router: HTTP readiness /ready, liveness /health');

// Worker pod: identity, placement, devices, NCCL, volumes.
const wspec = podOf(sts).spec;
check(sts.spec.replicas === values.worker.worldSize, `worker replicas = worldSize ${values.worker.worldSize}`);
check(wspec.hostNetwork === values.worker.hostNetwork, `worker hostNetwork = ${values.worker.hostNetwork}`);
const anti = wspec.affinity?.podAntiAffinity;
if (values.worker.antiAffinity === 'required') {
  check(anti?.requiredDuringSchedulingIgnoredDuringExecution?.[0]?.topologyKey === 'kubernetes.io/hostname', 'workers: required anti-affinity per node');
} else if (values.worker.antiAffinity === 'preferred') {
  check(anti?.preferredDuringSchedulingIgnoredDuringExecution?.[0]?.podAffinityTerm?.topologyKey === 'kubernetes.io/hostname', 'workers: preferred anti-affinity per node');
}
const caps = wc.securityContext.capabilities.add || [];
check(caps.includes('IPC_LOCK') === Boolean(values.worker.ipcLock), `workers: IPC_LOCK ${values.worker.ipcLock ? 'added' : 'not added'}`);
if (values.worker.rdma.resourceName) {
  check(wc.resources.limits[values.worker.rdma.resourceName] === values.worker.rdma.count, `workers: ${values.worker.rdma.resourceName} requested`);
}
const env = Object.fromEntries(wc.env.map((e) => [e.name, e.value ?? e.valueFrom]));
const nccl = values.worker.nccl;
for (const [k, v] of [['NCCL_SOCKET_IFNAME', nccl.socketIfname], ['NCCL_IB_HCA', nccl.ibHca], ['NCCL_IB_GID_INDEX', nccl.ibGidIndex], ['NCCL_ALGO', nccl.algo], ...Object.entries(nccl.extraEnv || {})]) {
  if (v) check(env[k] === String(v), `workers: ${k}=${v}`);
  else check(!(k in env), `workers: ${k} unset`);
}
const vols = Object.fromEntries(wspec.volumes.map((v) => [v.name, v]));
check(vols.shm?.emptyDir?.medium === 'Memory', 'workers: /dev/shm is a memory volume');
check(wc.volumeMounts.some((m) => m.name === 'model' && m.mountPath === values.model.mountPath && m.readOnly), 'workers: the model volume, read-only');
check(values.model.path.startsWith(values.model.mountPath + '/'), 'model.path lies in the model volume');
if (values.worker.ringNodes?.length) {
  const names = wspec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values;
  check(JSON.stringify(names) === JSON.stringify(values.worker.ringNodes.map((n) => n.name)), 'workers: only on the ring nodes');
}

// 3. The daemons' argv against their flags.
const flagsOf = (bin) => {
  let out = '';
  try { out = execFileSync(path.join(build, bin), ['--helpfull'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] }); } catch (e) { out = (e.stdout || '') + (e.stderr || ''); }
  return new Set([...out.matchAll(/^\s+--([a-z_0-9]+)/gm)].map((m) => m[1]));
};
const known = { worker: flagsOf('worker/ringlane-worker'), router: flagsOf('router/ringlane-router'), kvstore: flagsOf('kvstore/ringlane-kvstore') };
const parseArgs = (argv) => {
  const m = {};
  for (const a of argv) {
    const r = /^--([a-z_0-9]+)(?:=(.*))?$/.exec(a);
    if (!r) { fail(`argument ${a} is not --flag[=value]`); continue; }
    m[r[1]] = r[2] ?? true;
  }
  return m;
};
const checkFlags = (daemon, flags, who) => {
  const unknown = Object.keys(flags).filter((f) => !known[daemon].has(f));
  check(known[daemon].size > 10 && unknown.length === 0, `${who}: every flag is one ringlane-${daemon} accepts${unknown.length ? ' (unknown: ' + unknown.join(', ') + ')' : ''}`);
};
const bin = values.image.binDir;
const router = parseArgs(rc.args);
check(rc.command[0] === `${bin}/ringlane-router`, 'router: runs ringlane-router');
checkFlags('router', router, 'router');
const workers = String(router.workers).split(',');
check(workers.length === values.worker.worldSize, `router --workers lists ${workers.length} ranks`);
const rcp = containerPorts(dep);
check(Number(router.listen.split(':').pop()) === rcp.grpc && Number(router.http_listen.split(':').pop()) === rcp.http, 'router: --listen and --http_listen ports are the declared ones');

let kvPort = null;
if (ds) {
  const kc = podOf(ds).spec.containers[0];
  const kv = parseArgs(kc.args);
  checkFlags('kvstore', kv, 'kvstore');
  const kcp = containerPorts(ds);
  kvPort = Number(kv.listen.split(':').pop());
  check(kvPort === kcp.grpc && Number(kv.metrics_port) === kcp.metrics, 'kvstore: --listen and --metrics_port are the declared ports');
  if (values.kvstore.disk.enabled) {
    const vol = podOf(ds).spec.volumes.find((v) => v.name === 'disk');
    const init = (podOf(ds).spec.initContainers || []).find((c) => c.name === 'disk-owner');
    check(vol?.hostPath?.path === values.kvstore.disk.hostPath && kc.volumeMounts.some((m) => m.name === 'disk' && m.mountPath === kv.disk_dir),
      `kvstore: --disk_dir=${kv.disk_dir} is the hostPath ${values.kvstore.disk.hostPath}`);
    check(init && init.command.join(' ') === `/bin/chown 10001:10001 ${kv.disk_dir}` && init.volumeMounts.some((m) => m.name === 'disk' && m.mountPath === kv.disk_dir),
      'kvstore: an init container gives the disk directory to user 10001');
  }
  // The workers dial $HOST_IP:port: the kvstore is there on the host network,
  // or behind a hostPort of that port.
  const envOf = Object.fromEntries(kc.env.map((e) => [e.name, e.valueFrom?.fieldRef?.fieldPath]));
  if (podOf(ds).spec.hostNetwork) {
    check(kv.listen.startsWith('$(HOST_IP):') && envOf.HOST_IP === 'status.hostIP', 'kvstore: on the host network, listens on its node address');
  } else {
    const gp = kc.ports.find((p) => p.name === 'grpc');
    check(kv.listen.startsWith('$(POD_IP):') && envOf.POD_IP === 'status.podIP' && gp.hostPort === kvPort,
      `kvstore: listens on its pod IP, reached at the node address through hostPort ${gp.hostPort}`);
  }
}

const script = wc.args[0];
check(wc.command.join(' ') === '/bin/sh -ec', 'workers: start script under sh -e');
const execLine = `exec ${bin}/ringlane-worker`;
check(script.includes(execLine), 'workers: the script execs ringlane-worker');
const wcp = containerPorts(sts);
const seen = new Set();
let rank0Address = null;
for (let r = 0; r < values.worker.worldSize; r++) {
  const ring = values.worker.ringNodes?.length ? values.worker.ringNodes : null;
  // The pod a rank runs in: with ringNodes, the node decides the rank, so put
  // the pods on the nodes in reverse order of their ordinals.
  const podEnv = ring
    ? { POD_NAME: `${sts.metadata.name}-${values.worker.worldSize - 1 - r}`, NODE_NAME: ring[r].name, POD_IP: `10.9.0.${r + 1}` }
    : { POD_NAME: `${sts.metadata.name}-${r}`, NODE_NAME: `node-${r}`, POD_IP: `10.9.0.${r + 1}` };
  podEnv.HOST_IP = `10.8.0.${r + 1}`;
  const out = execFileSync('/bin/sh', ['-ec', script.replace(execLine, "exec printf '%s\\n'")],
    { encoding: 'utf8', env: { PATH: process.env.PATH, ...podEnv } });
  const a = parseArgs(out.split('\n').filter(Boolean));
  const who = `rank ${r} (pod ${podEnv.POD_NAME} on ${podEnv.NODE_NAME})`;
  checkFlags('worker', a, who);
  check(Number(a.rank) === r, `${who}: --rank=${a.rank}`);
  seen.add(Number(a.rank));
  check(Number(a.world_size) === values.worker.worldSize, `${who}: --world_size=${a.world_size}`);
  const [host, port] = [a.listen.slice(0, a.listen.lastIndexOf(':')), Number(a.listen.split(':').pop())];
  check(port === wcp.grpc && Number(a.metrics_port) === wcp.metrics, `${who}: --listen port ${port} and --metrics_port ${a.metrics_port} are declared`);
  // Every port of --collective_ports is a declared container port, and no
  // other port is declared.
  const [lo, hi] = String(a.collective_ports).split('-').map(Number);
  const declaredColl = Object.entries(wcp).filter(([n]) => n.startsWith('coll-')).map(([, p]) => p).sort((x, y) => x - y);
  const range = [];
  for (let p = lo; p <= hi; p++) range.push(p);
  check(lo >= 1 && JSON.stringify(declaredColl) === JSON.stringify(range),
    `${who}: --collective_ports=${a.collective_ports}, each port declared (${declaredColl.join(', ')})`);
  // Under mutual TLS, the plaintext health port too, and --health_listen is on it.
  const health = values.tls.enabled ? 1 : 0;
  if (health) {
    check(a.health_listen === `${host}:${wcp.health}`, `${who}: --health_listen=${a.health_listen} on the declared health port`);
  } else {
    check(a.health_listen === undefined, `${who}: no health-only port without TLS`);
  }
  check(Object.keys(wcp).length === 2 + health + range.length,
    `${who}: the container declares gRPC, metrics${health ? ', health' : ''} and the collective ports only`);
  // Where the router dials this rank: its ring address, or its pod's DNS name.
  const dialled = workers[r];
  if (ring) check(dialled === `${host}:${port}` && host === ring[r].address, `${who}: listens on ${a.listen}, where the router dials it`);
  else {
    const svc = sts.spec.serviceName;
    check(dialled === `${podEnv.POD_NAME}.${svc}.${sts.metadata.namespace}.svc.${values.clusterDomain}:${port}` && host === podEnv.POD_IP,
      `${who}: listens on its pod IP; the router dials ${dialled}`);
  }
  if (r === 0) { check(a.rendezvous === undefined, `${who}: serves the rendezvous (no --rendezvous)`); rank0Address = dialled; }
  else check(a.rendezvous === rank0Address, `${who}: --rendezvous=${a.rendezvous} is rank 0's address`);
  if (kvPort !== null) check(a.kvstore === `${podEnv.HOST_IP}:${kvPort}`, `${who}: --kvstore=${a.kvstore}, its node's kvstore`);
  check(a.model === values.model.path && a.group === values.worker.group, `${who}: --model and --group from values`);
  if (values.tls.enabled) check(a.tls_ca && a.tls_cert && a.tls_key && !a.allow_plaintext, `${who}: mutual TLS from the Secret`);
  else check(a.allow_plaintext === true, `${who}: --allow_plaintext without TLS`);
}
check(seen.size === values.worker.worldSize, `ranks 0..${values.worker.worldSize - 1} once each`);

// 4. Secrets.
if (values.tls.enabled) {
  for (const w of [sts, ds, dep].filter(Boolean)) {
    check(podOf(w).spec.volumes.some((v) => v.secret?.secretName === values.tls.secretName), `${w.kind} ${w.metadata.name}: TLS from Secret ${values.tls.secretName}`);
  }
  check(router.tls_ca && router.tls_cert && router.tls_key, 'router: mutual TLS to the workers');
}
if (values.apiKeys.secretName) {
  const mount = rc.volumeMounts.find((m) => m.name === 'api-keys');
  check(podOf(dep).spec.volumes.some((v) => v.secret?.secretName === values.apiKeys.secretName) && mount &&
    router.api_key_file === `${mount.mountPath}/${values.apiKeys.key}`, `router: --api_key_file from Secret ${values.apiKeys.secretName}`);
}

// 5. Monitoring objects.
const m = values.monitoring;
const sms = objs.filter((o) => o.kind === 'ServiceMonitor');
if (m.serviceMonitor.enabled) {
  for (const sm of sms) {
    const svc = objs.find((o) => o.kind === 'Service' && matches(sm.spec.selector.matchLabels, o.metadata.labels));
    const job = svc?.metadata.labels[sm.spec.jobLabel];
    check(svc && /^ringlane-(router|worker|kvstore)$/.test(job) && svc.spec.ports.some((p) => p.name === sm.spec.endpoints[0].port),
      `ServiceMonitor ${sm.metadata.name}: Service ${svc?.metadata.name}, job ${job}, port ${sm.spec.endpoints[0].port}`);
  }
  check(sms.length === (ds ? 3 : 2), `${sms.length} ServiceMonitors`);
} else check(sms.length === 0, 'no ServiceMonitor when disabled');
const pr = objs.find((o) => o.kind === 'PrometheusRule');
if (m.prometheusRule.enabled) {
  const shipped = parse(readFileSync(path.join(root, 'deploy/prometheus/ringlane-alerts.yml'), 'utf8'));
  for (const rule of shipped.groups[0].rules) {
    if (rule.alert === 'RinglaneTimeToFirstTokenHigh') rule.expr = rule.expr.replace(/> [0-9.]+$/, `> ${m.prometheusRule.ttftP95Seconds}`);
  }
  check(pr && canon(pr.spec.groups) === canon(shipped.groups), `PrometheusRule = deploy/prometheus/ringlane-alerts.yml (TTFT p95 > ${m.prometheusRule.ttftP95Seconds} s)`);
} else check(!pr, 'no PrometheusRule when disabled');
const cm = find('ConfigMap', '-dashboard');
if (m.grafanaDashboard.enabled) {
  const shipped = readFileSync(path.join(root, 'deploy/grafana/ringlane.json'), 'utf8');
  let parsed = null;
  try { parsed = JSON.parse(cm.data['ringlane.json']); } catch (e) { fail(`dashboard ConfigMap: ${e.message}`); }
  check(parsed && cm.data['ringlane.json'].trim() === shipped.trim(), 'dashboard ConfigMap = deploy/grafana/ringlane.json');
}

if (failures) { console.log(`${failures} check(s) failed`); process.exit(1); }
console.log(`validate: ${objs.length} objects of ${path.basename(renderedFile)} pass`);
