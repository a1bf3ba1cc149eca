{{/* The release's name prefix of every object (at most 40 characters, so
     "<name>-worker-N.<name>-worker" stays a valid DNS label). */}}
{{- define "ringlane.fullname" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "ringlane.labels" -}}
app.kubernetes.io/name: ringlane
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of one component: (dict "root" $ "component" "worker"). */}}
{{- define "ringlane.selectorLabels" -}}
app.kubernetes.io/name: ringlane
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "ringlane.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The headless Service of the workers, and rank R's address
     (dict "root" $ "rank" R): its pod's DNS name, or its ring node's address. */}}
{{- define "ringlane.workerService" -}}
{{- printf "%s-worker" (include "ringlane.fullname" .) -}}
{{- end -}}
{{- define "ringlane.workerAddress" -}}
{{- $v := .root.Values.worker -}}
{{- if $v.ringNodes -}}
{{- $n := index $v.ringNodes (int .rank) -}}
{{- printf "%s:%d" (required "worker.ringNodes[].address is required" $n.address) (int $v.ports.grpc) -}}
{{- else -}}
{{- $svc := include "ringlane.workerService" .root -}}
{{- printf "%s-%d.%s.%s.svc.%s:%d" $svc (int .rank) $svc .root.Release.Namespace .root.Values.clusterDomain (int $v.ports.grpc) -}}
{{- end -}}
{{- end -}}

{{/* The router's --workers: every rank's address, rank 0 first. */}}
{{- define "ringlane.workersFlag" -}}
{{- $root := . -}}
{{- $addrs := list -}}
{{- range $r := until (int .Values.worker.worldSize) -}}
{{- $addrs = append $addrs (include "ringlane.workerAddress" (dict "root" $root "rank" $r)) -}}
{{- end -}}
{{- join "," $addrs -}}
{{- end -}}

{{/* TLS flags of a daemon (or --allow_plaintext), one YAML list item each. */}}
{{- define "ringlane.tlsArgs" -}}
{{- if .Values.tls.enabled }}
- --tls_ca=/etc/ringlane/tls/ca.pem
- --tls_cert=/etc/ringlane/tls/node.pem
- --tls_key=/etc/ringlane/tls/node.key
{{- else }}
- --allow_plaintext
{{- end }}
{{- end -}}

{{- define "ringlane.tlsVolume" -}}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ .Values.tls.secretName }}
    defaultMode: 0440
{{- end }}
{{- end -}}
{{- define "ringlane.tlsMount" -}}
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/ringlane/tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Pod-level security: a non-root user; the image runs as 10001. */}}
{{- define "ringlane.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* A gRPC probe (the kubelet's own, plaintext only) or, under mutual TLS,
     which the kubelet cannot speak, a TCP probe of the same port:
     (dict "root" $ "port" P "service" S). */}}
{{- define "ringlane.grpcProbe" -}}
{{- /* Under mutual TLS the kubelet cannot present a certificate: it asks
       the daemon's plaintext, health-only port (--health_listen). */ -}}
grpc:
  port: {{ if .root.Values.tls.enabled }}{{ .healthPort }}{{ else }}{{ .port }}{{ end }}
  {{- if .service }}
  service: {{ .service }}
  {{- end }}
{{- end -}}

{{/* Values the chart cannot render with: fails with the reason. Included by
     every template that uses them. */}}
{{- define "ringlane.checkValues" -}}
{{- $v := .Values.worker -}}
{{- if lt (int $v.worldSize) 1 }}{{ fail "worker.worldSize must be at least 1" }}{{ end -}}
{{- if or (lt (int $v.collectivePorts.min) 1) (lt (int $v.collectivePorts.max) (int $v.collectivePorts.min)) (gt (int $v.collectivePorts.max) 65535) }}
{{- fail "worker.collectivePorts: min and max with 1 <= min <= max <= 65535" }}
{{- end -}}
{{- if and $v.ringNodes (ne (len $v.ringNodes) (int $v.worldSize)) }}
{{- fail (printf "worker.ringNodes has %d entries for worker.worldSize %d" (len $v.ringNodes) (int $v.worldSize)) }}
{{- end -}}
{{- end -}}
