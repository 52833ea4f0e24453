{{/*
Named templates of the dispatch-controller chart. Rendered and linted in tests by Helm's
own SDK (tests/test_helm.py, helm-python-sdk).
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "dispatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The resource name prefix: fullnameOverride, else <release>-<name>, or just the release
name when it already contains the chart name. 63 characters at most (DNS label).
*/}}
{{- define "dispatch.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "dispatch.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "dispatch.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select the daemon pods; never change them on upgrade. */}}
{{- define "dispatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dispatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels that select the daemon pods (not the migration Job's pod). */}}
{{- define "dispatch.controllerSelectorLabels" -}}
{{ include "dispatch.selectorLabels" . }}
app.kubernetes.io/component: controller
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "dispatch.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "dispatch.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dispatch-controller
{{- end -}}

{{/* The service account the daemon pods run as. */}}
{{- define "dispatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dispatch.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference; the tag defaults to the chart's appVersion. */}}
{{- define "dispatch.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Is the SSH transport in use (the SSH Secret and its mount exist)? "true" or "". */}}
{{- define "dispatch.ssh" -}}
{{- if eq .Values.config.transport.kind "ssh" -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the SSH key and known_hosts. */}}
{{- define "dispatch.sshSecretName" -}}
{{- default (printf "%s-ssh" (include "dispatch.fullname" .)) .Values.ssh.existingSecret -}}
{{- end -}}

{{/* The Secret holding the database URL, and its key. */}}
{{- define "dispatch.databaseSecretName" -}}
{{- default (printf "%s-database" (include "dispatch.fullname" .)) .Values.database.existingSecret -}}
{{- end -}}

{{- define "dispatch.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecretKey -}}
{{- else -}}
url
{{- end -}}
{{- end -}}

{{/*
Refuse settings that would break exactly-once: with SQLite each pod has its own
database and its own leader lock, so two replicas would both submit every job.
*/}}
{{- define "dispatch.validate" -}}
{{- if and (not .Values.database.existingSecret) (hasPrefix "sqlite" .Values.database.url) (gt (int .Values.replicaCount) 1) -}}
{{- fail "database.url is SQLite but replicaCount > 1: each pod would have its own database and leader lock; use PostgreSQL or replicaCount: 1" -}}
{{- end -}}
{{- if not (or (eq .Values.config.transport.kind "ssh") (eq .Values.config.transport.kind "local")) -}}
{{- fail "config.transport.kind must be \"ssh\" or \"local\"" -}}
{{- end -}}
{{- end -}}

{{/*
config.toml, from .Values.config. Every value goes through toJson: a JSON string,
number, boolean or string array is also valid TOML. The ssh-only keys are written only
for kind "ssh" and run_as only for "local", as controller/config.py requires; user and
run_as are left out when empty (the loader refuses "" for them).
*/}}
{{- define "dispatch.configToml" -}}
# Rendered by the dispatch-controller Helm chart from .Values.config.
# database.url is not here: DISPATCH_DATABASE_URL (from a Secret) provides it.

[cluster]
name = {{ toJson .Values.config.cluster.name }}

[transport]
kind = {{ toJson .Values.config.transport.kind }}
{{- if include "dispatch.ssh" . }}
host = {{ required "config.transport.host is required for the ssh transport" .Values.config.transport.host | toJson }}
port = {{ int .Values.config.transport.port }}
{{- if .Values.config.transport.user }}
user = {{ toJson .Values.config.transport.user }}
{{- end }}
key_file = "/etc/dispatch/ssh/id_key"
known_hosts = "/etc/dispatch/ssh/known_hosts"
{{- else if .Values.config.transport.run_as }}
run_as = {{ toJson .Values.config.transport.run_as }}
{{- end }}
command_timeout_s = {{ toJson .Values.config.transport.command_timeout_s }}

[output]
dir = {{ toJson .Values.config.output.dir }}

[environment]
pass = {{ toJson .Values.config.environment.pass }}

[defaults]
partition = {{ toJson .Values.config.defaults.partition }}
account = {{ toJson .Values.config.defaults.account }}
qos = {{ toJson .Values.config.defaults.qos }}
reservation = {{ toJson .Values.config.defaults.reservation }}
constraint = {{ toJson .Values.config.defaults.constraint }}
nodelist = {{ toJson .Values.config.defaults.nodelist }}
exclude = {{ toJson .Values.config.defaults.exclude }}
exclusive = {{ toJson .Values.config.defaults.exclusive }}

[daemon]
tick_interval_s = {{ toJson .Values.config.daemon.tick_interval_s }}
metrics_host = {{ toJson .Values.config.daemon.metrics_host }}
metrics_port = {{ int .Values.config.daemon.metrics_port }}
cluster_stats_interval_s = {{ toJson .Values.config.daemon.cluster_stats_interval_s }}
lease_ttl_s = {{ toJson .Values.config.daemon.lease_ttl_s }}
lease_margin_s = {{ toJson .Values.config.daemon.lease_margin_s }}

[reconcile]
adopt_window_s = {{ int .Values.config.reconcile.adopt_window_s }}
unknown_grace_s = {{ int .Values.config.reconcile.unknown_grace_s }}
sacct_window_s = {{ int .Values.config.reconcile.sacct_window_s }}

[slurm]
rate_per_s = {{ toJson .Values.config.slurm.rate_per_s }}
{{- end -}}

{{/* The DISPATCH_DATABASE_URL variable and extraEnv, for any container of the chart. */}}
{{- define "dispatch.env" -}}
- name: DISPATCH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "dispatch.databaseSecretName" . }}
      key: {{ include "dispatch.databaseSecretKey" . }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}
