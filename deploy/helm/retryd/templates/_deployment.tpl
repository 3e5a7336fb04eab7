{{/* A component's Deployment, Service, PodDisruptionBudget and HPA.
dict "root" $ "component" "ingress" "role" "ingress" "nats" true
  "command" (list ...) "ports" (list (dict "name" "http" "port" 8081) ...)
  "env" (list (dict "name" ... "value" ...) ...)
The first port is "http": the API, /healthz, /readyz and /metrics. */}}
{{- define "retryd.component" -}}
{{- $root := .root }}
{{- $own := .values | default (index $root.Values .component) }}
{{- $name := printf "%s-%s" (include "retryd.fullname" $root) .component }}
{{- $http := first .ports }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  labels:
    {{- include "retryd.labels" . | nindent 4 }}
spec:
  {{- if not $own.autoscaling.enabled }}
  replicas: {{ $own.replicas }}
  {{- end }}
  selector:
    matchLabels:
      {{- include "retryd.selectorLabels" . | nindent 6 }}
  strategy:
    type: RollingUpdate
    rollingUpdate:
      maxUnavailable: 0
      maxSurge: 1
  template:
    metadata:
      labels:
        {{- include "retryd.labels" . | nindent 8 }}
        {{- with $root.Values.podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- if or $root.Values.podMetricsAnnotations $root.Values.podAnnotations }}
      annotations:
        {{- if $root.Values.podMetricsAnnotations }}
        prometheus.io/scrape: "true"
        prometheus.io/port: {{ $http.port | quote }}
        prometheus.io/path: /metrics
        {{- end }}
        {{- with $root.Values.podAnnotations }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
      {{- end }}
    spec:
      {{- include "retryd.podSpecCommon" $root | trim | nindent 6 }}
      # SIGTERM starts the graceful stop: /readyz turns 503, consumers
      # drain, in-flight requests finish (up to 30s), then the process
      # exits. Kubernetes waits this long before SIGKILL.
      terminationGracePeriodSeconds: 45
      topologySpreadConstraints:
        - maxSkew: 1
          topologyKey: kubernetes.io/hostname
          whenUnsatisfiable: ScheduleAnyway
          labelSelector:
            matchLabels:
              {{- include "retryd.selectorLabels" . | nindent 14 }}
      containers:
        - name: {{ .component }}
          image: {{ include "retryd.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          command: {{ toJson .command }}
          ports:
            {{- range .ports }}
            - name: {{ .name }}
              containerPort: {{ .port }}
            {{- end }}
          envFrom:
            - secretRef:
                name: {{ include "retryd.secretName" . }}
          {{- $env := include "retryd.env" . | trim }}
          {{- if or .env $env }}
          env:
            {{- with .env }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with $env }}
            {{- . | nindent 12 }}
            {{- end }}
          {{- end }}
          # Started: the process serves HTTP (it may wait for NATS and
          # Postgres before that).
          startupProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 2
            failureThreshold: 60
          # Alive: restart only a process that stopped answering.
          livenessProbe:
            httpGet: {path: /healthz, port: http}
            periodSeconds: 10
            timeoutSeconds: 3
            failureThreshold: 3
          # Ready: consumers running; off during the graceful stop.
          readinessProbe:
            httpGet: {path: /readyz, port: http}
            periodSeconds: 5
            timeoutSeconds: 3
            failureThreshold: 2
          lifecycle:
            # Give endpoints time to drop the pod before the stop begins.
            preStop:
              sleep:
                seconds: 5
          resources:
            {{- toYaml $own.resources | nindent 12 }}
          securityContext:
            {{- toYaml $root.Values.securityContext | nindent 12 }}
          {{- with include "retryd.volumeMounts" . }}
          volumeMounts:
            {{- . | trim | nindent 12 }}
          {{- end }}
      {{- with include "retryd.volumes" . }}
      volumes:
        {{- . | trim | nindent 8 }}
      {{- end }}
---
apiVersion: v1
kind: Service
metadata:
  name: {{ $name }}
  labels:
    {{- include "retryd.labels" . | nindent 4 }}
spec:
  type: {{ dig "service" "type" "ClusterIP" $own }}
  selector:
    {{- include "retryd.selectorLabels" . | nindent 4 }}
  ports:
    {{- range .ports }}
    - name: {{ .name }}
      port: {{ .port }}
      targetPort: {{ .name }}
    {{- end }}
{{- if $own.pdb.enabled }}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  labels:
    {{- include "retryd.labels" . | nindent 4 }}
spec:
  minAvailable: {{ $own.pdb.minAvailable }}
  selector:
    matchLabels:
      {{- include "retryd.selectorLabels" . | nindent 6 }}
{{- end }}
{{- if $own.autoscaling.enabled }}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {{ $name }}
  labels:
    {{- include "retryd.labels" . | nindent 4 }}
spec:
  scaleTargetRef:
    apiVersion: apps/v1
    kind: Deployment
    name: {{ $name }}
  minReplicas: {{ $own.autoscaling.minReplicas }}
  maxReplicas: {{ $own.autoscaling.maxReplicas }}
  metrics:
    - type: Resource
      resource:
        name: cpu
        target:
          type: Utilization
          averageUtilization: {{ $own.autoscaling.targetCPUUtilizationPercentage }}
{{- end }}
{{- end }}
