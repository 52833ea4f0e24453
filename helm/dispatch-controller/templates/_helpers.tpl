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

{{/*
The groups a config.clusters item may set (besides its name), as in controller/config.py
(ENTRY_GROUPS); each accepts the keys of the top-level group of the same name.
*/}}
{{- define "dispatch.entryGroups" -}}
transport output environment defaults slurm
{{- end -}}

{{/*
Refuse a config.clusters that controller/config.py would refuse, naming the item: an
item that is not a map, has no name or a malformed one, repeats a name, sets a key the
chart does not know, or a transport key that does not apply to its kind. Renders nothing.
*/}}
{{- define "dispatch.checkClusters" -}}
{{- $config := .Values.config -}}
{{- if and $config.clusters (not (kindIs "slice" $config.clusters)) -}}
{{- fail "config.clusters must be a list of clusters (empty: the one cluster config.cluster)" -}}
{{- end -}}
{{- $groups := splitList " " (include "dispatch.entryGroups" .) -}}
{{- $seen := dict -}}
{{- range $i, $item := $config.clusters -}}
{{- $at := printf "config.clusters[%d]" $i -}}
{{- if not (kindIs "map" $item) -}}
{{- fail (printf "%s must be a map with at least a name" $at) -}}
{{- end -}}
{{- $name := required (printf "%s.name is required" $at) $item.name -}}
{{- if not (and (kindIs "string" $name) (regexMatch "^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$" $name)) -}}
{{- fail (printf "%s.name must be 1-64 of [A-Za-z0-9_.-], starting alphanumeric" $at) -}}
{{- end -}}
{{- if hasKey $seen $name -}}
{{- fail (printf "config.clusters: the cluster name %q is used twice (%s and %s.name); names must be unique" $name (get $seen $name) $at) -}}
{{- end -}}
{{- $_ := set $seen $name (printf "%s.name" $at) -}}
{{- range $group, $own := omit $item "name" -}}
{{- if not (has $group $groups) -}}
{{- fail (printf "%s.%s is not a key of a cluster (name, %s)" $at $group (join ", " $groups)) -}}
{{- end -}}
{{- if not (kindIs "map" $own) -}}
{{- fail (printf "%s.%s must be a map" $at $group) -}}
{{- end -}}
{{- $known := get $config $group -}}
{{- range $key, $_ := $own -}}
{{- if not (hasKey $known $key) -}}
{{- fail (printf "%s.%s.%s is not a key of config.%s (%s)" $at $group $key $group (keys $known | sortAlpha | join ", ")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $own := default (dict) $item.transport -}}
{{- $kind := include "dispatch.entryKind" (dict "top" $config.transport "own" $own) -}}
{{- if eq $kind "ssh" -}}
{{- if $own.run_as -}}
{{- fail (printf "%s.transport.run_as applies only to kind \"local\"" $at) -}}
{{- end -}}
{{- if not (ternary $own.host $config.transport.host (hasKey $own "host")) -}}
{{- fail (printf "%s.transport.host is required for the ssh transport" $at) -}}
{{- end -}}
{{- else if eq $kind "local" -}}
{{- range $key := list "host" "user" -}}
{{- if get $own $key -}}
{{- fail (printf "%s.transport.%s applies only to kind \"ssh\"" $at $key) -}}
{{- end -}}
{{- end -}}
{{- else -}}
{{- fail (printf "%s.transport.kind must be \"ssh\" or \"local\"" $at) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A cluster's transport kind: its own (dict "own" ...), else config.transport's ("top"). */}}
{{- define "dispatch.entryKind" -}}
{{- ternary .own.kind .top.kind (hasKey .own "kind") -}}
{{- end -}}

{{/*
The transport of every cluster the daemon drives, as a JSON list of {kind, host}:
config.transport alone, or one per config.clusters item (its keys over config.transport's).
*/}}
{{- define "dispatch.transports" -}}
{{- include "dispatch.checkClusters" . -}}
{{- $top := .Values.config.transport -}}
{{- $out := list -}}
{{- range .Values.config.clusters | default (list (dict)) -}}
{{- $own := default (dict) .transport -}}
{{- $kind := include "dispatch.entryKind" (dict "top" $top "own" $own) -}}
{{- $out = append $out (dict "kind" $kind "host" (ternary $own.host $top.host (hasKey $own "host"))) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
Does any cluster use the SSH transport (the SSH Secret and its mount exist)? "true" or "".
One key and one known_hosts file serve every ssh cluster.
*/}}
{{- define "dispatch.ssh" -}}
{{- $kinds := list -}}
{{- range include "dispatch.transports" . | fromJsonArray -}}
{{- $kinds = append $kinds .kind -}}
{{- end -}}
{{- if has "ssh" $kinds -}}true{{- end -}}
{{- end -}}

{{/* The names of config.clusters, for messages: "cpu, gpu". */}}
{{- define "dispatch.clusterNames" -}}
{{- $names := list -}}
{{- range .Values.config.clusters -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join ", " $names -}}
{{- end -}}

{{/* The login hosts of the ssh clusters, for messages: "login-a, login-b". */}}
{{- define "dispatch.sshHosts" -}}
{{- $hosts := list -}}
{{- range include "dispatch.transports" . | fromJsonArray -}}
{{- if eq .kind "ssh" -}}
{{- $hosts = append $hosts .host -}}
{{- end -}}
{{- end -}}
{{- $hosts | uniq | join ", " -}}
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
{{- include "dispatch.checkClusters" . -}}
{{- end -}}

{{/*
config.toml, from .Values.config. Every value goes through toJson: a JSON string,
number, boolean or string array is also valid TOML. The ssh-only keys are written only
for kind "ssh" and run_as only for "local", as controller/config.py requires; user and
run_as are left out when empty (empty means unset).
With config.clusters, [cluster] is left out and each item becomes a [[clusters]] entry
after the top-level groups, which stay the defaults of every entry (dispatch.entryToml).
*/}}
{{- define "dispatch.configToml" -}}
{{- include "dispatch.checkClusters" . -}}
# Rendered by the dispatch-controller Helm chart from .Values.config.
# database.url is not here: DISPATCH_DATABASE_URL (from a Secret) provides it.
{{- if not .Values.config.clusters }}

[cluster]
name = {{ toJson .Values.config.cluster.name }}
{{- end }}

[transport]
kind = {{ toJson .Values.config.transport.kind }}
{{- if eq .Values.config.transport.kind "ssh" }}
{{- /* with config.clusters, each ssh item may name its own host instead */}}
{{- if or .Values.config.transport.host (not .Values.config.clusters) }}
host = {{ required "config.transport.host is required for the ssh transport" .Values.config.transport.host | toJson }}
{{- end }}
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
standby_shadow_s = {{ toJson .Values.config.daemon.standby_shadow_s }}

[reconcile]
adopt_window_s = {{ int .Values.config.reconcile.adopt_window_s }}
unknown_grace_s = {{ int .Values.config.reconcile.unknown_grace_s }}
sacct_window_s = {{ int .Values.config.reconcile.sacct_window_s }}

[slurm]
rate_per_s = {{ toJson .Values.config.slurm.rate_per_s }}
{{- with .Values.config.clusters }}

# The clusters, the default first; an entry's tables override the groups above key by key.
{{- range . }}

{{ include "dispatch.entryToml" (dict "top" $.Values.config "item" .) }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
One [[clusters]] entry, from a config.clusters item ("item") over .Values.config ("top"):
a table for each group the item sets, holding the keys it sets. The transport keys depend
on the kind, so an entry whose kind differs from config.transport's also gets the keys
the top-level [transport] did not write (taken from config.transport, which stays the
default), and "" (unset) for those it wrote that do not apply to the entry's kind.
*/}}
{{- define "dispatch.entryToml" -}}
[[clusters]]
name = {{ toJson .item.name }}
{{- $top := .top.transport }}
{{- with .item.transport }}
{{- $kind := include "dispatch.entryKind" (dict "top" $top "own" .) }}
{{- $inherits := eq $kind $top.kind }}
[clusters.transport]
{{- if hasKey . "kind" }}
kind = {{ toJson .kind }}
{{- end }}
{{- if eq $kind "ssh" }}
{{- if or (hasKey . "host") (not $inherits) }}
host = {{ ternary .host $top.host (hasKey . "host") | toJson }}
{{- end }}
{{- if or (hasKey . "port") (not $inherits) }}
port = {{ ternary .port $top.port (hasKey . "port") | int }}
{{- end }}
{{- if hasKey . "user" }}
user = {{ toJson .user }}
{{- else if and (not $inherits) $top.user }}
user = {{ toJson $top.user }}
{{- end }}
{{- if not $inherits }}
key_file = "/etc/dispatch/ssh/id_key"
known_hosts = "/etc/dispatch/ssh/known_hosts"
{{- if $top.run_as }}
run_as = ""
{{- end }}
{{- end }}
{{- else }}
{{- if not $inherits }}
host = ""
{{- if $top.user }}
user = ""
{{- end }}
key_file = ""
known_hosts = ""
{{- end }}
{{- if hasKey . "run_as" }}
run_as = {{ toJson .run_as }}
{{- else if and (not $inherits) $top.run_as }}
run_as = {{ toJson $top.run_as }}
{{- end }}
{{- end }}
{{- if hasKey . "command_timeout_s" }}
command_timeout_s = {{ toJson .command_timeout_s }}
{{- end }}
{{- end }}
{{- range $group := list "output" "environment" "defaults" "slurm" }}
{{- with $own := get $.item $group }}
[clusters.{{ $group }}]
{{- range $key := keys $own | sortAlpha }}
{{ $key }} = {{ get $own $key | toJson }}
{{- end }}
{{- end }}
{{- end }}
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
