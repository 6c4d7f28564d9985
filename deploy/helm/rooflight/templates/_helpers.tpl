{{/* Names and labels shared by every template. */}}
{{- define "rooflight.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "rooflight.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "rooflight.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "rooflight.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "rooflight.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rooflight.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "rooflight.labels" -}}
{{ include "rooflight.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The port number of a HOST:PORT listen address. */}}
{{- define "rooflight.listenPort" -}}
{{- regexFind "[0-9]+$" .Values.agent.listen }}
{{- end }}

{{/*
An `le` matcher the way rules/promql.py writes it: le="0.1" for a fractional edge; a regex for a
whole number, because engines print 5 as "5.0" or "5".
*/}}
{{- define "rooflight.leMatcher" -}}
{{- $t := float64 . -}}
{{- if eq $t (floor $t) -}}
le=~"{{ int64 $t }}(\\.0)?"
{{- else -}}
le="{{ $t }}"
{{- end -}}
{{- end }}

{{/*
The topology labels the rules keep, each followed by ", ", in the order `rooflight rules` prints them:
prometheusRule.topologyLabels, then the keys of extraLabels (sorted), without repeats. With
"service" true, the replica labels (prometheusRule.replicaLabels) are left out: an SLO sums over them.
Called with (dict "root" $ "service" BOOL).
*/}}
{{- define "rooflight.ruleLabels" -}}
{{- $topology := default list .root.Values.prometheusRule.topologyLabels -}}
{{- $replicas := default list .root.Values.prometheusRule.replicaLabels -}}
{{- $kept := list -}}
{{- range concat $topology (keys (default dict .root.Values.extraLabels) | sortAlpha) -}}
{{- if and (not (has . $kept)) (not (and $.service (has . $replicas))) -}}
{{- $kept = append $kept . -}}
{{- end -}}
{{- end -}}
{{- range $kept }}{{ . }}, {{ end -}}
{{- end }}

{{/* extraLabels as a monitor endpoint's relabelings: each name set to its value on every scraped series. */}}
{{- define "rooflight.extraLabelRelabelings" -}}
relabelings:
{{- range $name, $value := .Values.extraLabels }}
  - {action: replace, targetLabel: {{ $name }}, replacement: {{ $value | quote }}}
{{- end }}
{{- end }}
