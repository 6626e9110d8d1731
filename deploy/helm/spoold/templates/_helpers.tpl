{{/*
The objects' name: fullnameOverride if set; else the release's, with
"-spoold" (or "-" + nameOverride) unless it holds that already.
*/}}
{{- define "spoold.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default "spoold" .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "spoold.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "spoold.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret of the replicas' TLS files (cluster.tls). */}}
{{- define "spoold.peerTlsSecret" -}}
{{- default (printf "%s-peer-tls" (include "spoold.fullname" .)) .Values.cluster.tls.existingSecret -}}
{{- end -}}

{{- define "spoold.selectorLabels" -}}
app.kubernetes.io/name: spoold
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "spoold.labels" -}}
{{ include "spoold.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{- define "spoold.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "spoold.secret" -}}
{{ required "auth.existingSecret: the Secret holding the API keys" .Values.auth.existingSecret }}
{{- end -}}

{{/*
spoold.toml for one pod. Called with (dict "root" $ "node" N): N is the
replica's index in cluster mode, -1 otherwise.
*/}}
{{- define "spoold.config" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $name := include "spoold.fullname" $root -}}
# Written by the spoold Helm chart (deploy/helm/spoold); contract: docs/contract.md §7.
[server]
{{- if eq $v.mode "sidecar" }}
# The app reaches /v1 over the pod's loopback; nothing outside the pod does.
listen = "127.0.0.1:8787"
drain_on_shutdown = true
{{- else }}
listen = "0.0.0.0:8787"
drain_on_shutdown = false
{{- end }}
metrics_listen = "0.0.0.0:{{ $v.metrics.port }}"
shutdown_grace = {{ $v.config.shutdownGrace | quote }}
max_body_bytes = {{ $v.config.maxBodyBytes | quote }}

[spool]
dir = "/var/lib/spoold/spool"
max_bytes = {{ $v.config.maxBytes | quote }}
segment_bytes = {{ $v.config.segmentBytes | quote }}

[log]
format = "json"

[events]
history_retention = {{ $v.config.events.historyRetention | quote }}
history_max_bytes = {{ $v.config.events.historyMaxBytes | quote }}
{{- if eq $v.mode "cluster" }}

[cluster]
node_id = {{ add1 .node }}
listen = "0.0.0.0:8788"
advertise = "{{ $name }}-{{ .node }}.{{ $name }}-peers:8788"
api_url = "http://{{ $name }}-{{ .node }}.{{ $name }}-peers:8787"
# The first start's voters; the secret comes from SPOOLD_CLUSTER_SECRET.
peers = { {{- range $i := until (int $v.cluster.replicas) }}{{ if $i }},{{ end }} {{ add1 $i }} = "{{ $name }}-{{ $i }}.{{ $name }}-peers:8788"{{ end }} }
{{- if $v.cluster.tls.enabled }}

# Mutual TLS between the replicas (cluster.tls), from the Secret mounted
# at /etc/spoold-tls.
[cluster.tls]
cert = "/etc/spoold-tls/tls.crt"
key = "/etc/spoold-tls/tls.key"
ca = "/etc/spoold-tls/ca.crt"
{{- end }}
{{- end }}

{{ $v.config.queues }}
{{- end -}}

{{/* The spoold container (a native sidecar in sidecar mode). */}}
{{- define "spoold.container" -}}
{{- $v := .Values -}}
- name: spoold
  image: {{ include "spoold.image" . | quote }}
  imagePullPolicy: {{ $v.image.pullPolicy }}
  {{- if eq $v.mode "sidecar" }}
  restartPolicy: Always
  {{- end }}
  {{- if eq $v.mode "cluster" }}
  # Each pod reads its own file; Kubernetes expands $(POD_NAME).
  args: ["run", "--config", "/etc/spoold/$(POD_NAME).toml"]
  {{- else }}
  args: ["run", "--config", "/etc/spoold/spoold.toml"]
  {{- end }}
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    - name: SPOOLD_API_KEYS
      valueFrom:
        secretKeyRef:
          name: {{ include "spoold.secret" . }}
          key: {{ $v.auth.keys.apiKeys }}
    {{- if eq $v.mode "cluster" }}
    - name: SPOOLD_CLUSTER_SECRET
      valueFrom:
        secretKeyRef:
          name: {{ include "spoold.secret" . }}
          key: {{ $v.auth.keys.clusterSecret }}
    {{- end }}
  ports:
    {{- if ne $v.mode "sidecar" }}
    - name: api
      containerPort: 8787
    {{- end }}
    {{- if eq $v.mode "cluster" }}
    - name: raft
      containerPort: 8788
    {{- end }}
    - name: metrics
      containerPort: {{ $v.metrics.port }}
  # A long replay is not a hang: up to 10 minutes to start. A sidecar's
  # app starts once spoold is ready; a replica is started once it serves
  # (ready waits for a primary).
  startupProbe:
    httpGet:
      path: {{ if eq $v.mode "sidecar" }}/readyz{{ else }}/healthz{{ end }}
      port: metrics
    periodSeconds: 2
    failureThreshold: 300
  readinessProbe:
    httpGet:
      path: /readyz
      port: metrics
    periodSeconds: 2
    failureThreshold: 3
  livenessProbe:
    httpGet:
      path: /healthz
      port: metrics
    periodSeconds: 10
    failureThreshold: 6
  lifecycle:
    # Give endpoints a moment to drop the pod before SIGTERM.
    preStop:
      sleep:
        seconds: 5
  resources:
    {{- toYaml $v.resources | nindent 4 }}
  securityContext:
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: ["ALL"]
  volumeMounts:
    - name: spool
      mountPath: /var/lib/spoold
    - name: config
      mountPath: /etc/spoold
      readOnly: true
    {{- if and (eq $v.mode "cluster") $v.cluster.tls.enabled }}
    - name: peer-tls
      mountPath: /etc/spoold-tls
      readOnly: true
    {{- end }}
{{- end -}}

{{/*
What every pod of the chart shares: the grace period (shutdown_grace +
the preStop pause + margin), its ServiceAccount without an API token
(spoold never calls the Kubernetes API; in sidecar mode the pod is the
app's, and so is its account), and where it may run. A cluster's
replicas go to different nodes (required) and spread over zones
(preferred) unless affinity or topologySpreadConstraints say otherwise.
*/}}
{{- define "spoold.podCommon" -}}
{{- $cluster := eq .Values.mode "cluster" -}}
terminationGracePeriodSeconds: 40
{{- if ne .Values.mode "sidecar" }}
serviceAccountName: {{ include "spoold.serviceAccountName" . }}
automountServiceAccountToken: false
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .Values.affinity }}
affinity:
  {{- toYaml .Values.affinity | nindent 2 }}
{{- else if $cluster }}
affinity:
  podAntiAffinity:
    requiredDuringSchedulingIgnoredDuringExecution:
      - topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "spoold.selectorLabels" . | nindent 12 }}
{{- end }}
{{- if .Values.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml .Values.topologySpreadConstraints | nindent 2 }}
{{- else if $cluster }}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: topology.kubernetes.io/zone
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "spoold.selectorLabels" . | nindent 8 }}
{{- end }}
{{- end -}}
