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
{{- if and (not (has . $kept)) (not (and $.service (has . $replicas))) (not (and $.scope (has . (list "job" "instance")))) -}}
{{- $kept = append $kept . -}}
{{- end -}}
{{- end -}}
{{- range $kept }}{{ . }}, {{ end -}}
{{- end }}

{{/*
The default SLO branch's matchers leaving out the models with their own threshold (prometheusRule.<slo>.byModel),
as rules/slo.py writes them: `, model_name!="m"` each after other matchers, or with "braces" the same
as a whole selector `{model_name!="m", ...}`, or nothing. Called with (dict "byModel" MAP "braces" BOOL).
*/}}
{{- define "rooflight.sloExclusions" -}}
{{- $parts := list -}}
{{- range $model, $_ := .byModel -}}
{{- $parts = append $parts (printf "model_name!=%q" $model) -}}
{{- end -}}
{{- if .braces -}}
{{- with $parts }}{{ "{" }}{{ join ", " . }}{{ "}" }}{{ end -}}
{{- else -}}
{{- range $parts }}, {{ . }}{{ end -}}
{{- end -}}
{{- end }}

{{/*
One podMetricsEndpoints/endpoints entry of a PodMonitor or ServiceMonitor. The agent's endpoint gets
job=agent.job (the meta-monitoring rules select its `up` by it; the engine's scrape keeps its own job) and,
when the agent runs with a web config, https, the scrape's tlsConfig and basic auth from a Secret.
Every endpoint gets extraLabels, then the monitor's own relabelings and metricRelabelings.
Called with (dict "root" $ "monitor" .Values.podMonitor "port" NAME "agent" BOOL).
*/}}
{{- define "rooflight.endpoint" -}}
{{- $v := .root.Values -}}
{{- $web := $v.agent.webConfig -}}
- port: {{ .port }}
  path: /metrics
  interval: {{ .monitor.interval }}
  {{- with .monitor.scrapeTimeout }}
  scrapeTimeout: {{ . }}
  {{- end }}
  {{- if and .agent $web.secretName }}
  {{- if $web.tls }}
  scheme: https
  {{- if not $web.scrapeTlsConfig }}
  {{- fail "agent.webConfig.tls needs agent.webConfig.scrapeTlsConfig: the CA and serverName Prometheus verifies the agent's certificate with (or insecureSkipVerify: true)" }}
  {{- end }}
  tlsConfig:
    {{- toYaml $web.scrapeTlsConfig | nindent 4 }}
  {{- end }}
  {{- with $web.basicAuthSecret }}
  basicAuth:
    username: {name: {{ . }}, key: username}
    password: {name: {{ . }}, key: password}
  {{- end }}
  {{- end }}
  {{- $relabelings := list -}}
  {{- if .agent }}
  {{- $relabelings = append $relabelings (dict "action" "replace" "targetLabel" "job" "replacement" $v.agent.job) -}}
  {{- end }}
  {{- range $name, $value := $v.extraLabels }}
  {{- $relabelings = append $relabelings (dict "action" "replace" "targetLabel" $name "replacement" $value) -}}
  {{- end }}
  {{- $relabelings = concat $relabelings (default list .monitor.relabelings) }}
  {{- with $relabelings }}
  relabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .monitor.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end }}

{{/* The pod's ServiceAccount: the release's own when created, else serviceAccount.name or "default". */}}
{{- define "rooflight.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "rooflight.fullname" .) .Values.serviceAccount.name }}
{{- else -}}
{{- default "default" .Values.serviceAccount.name }}
{{- end -}}
{{- end }}
