{{/*
The labels of every object: the one the kustomize base has always carried, and the
release's commonLabels. Helm adds its own ownership label and annotations when it
installs, so the rendered base (scripts/render-install) carries none of Helm's.
*/}}
{{- define "battery-apiserver.labels" -}}
app.kubernetes.io/part-of: battery-apiserver
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
An image reference from {repository, tag, digest}: the tag defaults to the chart's
appVersion, and a digest pins it.
*/}}
{{- define "battery-apiserver.image" -}}
{{- $image := index . 0 -}}
{{- $root := index . 1 -}}
{{- $tag := $image.tag | default $root.Chart.AppVersion -}}
{{- $image.repository }}{{ with $tag }}:{{ . }}{{ end }}{{ with $image.digest }}@{{ . }}{{ end }}
{{- end }}

{{/* imagePullPolicy, when one is set. */}}
{{- define "battery-apiserver.pullPolicy" -}}
{{- with .pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The serving certificate's Secret: the API server's, for its Service's names. */}}
{{- define "battery-apiserver.servingSecret" -}}
battery-apiserver-serving
{{- end }}

{{/*
The APIService's caBundle with certificates.source secrets: the value, or the serving
Secret's ca.crt as the cluster holds it (empty where Helm cannot look, as in `helm
template`).
*/}}
{{- define "battery-apiserver.caBundle" -}}
{{- if .Values.certificates.caBundle -}}
{{ .Values.certificates.caBundle }}
{{- else -}}
{{- $secret := lookup "v1" "Secret" .Release.Namespace (include "battery-apiserver.servingSecret" .) -}}
{{- if $secret -}}
{{ index ($secret.data | default dict) "ca.crt" | default "" }}
{{- end -}}
{{- end -}}
{{- end }}
