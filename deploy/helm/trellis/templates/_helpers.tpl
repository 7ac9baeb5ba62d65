{{/*
The components: their name (Deployment, Service, ServiceAccount and component certificate
name), their key in values.yaml, their ports (ARCHITECTURE.md), and whether they call the
Kubernetes API (only those get the API's service account token).
*/}}
{{- define "trellis.components" -}}
certmanager: {key: certmanager, grpc: 15020, admin: 15021, kube: true, singleton: true}
catalog: {key: catalog, grpc: 15010, admin: 15011, kube: true, singleton: true}
endpoints-k8s: {key: endpointsK8s, grpc: 15030, admin: 15031, kube: true, singleton: true}
endpoints-vm: {key: endpointsVm, grpc: 15040, admin: 15041, kube: true, singleton: true}
proxy-cp: {key: proxyCp, grpc: 15128, admin: 15051, kube: false, singleton: false}
injector: {key: injector, grpc: 15060, admin: 15061, kube: true, singleton: true}
{{- end -}}

{{- define "trellis.namespace" -}}
{{- if ne .Release.Namespace "trellis-system" -}}
{{- fail (printf "install Trellis into the namespace trellis-system (helm install -n trellis-system --create-namespace), not %q: the control plane's identities and certificate names (spiffe://<trust domain>/ns/trellis-system/sa/<component>, <component>.trellis-system.svc) are in it" .Release.Namespace) -}}
{{- end -}}
{{- .Release.Namespace -}}
{{- end -}}

{{- define "trellis.labels" -}}
app.kubernetes.io/name: trellis
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: trellis
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- if .component }}
app.kubernetes.io/component: {{ .component }}
{{- end }}
{{- end -}}

{{- define "trellis.selector" -}}
app.kubernetes.io/name: trellis
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "trellis.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The env prefix of a component's own settings: TRELLIS_PROXY_CP_ for proxy-cp. */}}
{{- define "trellis.prefix" -}}
{{- printf "TRELLIS_%s_" (. | upper | replace "-" "_") -}}
{{- end -}}

{{- define "trellis.redisUrl" -}}
{{- if .Values.redis.externalUrl -}}
{{- .Values.redis.externalUrl -}}
{{- else -}}
{{- printf "redis://trellis-redis.%s.svc:6379/0" (include "trellis.namespace" .) -}}
{{- end -}}
{{- end -}}

{{- define "trellis.redisSecret" -}}
{{- if .Values.redis.externalUrl -}}
{{- required "redis.externalUrl needs redis.existingSecret: a Secret with one password per component (keys certmanager, catalog, endpoints-k8s, endpoints-vm, proxy-cp, injector)" .Values.redis.existingSecret -}}
{{- else -}}
trellis-redis-users
{{- end -}}
{{- end -}}

{{- define "trellis.caSecret" -}}
{{- .Values.ca.existingSecret | default "trellis-ca" -}}
{{- end -}}

{{/*
Made once per render and kept in the values, so every template that needs one gets the
same: the CA (from the release's own Secret when it exists: upgrades keep it), the KEK,
the admin token and the Redis passwords. `helm template` has no cluster: it makes new ones.
*/}}
{{- define "trellis.generated" -}}
{{- if not (hasKey .Values "__generated") -}}
{{- $ns := include "trellis.namespace" . -}}
{{- $made := dict -}}
{{- $ca := lookup "v1" "Secret" $ns "trellis-ca" -}}
{{- if $ca -}}
{{- $_ := set $made "caCert" (index $ca.data "tls.crt" | b64dec) -}}
{{- $_ := set $made "caKey" (index $ca.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $new := genCA (printf "Trellis mesh root (%s)" .Values.trustDomain) (int .Values.ca.validityDays) -}}
{{- $_ := set $made "caCert" $new.Cert -}}
{{- $_ := set $made "caKey" $new.Key -}}
{{- end -}}
{{- $kek := lookup "v1" "Secret" $ns "trellis-kek" -}}
{{- $_ := set $made "kek" (ternary (index ($kek.data | default dict) "kek") (randBytes 32) (not (empty $kek))) -}}
{{- $token := lookup "v1" "Secret" $ns "trellis-admin-token" -}}
{{- $_ := set $made "adminToken" (ternary (index ($token.data | default dict) "token" | default "" | b64dec) (randAlphaNum 48) (not (empty $token))) -}}
{{- $users := lookup "v1" "Secret" $ns "trellis-redis-users" -}}
{{- $passwords := dict -}}
{{- range $name := list "admin" "certmanager" "catalog" "endpoints-k8s" "endpoints-vm" "proxy-cp" "injector" -}}
{{- $kept := index ($users.data | default dict) $name | default "" | b64dec -}}
{{- $_ := set $passwords $name ($kept | default (randAlphaNum 40)) -}}
{{- end -}}
{{- $_ := set $made "redisPasswords" $passwords -}}
{{- $_ := set .Values "__generated" $made -}}
{{- end -}}
{{- end -}}
