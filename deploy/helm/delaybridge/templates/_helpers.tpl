{{/*
Names and labels. Every helper takes the chart's context: the root context in
this chart, or .Subcharts.delaybridge in an application chart that has this
chart as a dependency (the sidecar shape).
*/}}

{{- define "delaybridge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delaybridge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "delaybridge.configMapName" -}}
{{- printf "%s-config" (include "delaybridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delaybridge.secretName" -}}
{{- if .Values.secret.name -}}
{{- .Values.secret.name -}}
{{- else if .Values.secret.create -}}
{{- printf "%s-secrets" (include "delaybridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- fail "secret.name: give the name of the Secret you made (secret.create is false)" -}}
{{- end -}}
{{- end -}}

{{- define "delaybridge.serviceName" -}}
{{- printf "%s-admin" (include "delaybridge.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "delaybridge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "delaybridge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "delaybridge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "delaybridge.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | toString | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "delaybridge.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default (toString .Chart.AppVersion) .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
delaybridge.seconds: a Go duration ("20s", "1m30s", "500ms") as whole seconds,
rounded up. Used for the grace period, which must cover shutdown_timeout.
*/}}
{{- define "delaybridge.seconds" -}}
{{- $d := toString . -}}
{{- $num := "([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" -}}
{{- $unit := "(ns|us|µs|μs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^(%s%s)+$" $num $unit) $d) -}}
{{- fail (printf "config.shutdown_timeout: %q is not a duration; write it with a unit, e.g. 20s" $d) -}}
{{- end -}}
{{- $per := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "μs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll (printf "%s%s" $num $unit) $d -1 -}}
{{- $n := regexFind (printf "^%s" $num) . -}}
{{- $u := trimPrefix $n . -}}
{{- $total = addf $total (mulf (float64 $n) (get $per $u)) -}}
{{- end -}}
{{- ceil $total | int -}}
{{- end -}}

{{/* shutdown_timeout in seconds, with delaybridge's default (30s) when unset. */}}
{{- define "delaybridge.shutdownSeconds" -}}
{{- include "delaybridge.seconds" (default "30s" .Values.config.shutdown_timeout) -}}
{{- end -}}

{{/*
delaybridge.graceSeconds: the pod's terminationGracePeriodSeconds for the
Deployment: the value given, which must be at least shutdown_timeout + 5s, or
shutdown_timeout + 10s. (deploy/README.md, "Stopping": the 5s cover closing
connections, the process exit and a loaded node's scheduling delay.)
*/}}
{{- define "delaybridge.graceSeconds" -}}
{{- $shutdown := include "delaybridge.shutdownSeconds" . | int -}}
{{- $grace := .Values.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- add $shutdown 10 -}}
{{- else if lt (int $grace) (add $shutdown 5 | int) -}}
{{- fail (printf "terminationGracePeriodSeconds: %v is less than config.shutdown_timeout (%ds) + 5s: the kubelet would SIGKILL a graceful stop; give at least %d" $grace $shutdown (add $shutdown 5)) -}}
{{- else -}}
{{- int $grace -}}
{{- end -}}
{{- end -}}

{{/* The admin server's address: the pod's loopback for the sidecar, every interface otherwise. */}}
{{- define "delaybridge.listen" -}}
{{- if .Values.sidecar.enabled -}}
{{- printf "127.0.0.1:%d" (int .Values.adminPort) -}}
{{- else -}}
{{- printf "0.0.0.0:%d" (int .Values.adminPort) -}}
{{- end -}}
{{- end -}}

{{/* Whether the configuration gets admin.token: ${DELAYBRIDGE_ADMIN_TOKEN}. */}}
{{- define "delaybridge.hasToken" -}}
{{- $admin := .Values.config.admin | default dict -}}
{{- if or $admin.token $admin.token_file -}}
{{- else if not .Values.sidecar.enabled -}}
true
{{- else if .Values.secret.adminToken -}}
true
{{- end -}}
{{- end -}}

{{/*
delaybridge.config: the configuration file: .Values.config with the
chart-managed keys set.
*/}}
{{- define "delaybridge.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $admin := deepCopy ($cfg.admin | default dict) -}}
{{- if hasKey $admin "listen" -}}
{{- fail "config.admin.listen is set by the chart (0.0.0.0 or, with sidecar.enabled, 127.0.0.1, and adminPort): remove it and set adminPort" -}}
{{- end -}}
{{- $_ := set $admin "listen" (include "delaybridge.listen" .) -}}
{{- if include "delaybridge.hasToken" . -}}
{{- $_ := set $admin "token" "${DELAYBRIDGE_ADMIN_TOKEN}" -}}
{{- end -}}
{{- $_ := set $cfg "admin" $admin -}}
{{- if not .Values.sidecar.enabled -}}
{{- if not (or $admin.token $admin.token_file) -}}
{{- fail "config.admin: the Deployment's admin server listens on the pod IP, so /v1/ needs a token: leave admin.token unset (the chart sets ${DELAYBRIDGE_ADMIN_TOKEN} from the Secret) or give token_file" -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* A checksum of the configuration and the Secret's values, so that pods roll when they change. */}}
{{- define "delaybridge.checksum" -}}
{{- printf "%s\n%s" (include "delaybridge.config" .) (toYaml .Values.secret) | sha256sum -}}
{{- end -}}

{{/* GOMEMLIMIT: goMemLimit, or 90% of resources.limits.memory in Ki, Mi or Gi (rounded down); "" for none. */}}
{{- define "delaybridge.goMemLimit" -}}
{{- $v := toString .Values.goMemLimit -}}
{{- if eq $v "off" -}}
{{- else if $v -}}
{{- $v -}}
{{- else -}}
{{- $lim := "" -}}
{{- with .Values.resources -}}{{- with .limits -}}{{- $lim = toString (.memory | default "") -}}{{- end -}}{{- end -}}
{{- if regexMatch "^[0-9]+(Ki|Mi|Gi)$" $lim -}}
{{- $n := regexFind "^[0-9]+" $lim | int -}}
{{- $u := trimPrefix (toString $n) $lim -}}
{{- if eq $u "Ki" -}}
{{- printf "%dKiB" (div (mul $n 9) 10) -}}
{{- else -}}
{{- printf "%dMiB" (div (mul $n (get (dict "Mi" 1 "Gi" 1024) $u) 9) 10) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
delaybridge.container: the delaybridge container, for the Deployment
(httpGet probes on the named port) or the sidecar (an init container with
restartPolicy: Always and exec probes, since its admin server is on the pod's
loopback, where the kubelet's httpGet cannot reach).
*/}}
{{- define "delaybridge.container" -}}
{{- $sidecar := .Values.sidecar.enabled -}}
{{- $port := int .Values.adminPort -}}
- name: delaybridge
  image: {{ include "delaybridge.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  {{- if $sidecar }}
  restartPolicy: Always
  {{- end }}
  args: ["run", "--config", "/etc/delaybridge/config.yaml"]
  envFrom:
    - secretRef:
        name: {{ include "delaybridge.secretName" . }}
  {{- $gml := include "delaybridge.goMemLimit" . }}
  {{- if or $gml .Values.extraEnv }}
  env:
    {{- with $gml }}
    - name: GOMEMLIMIT
      value: {{ . | quote }}
    {{- end }}
    {{- with .Values.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- end }}
  {{- if not $sidecar }}
  ports:
    - name: admin
      containerPort: {{ $port }}
      protocol: TCP
  {{- end }}
  {{- range $probe, $path := dict "startup" "/healthz" "liveness" "/healthz" "readiness" "/readyz" }}
  {{ $probe }}Probe:
    {{- if $sidecar }}
    exec:
      command: ["/usr/local/bin/delaybridge", "health", "--url", "http://127.0.0.1:{{ $port }}{{ $path }}", "--timeout", "2s"]
    {{- else }}
    httpGet:
      path: {{ $path }}
      port: admin
    {{- end }}
    {{- toYaml (get $.Values.probes $probe) | nindent 4 }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  securityContext:
    {{- if $sidecar }}
    {{- /* the app's pod runs as the app's user: delaybridge's own settings go on its container */}}
    runAsNonRoot: true
    {{- with pick .Values.podSecurityContext "runAsUser" "runAsGroup" "seccompProfile" }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- end }}
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
  volumeMounts:
    - name: {{ include "delaybridge.configMapName" . }}
      mountPath: /etc/delaybridge
      readOnly: true
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The pod's volumes for the container above: the ConfigMap, and extraVolumes. */}}
{{- define "delaybridge.volumes" -}}
- name: {{ include "delaybridge.configMapName" . }}
  configMap:
    name: {{ include "delaybridge.configMapName" . }}
    items:
      - key: config.yaml
        path: config.yaml
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The sidecar shape, for an application chart that has this chart as a
dependency with sidecar.enabled: true. In its pod template (see README.md):

  metadata:
    annotations:
      checksum/delaybridge: {{ include "delaybridge.checksum" .Subcharts.delaybridge }}
  spec:
    terminationGracePeriodSeconds: {{ add 30 (include "delaybridge.sidecar.graceSeconds" .Subcharts.delaybridge) }}
    initContainers:
      {{- include "delaybridge.sidecar.container" .Subcharts.delaybridge | nindent 6 }}
    containers:
      - name: app
        env:
          - name: DELAYBRIDGE_URL
            value: {{ include "delaybridge.sidecar.url" .Subcharts.delaybridge }}
    volumes:
      {{- include "delaybridge.sidecar.volumes" .Subcharts.delaybridge | nindent 6 }}
*/}}

{{- define "delaybridge.sidecar.check" -}}
{{- if not .Values.sidecar.enabled -}}
{{- fail "delaybridge.sidecar.*: set sidecar.enabled: true in the delaybridge values (the admin server must be on the pod's loopback, with exec probes)" -}}
{{- end -}}
{{- if not (semverCompare ">=1.29.0-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "sidecar.enabled: native sidecars (an init container with restartPolicy: Always) need Kubernetes 1.29 or later; this is %s" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}

{{/* The init container entry (a native sidecar): it is ready before the app starts and stops after it. */}}
{{- define "delaybridge.sidecar.container" -}}
{{- include "delaybridge.sidecar.check" . -}}
{{- include "delaybridge.container" . -}}
{{- end -}}

{{- define "delaybridge.sidecar.volumes" -}}
{{- include "delaybridge.sidecar.check" . -}}
{{- include "delaybridge.volumes" . -}}
{{- end -}}

{{/* Where the app reaches the admin API: http://127.0.0.1:<adminPort>. */}}
{{- define "delaybridge.sidecar.url" -}}
{{- printf "http://127.0.0.1:%d" (int .Values.adminPort) -}}
{{- end -}}

{{/*
The seconds the sidecar needs after the app has stopped: shutdown_timeout +
5s. The pod's terminationGracePeriodSeconds is the app's own stop time plus
this (Kubernetes stops the app first, then the sidecar, within the period).
*/}}
{{- define "delaybridge.sidecar.graceSeconds" -}}
{{- add (include "delaybridge.shutdownSeconds" . | int) 5 -}}
{{- end -}}

{{/* The Prometheus job of the scraped series (serviceMonitor.job, else the full name). */}}
{{- define "delaybridge.job" -}}
{{- default (include "delaybridge.fullname" .) .Values.serviceMonitor.job -}}
{{- end -}}

{{- define "delaybridge.monitoring.check" -}}
{{- if .Values.sidecar.enabled -}}
{{- fail (printf "%s.enabled: the sidecar's admin server is on the pod's loopback, where Prometheus cannot scrape it; turn it off with sidecar.enabled" .what) -}}
{{- end -}}
{{- end -}}
