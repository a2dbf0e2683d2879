{{- define "railyard.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "railyard.labels" -}}
app.kubernetes.io/name: railyard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "railyard.selectorLabels" -}}
app.kubernetes.io/name: railyard
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "railyard.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "railyard.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "railyard.heartbeatUrl" -}}
{{- if .Values.heartbeat.advertiseUrl -}}
{{- .Values.heartbeat.advertiseUrl -}}
{{- else -}}
{{- printf "http://%s.%s.svc:%d" (include "railyard.fullname" .) .Release.Namespace (int .Values.port) -}}
{{- end -}}
{{- end -}}

{{- define "railyard.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "railyard.peeringName" -}}
{{- include "railyard.fullname" . -}}
{{- end -}}
