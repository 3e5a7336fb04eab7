{{- define "retryd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's prefix: "retryd" for a release named retryd, so the
objects carry the names of deploy/k8s (retryd-scheduler, ...). */}}
{{- define "retryd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 50 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* dict "root" $ "component" "scheduler" */}}
{{- define "retryd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "retryd.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "retryd.labels" -}}
{{ include "retryd.selectorLabels" . }}
app.kubernetes.io/part-of: retryd
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "retryd.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The Secret a component reads as environment. */}}
{{- define "retryd.secretName" -}}
{{- $values := .values | default (index .root.Values .component) }}
{{- $values.secretName | default (printf "%s-%s" (include "retryd.fullname" .root) .component) }}
{{- end }}

{{/* Environment every container of a component gets. dict "root" $
"component" "scheduler" "role" "scheduler" "nats" true; "role" names the
Postgres role of postgres.roles (none: no DATABASE_URL), "nats" whether
the container connects to NATS. */}}
{{- define "retryd.env" -}}
{{- $v := .root.Values }}
{{- $own := .values | default (index $v .component) }}
{{- if and .nats (gt (int $v.shards.count) 1) }}
- name: RETRYD_SHARDS
  value: {{ $v.shards.count | toString | quote }}
{{- end }}
{{- if .nats }}
- name: NATS_URL
  value: {{ $v.nats.url | quote }}
{{- with $own.natsInboxPrefix }}
- name: NATS_INBOX_PREFIX
  value: {{ . | quote }}
{{- end }}
{{- if $v.nats.tls.caSecret }}
- name: NATS_TLS_CA
  value: /etc/retryd/nats-ca/ca.crt
{{- end }}
{{- if $v.nats.tls.clientSecret }}
- name: NATS_TLS_CERT
  value: /etc/retryd/nats-client/tls.crt
- name: NATS_TLS_KEY
  value: /etc/retryd/nats-client/tls.key
{{- end }}
{{- if $own.natsCredsSecret }}
- name: NATS_CREDS
  value: /etc/retryd/nats-creds/creds
{{- end }}
{{- end }}
{{- with $v.postgres }}
{{- if and .host $.role }}
{{- $role := index .roles $.role }}
{{- $query := printf "sslmode=%s" .sslMode }}
{{- if .caSecret }}
{{- $query = printf "%s&sslrootcert=/etc/retryd/postgres-ca/ca.crt" $query }}
{{- end }}
# The password stays in its Secret: pgx reads PGPASSWORD for a URL without one.
- name: DATABASE_URL
  value: {{ printf "postgres://%s@%s:%v/%s?%s" $role.user ($.dbHost | default .host) .port ($.database | default .database) $query | quote }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ required "postgres.passwordSecret: the Secret of the roles' passwords, with postgres.host" .passwordSecret }}
      key: {{ $role.passwordKey }}
{{- end }}
{{- end }}
{{- range $name, $value := merge (deepCopy ($own.env | default dict)) $v.env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}

{{/* Mounts and volumes of a component's Secrets of files; the same
condition opens each. */}}
{{- define "retryd.volumeMounts" -}}
{{- $v := .root.Values }}
{{- $own := .values | default (index $v .component) }}
{{- if and .nats $v.nats.tls.caSecret }}
- {name: nats-ca, mountPath: /etc/retryd/nats-ca, readOnly: true}
{{- end }}
{{- if and .nats $v.nats.tls.clientSecret }}
- {name: nats-client, mountPath: /etc/retryd/nats-client, readOnly: true}
{{- end }}
{{- if and .nats $own.natsCredsSecret }}
- {name: nats-creds, mountPath: /etc/retryd/nats-creds, readOnly: true}
{{- end }}
{{- if and .role $v.postgres.host $v.postgres.caSecret }}
- {name: postgres-ca, mountPath: /etc/retryd/postgres-ca, readOnly: true}
{{- end }}
{{- end }}

{{- define "retryd.volumes" -}}
{{- $v := .root.Values }}
{{- $own := .values | default (index $v .component) }}
{{- if and .nats $v.nats.tls.caSecret }}
- name: nats-ca
  secret: {secretName: {{ $v.nats.tls.caSecret }}}
{{- end }}
{{- if and .nats $v.nats.tls.clientSecret }}
- name: nats-client
  secret: {secretName: {{ $v.nats.tls.clientSecret }}}
{{- end }}
{{- if and .nats $own.natsCredsSecret }}
- name: nats-creds
  secret: {secretName: {{ $own.natsCredsSecret }}}
{{- end }}
{{- if and .role $v.postgres.host $v.postgres.caSecret }}
- name: postgres-ca
  secret: {secretName: {{ $v.postgres.caSecret }}}
{{- end }}
{{- end }}

{{- define "retryd.podSpecCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
# retryd never calls the Kubernetes API: no token in the pod.
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The components of the scheduler shards: "scheduler" (shard 0, the
home shard), then "scheduler-1" ... "scheduler-<count-1>". */}}
{{- define "retryd.schedulerComponents" -}}
{{- $out := list "scheduler" }}
{{- range $k := untilStep 1 (int .Values.shards.count) 1 }}
{{- $out = append $out (printf "scheduler-%d" $k) }}
{{- end }}
{{- toJson $out }}
{{- end }}

{{/* The home shard's database as the scheduler role, where the other
shards check API tokens (RETRYD_AUTH_DATABASE_URL): built with
postgres.host, else "$(RETRYD_HOME_DATABASE_URL)", which the shard's
Secret must then hold. */}}
{{- define "retryd.homeSchedulerURL" -}}
{{- with .Values.postgres }}
{{- if .host }}
{{- $query := printf "sslmode=%s" .sslMode }}
{{- if .caSecret }}
{{- $query = printf "%s&sslrootcert=/etc/retryd/postgres-ca/ca.crt" $query }}
{{- end }}
{{- printf "postgres://%s@%s:%v/%s?%s" .roles.scheduler.user .host .port .database $query }}
{{- else }}
{{- print "$(RETRYD_HOME_DATABASE_URL)" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The databases of shards 1 to count-1 as the scheduler role, comma-
separated (RETRYD_SHARD_DATABASE_URLS of the home shard, whose jobs API
acts on every shard), built with postgres.host. */}}
{{- define "retryd.shardSchedulerURLs" -}}
{{- $v := .Values }}
{{- if $v.postgres.host }}
{{- $urls := list }}
{{- range $k := untilStep 1 (int $v.shards.count) 1 }}
{{- $host := "" }}
{{- if gt (len ($v.shards.hosts | default list)) ($k | add -1 | int) }}
{{- $host = index $v.shards.hosts ($k | add -1 | int) }}
{{- end }}
{{- with $v.postgres }}
{{- $query := printf "sslmode=%s" .sslMode }}
{{- if .caSecret }}
{{- $query = printf "%s&sslrootcert=/etc/retryd/postgres-ca/ca.crt" $query }}
{{- end }}
{{- $urls = append $urls (printf "postgres://%s@%s:%v/%s_shard%d?%s" .roles.scheduler.user ($host | default .host) .port .database $k $query) }}
{{- end }}
{{- end }}
{{- join "," $urls }}
{{- end }}
{{- end }}
