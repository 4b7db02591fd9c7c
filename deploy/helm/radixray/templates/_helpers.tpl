{{/* Names and labels shared by every object of the release. */}}

{{- define "radixray.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "radixray.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "radixray.selectorLabels" -}}
app.kubernetes.io/name: {{ include "radixray.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "radixray.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "radixray.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "radixray.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The Secret holding the admin token, or "" when the admin API is off. */}}
{{- define "radixray.adminSecret" -}}
{{- if .Values.adminToken.existingSecret -}}
{{- .Values.adminToken.existingSecret -}}
{{- else if .Values.adminToken.create -}}
{{- printf "%s-admin" (include "radixray.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Environment of every Ray container (the router may be placed on any node); "" if none. */}}
{{- define "radixray.env" -}}
{{- $secret := include "radixray.adminSecret" . -}}
{{- if $secret -}}
- name: RADIXRAY_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ .Values.adminToken.secretKey }}
{{- end -}}
{{- end -}}

{{/*
The Serve config (serveConfigV2): the arguments of radixray.deploy.serve:build_app, the same
structure as deploy/serve_config.yaml.
*/}}
{{- define "radixray.serveConfig" -}}
{{- $v := .Values -}}
{{- $engine := deepCopy $v.engine -}}
{{- if not (kindIs "invalid" $v.hostPages) -}}
{{- $_ := set $engine "host_pages" $v.hostPages -}}
{{- end -}}
{{- $router := dict "num_cpus" $v.router.numCpus "max_ongoing_requests" $v.router.maxOngoingRequests "settings" $v.router.settings -}}
{{- if and $v.router.autoscaling $v.router.autoscaling.enabled -}}
{{- $_ := set $router "autoscaling_config" (dict "min_replicas" $v.router.autoscaling.minReplicas "max_replicas" $v.router.autoscaling.maxReplicas "initial_replicas" $v.router.replicas "target_ongoing_requests" $v.router.autoscaling.targetOngoingRequests) -}}
{{- else -}}
{{- $_ := set $router "num_replicas" $v.router.replicas -}}
{{- end -}}
{{- $workers := dict "num_cpus" $v.workers.cpusPerReplica "num_gpus" 1 "max_ongoing_requests" $v.workers.maxOngoingRequests -}}
{{- if $v.workers.autoscaling.enabled -}}
{{- $_ := set $workers "autoscaling_config" (dict "min_replicas" $v.workers.autoscaling.minReplicas "max_replicas" $v.workers.autoscaling.maxReplicas "initial_replicas" $v.workers.replicas "target_ongoing_requests" $v.workers.autoscaling.targetOngoingRequests) -}}
{{- else -}}
{{- $_ := set $workers "num_replicas" $v.workers.replicas -}}
{{- end -}}
{{- $args := dict "model" $v.model.name "policy" $v.router.policy "page_size" $v.router.pageSize "engine" $engine "router" $router "workers" $workers -}}
{{- if $v.model.servedName -}}
{{- $_ := set $args "served_model_name" $v.model.servedName -}}
{{- end -}}
{{- $app := dict "name" "radixray" "route_prefix" "/" "import_path" "radixray.deploy.serve:build_app" "args" $args -}}
{{- $cfg := dict "proxy_location" "EveryNode" "http_options" (dict "host" "0.0.0.0" "port" $v.router.port) "applications" (list $app) -}}
{{- toYaml $cfg -}}
{{- end -}}
