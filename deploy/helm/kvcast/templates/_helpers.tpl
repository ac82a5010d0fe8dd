{{/* The chart's name, overridable. */}}
{{- define "kvcast.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Objects' name: the release name, with the chart's when it does not contain it. */}}
{{- define "kvcast.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "kvcast.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels that select this release's pods (immutable in a Deployment: keep them few). */}}
{{- define "kvcast.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvcast.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "kvcast.labels" -}}
{{ include "kvcast.selectorLabels" . }}
app.kubernetes.io/part-of: kvcast
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The Secret the pods read their URLs from. */}}
{{- define "kvcast.secretName" -}}
{{- if .Values.credentials.storeUrl -}}
{{- printf "%s-credentials" (include "kvcast.fullname" .) -}}
{{- else -}}
{{- required "credentials: set existingSecret (a Secret with the store URL) or storeUrl" .Values.credentials.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "kvcast.image" -}}
{{- $flavour := ternary "cuda" "cpu" .Values.gpu.enabled -}}
{{- $tag := .Values.image.tag | default (printf "%s-%s" .Chart.AppVersion $flavour) -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}

{{/*
One TOML value. Helm reads every number of a values file as a float: whole numbers are
written as integers, so integer settings (capacity-blocks) stay integers.
*/}}
{{- define "kvcast.tomlValue" -}}
{{- $kind := kindOf . -}}
{{- if eq $kind "string" -}}
{{- toJson . -}}
{{- else if eq $kind "bool" -}}
{{- printf "%t" . -}}
{{- else if has $kind (list "int" "int64" "uint64") -}}
{{- printf "%d" . -}}
{{- else if eq $kind "float64" -}}
{{- if eq (floor .) . -}}{{- printf "%d" (int64 .) -}}{{- else -}}{{- printf "%v" . -}}{{- end -}}
{{- else -}}
{{- fail (printf "config: %v is a %s; settings are strings, numbers, booleans or lists of them" . $kind) -}}
{{- end -}}
{{- end -}}

{{/* kvcast.toml from .Values.config (keys in order; a null value leaves the key out). */}}
{{- define "kvcast.toml" -}}
{{- if hasKey .Values.config "metrics-addr" -}}
{{- fail "config.metrics-addr: the chart sets it from http.port; set http.port instead" -}}
{{- end -}}
# kvcast run settings from the chart's values (keys are flag names); KVCAST_* variables win.
metrics-addr = {{ printf "0.0.0.0:%d" (int64 .Values.http.port) | quote }}
{{- range $key, $value := .Values.config }}
{{- if not (kindIs "invalid" $value) }}
{{- if kindIs "slice" $value }}
{{ $key }} = [{{ range $i, $item := $value }}{{ if $i }}, {{ end }}{{ include "kvcast.tomlValue" $item }}{{ end }}]
{{- else }}
{{ $key }} = {{ include "kvcast.tomlValue" $value }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
