{{/*
The chart name, at most 63 characters (a DNS label).
*/}}
{{- define "ratelimitd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of every object: fullnameOverride, else <release>-<name>, or
the release name alone when it already contains the name.
*/}}
{{- define "ratelimitd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "ratelimitd.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Selector labels: stable for the life of the release (a Deployment's
selector is immutable).
*/}}
{{- define "ratelimitd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ratelimitd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "ratelimitd.labels" -}}
helm.sh/chart: {{ include "ratelimitd.chart" . }}
{{ include "ratelimitd.selectorLabels" . }}
app.kubernetes.io/version: {{ include "ratelimitd.imageTag" . | quote }}
app.kubernetes.io/component: rate-limit-service
app.kubernetes.io/part-of: ratelimitd
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "ratelimitd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ratelimitd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image tag: image.tag, else the chart's appVersion.
*/}}
{{- define "ratelimitd.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{/*
The ConfigMap holding the rate-limit config.
*/}}
{{- define "ratelimitd.configMapName" -}}
{{- if .Values.config.existingConfigMap }}
{{- .Values.config.existingConfigMap }}
{{- else }}
{{- printf "%s-config" (include "ratelimitd.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/*
"true" with backend memory, else "". The memory store counts per pod, so
the chart then runs exactly one pod and no HPA.
*/}}
{{- define "ratelimitd.memory" -}}
{{- if eq .Values.backend "memory" }}true{{ end }}
{{- end }}

{{/*
"true" when the chart runs its own Redis: backend redis and redis.enabled.
*/}}
{{- define "ratelimitd.bundledRedis" -}}
{{- if and (eq .Values.backend "redis") .Values.redis.enabled }}true{{ end }}
{{- end }}

{{/*
The chart's Redis: the name of its StatefulSet and Service, its labels,
and the --redis-url that reaches it.
*/}}
{{- define "ratelimitd.redisName" -}}
{{- printf "%s-redis" (include "ratelimitd.fullname" . | trunc 57 | trimSuffix "-") }}
{{- end }}

{{- define "ratelimitd.redisSelectorLabels" -}}
app.kubernetes.io/name: redis
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: counter-store
{{- end }}

{{- define "ratelimitd.redisLabels" -}}
helm.sh/chart: {{ include "ratelimitd.chart" . }}
{{ include "ratelimitd.redisSelectorLabels" . }}
app.kubernetes.io/version: {{ .Values.redis.server.image.tag | quote }}
app.kubernetes.io/part-of: ratelimitd
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
--redis-url: the chart's Redis when redis.enabled, else redis.url (""
in cluster or sentinel mode without one: the flag is then left out).
*/}}
{{- define "ratelimitd.redisURL" -}}
{{- if include "ratelimitd.bundledRedis" . }}
{{- printf "redis://%s.%s.svc:6379/0" (include "ratelimitd.redisName" .) .Release.Namespace }}
{{- else }}
{{- .Values.redis.url }}
{{- end }}
{{- end }}

{{- define "ratelimitd.hpaEnabled" -}}
{{- if and .Values.autoscaling.enabled (not (include "ratelimitd.memory" .)) }}true{{ end }}
{{- end }}

{{/*
Mount points of the files ratelimitd reads.
*/}}
{{- define "ratelimitd.configDir" -}}/etc/ratelimitd/config{{- end }}
{{- define "ratelimitd.redisAuthDir" -}}/etc/ratelimitd/redis-auth{{- end }}
{{- define "ratelimitd.sentinelAuthDir" -}}/etc/ratelimitd/redis-sentinel-auth{{- end }}
{{- define "ratelimitd.redisTLSDir" -}}/etc/ratelimitd/redis-tls{{- end }}
{{- define "ratelimitd.durableAuthDir" -}}/etc/ratelimitd/durable-auth{{- end }}

{{/*
Checks of the values that no schema expresses; each fails the render with
the key to fix.
*/}}
{{- define "ratelimitd.validate" -}}
{{- $v := .Values }}
{{- if not (has $v.backend (list "redis" "memcache" "memory")) }}
{{- fail (printf "backend %q: want redis, memcache or memory" $v.backend) }}
{{- end }}
{{- if eq $v.backend "redis" }}
{{- if not (has $v.redis.mode (list "standalone" "cluster" "sentinel")) }}
{{- fail (printf "redis.mode %q: want standalone, cluster or sentinel" $v.redis.mode) }}
{{- end }}
{{- if and $v.redis.url (not (or (hasPrefix "redis://" $v.redis.url) (hasPrefix "rediss://" $v.redis.url))) }}
{{- fail (printf "redis.url %q: want redis://host:port/db or rediss:// (TLS)" $v.redis.url) }}
{{- end }}
{{- if regexMatch "^rediss?://[^/@]*:[^/@]*@" $v.redis.url }}
{{- fail "redis.url carries a password: put it in a Secret and name it in redis.existingSecret (--redis-password-file)" }}
{{- end }}
{{- if $v.redis.enabled }}
{{- if $v.redis.url }}
{{- fail "redis.url names your own Redis, and redis.enabled also deploys one: set redis.enabled=false to use yours, or leave redis.url empty to use the chart's" }}
{{- end }}
{{- if ne $v.redis.mode "standalone" }}
{{- fail (printf "redis.mode %s: redis.enabled deploys one standalone Redis; for your own %s set redis.enabled=false and redis.addrs" $v.redis.mode $v.redis.mode) }}
{{- end }}
{{- if or $v.redis.existingSecret $v.redis.tls.enabled }}
{{- fail "redis.existingSecret and redis.tls are for your own Redis (redis.enabled=false, redis.url): the chart's Redis (redis.enabled) has no password and no TLS; the NetworkPolicy (networkPolicy.enabled) admits only ratelimitd to it" }}
{{- end }}
{{- else if and (eq $v.redis.mode "standalone") (not $v.redis.url) }}
{{- fail "backend redis with redis.enabled=false needs redis.url (redis://host:6379/0, or rediss:// for TLS) of your Redis: the chart deploys none, and a name no Service answers would leave every counter uncounted" }}
{{- end }}
{{- if and (ne $v.redis.mode "standalone") (not $v.redis.addrs) }}
{{- fail (printf "redis.mode %s needs redis.addrs (the %s)" $v.redis.mode (ternary "sentinels" "cluster seed nodes" (eq $v.redis.mode "sentinel"))) }}
{{- end }}
{{- if and (eq $v.redis.mode "standalone") $v.redis.addrs }}
{{- fail "redis.addrs is for cluster or sentinel mode; a standalone server is redis.url" }}
{{- end }}
{{- if and (eq $v.redis.mode "sentinel") (not $v.redis.master) }}
{{- fail "redis.mode sentinel needs redis.master (the master name)" }}
{{- end }}
{{- if and $v.redis.sentinelAuth.existingSecret (ne $v.redis.mode "sentinel") }}
{{- fail "redis.sentinelAuth is for redis.mode sentinel" }}
{{- end }}
{{- if and $v.redis.tls.enabled (not (hasPrefix "rediss://" $v.redis.url)) }}
{{- fail "redis.tls.enabled needs a rediss:// redis.url" }}
{{- end }}
{{- if and (not $v.redis.tls.enabled) (or $v.redis.tls.existingSecret $v.redis.tls.skipVerify) }}
{{- fail "redis.tls.existingSecret and redis.tls.skipVerify need redis.tls.enabled" }}
{{- end }}
{{- if ne (empty $v.redis.tls.certKey) (empty $v.redis.tls.keyKey) }}
{{- fail "redis.tls.certKey and redis.tls.keyKey: both (mutual TLS) or neither" }}
{{- end }}
{{- if and (or $v.redis.tls.certKey $v.redis.tls.keyKey) (not $v.redis.tls.existingSecret) }}
{{- fail "redis.tls.certKey/keyKey need redis.tls.existingSecret" }}
{{- end }}
{{- end }}
{{- if and $v.durable.enabled (not $v.durable.urlSecret.name) }}
{{- fail "durable.enabled needs durable.urlSecret.name: the Secret holding the postgres:// URL (the chart never takes the URL as a plain value)" }}
{{- end }}
{{- if and (not $v.durable.enabled) (or $v.durable.urlSecret.name $v.durable.passwordSecret.name $v.durable.asyncCommit $v.durable.timeout $v.durable.connectTimeout) }}
{{- fail "durable.urlSecret, passwordSecret, asyncCommit, timeout and connectTimeout need durable.enabled" }}
{{- end }}
{{- if and (eq $v.backend "memcache") (eq (empty $v.memcache.addrs) (empty $v.memcache.srv)) }}
{{- fail "backend memcache needs the memcached servers: memcache.addrs (host:port of each) or memcache.srv (an SRV record), one of the two" }}
{{- end }}
{{- if and $v.serviceMonitor.enabled $v.podMonitor.enabled }}
{{- fail "serviceMonitor.enabled and podMonitor.enabled: choose one (both would scrape every pod twice)" }}
{{- end }}
{{- if and (or $v.serviceMonitor.enabled $v.podMonitor.enabled) (not $v.metrics.enabled) }}
{{- fail "serviceMonitor/podMonitor scrape the metrics port: set metrics.enabled" }}
{{- end }}
{{- if and (not $v.config.existingConfigMap) (not $v.config.files) }}
{{- fail "config.files is empty and config.existingConfigMap unset: ratelimitd needs a config" }}
{{- end }}
{{- end }}
