{{/*
The components: their name (Deployment, Service, ServiceAccount and component certificate
name), their key in values.yaml, their ports (ARCHITECTURE.md), whether they call the
Kubernetes API (only those get the API's service account token), and whether some of their
work runs on one elected replica only (leader: a Lease named trellis-<name>, rbac.yaml).
Every component may run several replicas (docs/kubernetes.md#high-availability).
*/}}
{{- define "trellis.components" -}}
certmanager: {key: certmanager, grpc: 15020, admin: 15021, kube: true, leader: true}
catalog: {key: catalog, grpc: 15010, admin: 15011, kube: true, leader: false}
endpoints-k8s: {key: endpointsK8s, grpc: 15030, admin: 15031, kube: true, leader: false}
endpoints-vm: {key: endpointsVm, grpc: 15040, admin: 15041, kube: true, leader: true}
proxy-cp: {key: proxyCp, grpc: 15128, admin: 15051, kube: false, leader: false}
injector: {key: injector, grpc: 15060, admin: 15061, kube: true, leader: false}
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

{{/* The injected pods' init container image: iptables only, the Trellis image's tag. */}}
{{- define "trellis.initImage" -}}
{{- printf "%s:%s" .Values.image.initRepository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The env prefix of a component's own settings: TRELLIS_PROXY_CP_ for proxy-cp. */}}
{{- define "trellis.prefix" -}}
{{- printf "TRELLIS_%s_" (. | upper | replace "-" "_") -}}
{{- end -}}

{{/*
Redis: standalone (one Deployment), sentinel (a StatefulSet of Redis and Sentinel pairs,
redis-sentinel.yaml) or external (yours). An empty redis.mode follows ha.enabled.
*/}}
{{- define "trellis.redisMode" -}}
{{- .Values.redis.mode | default (ternary "sentinel" "standalone" .Values.ha.enabled) -}}
{{- end -}}

{{/* The Sentinel StatefulSet's pods are <this>-<n>.<this>-headless: their stable names. */}}
{{- define "trellis.redisHeadless" -}}
{{- printf "trellis-redis-headless.%s.svc" (include "trellis.namespace" .) -}}
{{- end -}}

{{- define "trellis.redisUrl" -}}
{{- $mode := include "trellis.redisMode" . -}}
{{- if eq $mode "external" -}}
{{- required "redis.mode=external needs redis.external.url (redis://, rediss:// or redis+sentinel://)" .Values.redis.external.url -}}
{{- else if eq $mode "sentinel" -}}
{{- $headless := include "trellis.redisHeadless" . -}}
{{- $sentinels := list -}}
{{- range $i := until (int .Values.redis.sentinel.replicas) -}}
{{- $sentinels = append $sentinels (printf "trellis-redis-%d.%s:26379" $i $headless) -}}
{{- end -}}
{{- printf "redis+sentinel://%s/%s/0" (join "," $sentinels) .Values.redis.sentinel.masterName -}}
{{- else -}}
{{- printf "redis://trellis-redis.%s.svc:6379/0" (include "trellis.namespace" .) -}}
{{- end -}}
{{- end -}}

{{/* How many replicas acknowledge a write that must survive a failover (WAIT); none: "". */}}
{{- define "trellis.redisMinReplicasAck" -}}
{{- $mode := include "trellis.redisMode" . -}}
{{- if eq $mode "sentinel" -}}
{{- if ge (int .Values.redis.sentinel.minReplicasAck) (int .Values.redis.sentinel.replicas) -}}
{{- fail (printf "redis.sentinel.minReplicasAck (%d) must be below redis.sentinel.replicas (%d): one pod is the master" (int .Values.redis.sentinel.minReplicasAck) (int .Values.redis.sentinel.replicas)) -}}
{{- end -}}
{{- .Values.redis.sentinel.minReplicasAck -}}
{{- else if eq $mode "external" -}}
{{- .Values.redis.external.minReplicasAck -}}
{{- end -}}
{{- end -}}

{{/*
The ACL users of Redis under Sentinel besides the components' (files/redis-acl.yaml's
sentinel, from trellis_runtime.redisacl): the replicas' (PSYNC to their master) and the
Sentinels' (on the Redis pods and on each other).
*/}}
{{- define "trellis.redisSentinelUsers" -}}
{{- $acl := .Files.Get "files/redis-acl.yaml" | fromYaml -}}
{{- if not $acl.sentinel -}}
{{- fail "files/redis-acl.yaml has no sentinel users, which Redis under Sentinel needs: run make chart" -}}
{{- end -}}
replication: replication
sentinel: sentinel
{{- end -}}

{{- define "trellis.redisSecret" -}}
{{- if eq (include "trellis.redisMode" .) "external" -}}
{{- required "redis.mode=external needs redis.external.existingSecret: a Secret with one password per component (keys certmanager, catalog, endpoints-k8s, endpoints-vm, proxy-cp, injector)" .Values.redis.external.existingSecret -}}
{{- else -}}
{{- .Values.redis.existingUsersSecret | default "trellis-redis-users" -}}
{{- end -}}
{{- end -}}

{{/*
The in-chart Redis' users, one a line for files/redis-acl.sh: the name, then its rules
(files/redis-acl.yaml); no password and no hash, so the rendering is the same whatever the
passwords are. redis: the aclfile (the default user off, admin, each component and, under
Sentinel, the replicas' and the Sentinels' users); sentinel: the Sentinels' own users
(admin and the Sentinels' user everything, each component only where the master is).
*/}}
{{- define "trellis.redisAclRules" -}}
{{- $acl := .Files.Get "files/redis-acl.yaml" | fromYaml -}}
{{- $sentinel := eq (include "trellis.redisMode" .) "sentinel" -}}
redis.rules: |
  default {{ $acl.default }}
  admin {{ $acl.admin }}
  {{- range $name, $rules := $acl.users }}
  {{ $name }} {{ $rules }}
  {{- end }}
  {{- if $sentinel }}
  {{- $users := include "trellis.redisSentinelUsers" . | fromYaml }}
  {{ $users.replication }} {{ $acl.sentinel.replication }}
  {{ $users.sentinel }} {{ $acl.sentinel.sentinel }}
  {{- end }}
{{- if $sentinel }}
{{- $users := include "trellis.redisSentinelUsers" . | fromYaml }}
{{- $names := concat (list "admin" $users.sentinel) (keys $acl.users) | sortAlpha }}
sentinel.rules: |
  default {{ $acl.default }}
  {{- range $name := $names }}
  {{- if has $name (list "admin" $users.sentinel) }}
  {{ $name }} ~* &* +@all
  {{- else }}
  {{ $name }} {{ $acl.sentinel.queries }}
  {{- end }}
  {{- end }}
{{- end }}
redis-acl.sh: |
  {{- .Files.Get "files/redis-acl.sh" | nindent 2 }}
{{- end -}}

{{/*
What restarts the in-chart Redis when it changes: the ACL rules and script and, where the
chart made the passwords itself, the passwords (kept across upgrades, so an upgrade alone
restarts nothing). A given Secret (redis.existingUsersSecret) is not read at render time:
after rotating a password in it, restart Redis (kubectl rollout restart).
*/}}
{{- define "trellis.redisAclChecksum" -}}
{{- include "trellis.generated" . -}}
{{- $passwords := "" -}}
{{- if not .Values.redis.existingUsersSecret -}}
{{- $passwords = toJson .Values.__generated.redisPasswords -}}
{{- end -}}
{{- printf "%s\n%s" (include "trellis.redisAclRules" .) $passwords | sha256sum -}}
{{- end -}}

{{/*
High availability: what each workload (a component, or Redis under Sentinel) gets, as YAML
(fromYaml it). ha.enabled sets every knob; a knob set on its own (not null / not empty)
wins over ha, and a component's own replicas and priorityClassName win over both.
  replicas         <key>.replicas, else 2 with ha, else 1
  pdb              a PodDisruptionBudget (maxUnavailable) for 2 replicas or more
  antiAffinity     "", preferred or required, on kubernetes.io/hostname
  spread           topologySpreadConstraints across zones and nodes
  maxUnavailable   of the RollingUpdate: 0 (a new pod is ready before an old one goes),
                   1 where required anti-affinity may leave the surge pod no node
Call with (dict "root" $ "values" <the component's values> "replicas" <its default>).
*/}}
{{- define "trellis.ha" -}}
{{- $v := .root.Values -}}
{{- $ha := $v.ha.enabled -}}
{{- $replicas := int (ternary .values.replicas (.replicas | default (ternary 2 1 $ha)) (hasKey .values "replicas")) -}}
{{- $pdb := ternary $ha $v.podDisruptionBudget.enabled (kindIs "invalid" $v.podDisruptionBudget.enabled) -}}
{{- $anti := $v.podAntiAffinity | default (ternary "preferred" "none" $ha) -}}
{{- $spread := ternary $ha $v.topologySpread.enabled (kindIs "invalid" $v.topologySpread.enabled) -}}
replicas: {{ $replicas }}
pdb: {{ and $pdb (ge $replicas 2) }}
antiAffinity: {{ ternary "" $anti (eq $anti "none") | quote }}
spread: {{ $spread }}
priorityClassName: {{ .values.priorityClassName | default $v.priorityClassName | quote }}
maxUnavailable: {{ ternary 1 0 (and (eq $anti "required") (ge $replicas 2)) }}
{{- end -}}

{{/*
The scheduling of a workload's pods: priorityClassName, affinity (the values' affinity,
with pod anti-affinity on the node added unless it has its own) and topology spread.
Call with (dict "root" $ "component" <name> "ha" <trellis.ha of it>).
*/}}
{{- define "trellis.scheduling" -}}
{{- $v := .root.Values -}}
{{- $selector := include "trellis.selector" (dict "root" .root "component" .component) | fromYaml -}}
{{- with .ha.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $v.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $v.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- $affinity := deepCopy ($v.affinity | default dict) -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $selector) -}}
{{- if and .ha.antiAffinity (not (hasKey $affinity "podAntiAffinity")) -}}
{{- if eq .ha.antiAffinity "required" -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "requiredDuringSchedulingIgnoredDuringExecution" (list $term)) -}}
{{- else -}}
{{- $_ := set $affinity "podAntiAffinity" (dict "preferredDuringSchedulingIgnoredDuringExecution" (list (dict "weight" 100 "podAffinityTerm" $term))) -}}
{{- end -}}
{{- end -}}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .ha.spread }}
topologySpreadConstraints:
  {{- range $key := list "topology.kubernetes.io/zone" "kubernetes.io/hostname" }}
  - maxSkew: {{ $v.topologySpread.maxSkew }}
    topologyKey: {{ $key }}
    whenUnsatisfiable: {{ $v.topologySpread.whenUnsatisfiable }}
    labelSelector:
      matchLabels:
        {{- toYaml $selector | nindent 8 }}
  {{- end }}
{{- end }}
{{- end -}}

{{/*
A PodDisruptionBudget: a drain or an upgrade of the nodes takes at most maxUnavailable of
the workload's pods at a time. Call with (dict "root" $ "component" <name> "name" <its name>).
*/}}
{{- define "trellis.pdb" -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ .name }}
  namespace: {{ include "trellis.namespace" .root }}
  labels:
    {{- include "trellis.labels" (dict "root" .root "component" .component) | nindent 4 }}
spec:
  maxUnavailable: {{ .root.Values.podDisruptionBudget.maxUnavailable }}
  # a pod that is not ready (crash-looping) does not hold a drain up
  unhealthyPodEvictionPolicy: AlwaysAllow
  selector:
    matchLabels:
      {{- include "trellis.selector" (dict "root" .root "component" .component) | nindent 6 }}
{{- end -}}

{{- define "trellis.caSecret" -}}
{{- .Values.ca.existingSecret | default "trellis-ca" -}}
{{- end -}}

{{- define "trellis.kekSecret" -}}
{{- .Values.kek.existingSecret | default "trellis-kek" -}}
{{- end -}}

{{- define "trellis.adminTokenSecret" -}}
{{- .Values.adminToken.existingSecret | default "trellis-admin-token" -}}
{{- end -}}

{{/*
Made once per render and kept in the values, so every template that needs one gets the
same: the CA (from the release's own Secret when it exists: upgrades keep it), the KEK,
the admin token and the Redis passwords (one per user of files/redis-acl.yaml; under
Sentinel, the replicas' and the Sentinels' too). `helm template` has no cluster: it makes
new ones, so a GitOps install gives each as a Secret of its own (ca.existingSecret,
kek.existingSecret, adminToken.existingSecret, redis.existingUsersSecret) and nothing
random is made for what is given (docs/kubernetes.md#gitops-argo-cd-flux).
*/}}
{{- define "trellis.generated" -}}
{{- if not (hasKey .Values "__generated") -}}
{{- $ns := include "trellis.namespace" . -}}
{{- $made := dict -}}
{{- if not .Values.ca.existingSecret -}}
{{- $ca := lookup "v1" "Secret" $ns "trellis-ca" -}}
{{- if $ca -}}
{{- $_ := set $made "caCert" (index $ca.data "tls.crt" | b64dec) -}}
{{- $_ := set $made "caKey" (index $ca.data "tls.key" | b64dec) -}}
{{- else -}}
{{- $new := genCA (printf "Trellis mesh root (%s)" .Values.trustDomain) (int .Values.ca.validityDays) -}}
{{- $_ := set $made "caCert" $new.Cert -}}
{{- $_ := set $made "caKey" $new.Key -}}
{{- end -}}
{{- end -}}
{{- if not .Values.kek.existingSecret -}}
{{- $kek := lookup "v1" "Secret" $ns "trellis-kek" -}}
{{- $_ := set $made "kek" (ternary (index ($kek.data | default dict) "kek") (randBytes 32) (not (empty $kek))) -}}
{{- end -}}
{{- if not .Values.adminToken.existingSecret -}}
{{- $token := lookup "v1" "Secret" $ns "trellis-admin-token" -}}
{{- $_ := set $made "adminToken" (ternary (index ($token.data | default dict) "token" | default "" | b64dec) (randAlphaNum 48) (not (empty $token))) -}}
{{- end -}}
{{- if not (or .Values.redis.existingUsersSecret (eq (include "trellis.redisMode" .) "external")) -}}
{{- $users := lookup "v1" "Secret" $ns "trellis-redis-users" -}}
{{- $passwords := dict -}}
{{- range $name := include "trellis.redisUsers" . | fromYamlArray -}}
{{- $kept := index ($users.data | default dict) $name | default "" | b64dec -}}
{{- $_ := set $passwords $name ($kept | default (randAlphaNum 40)) -}}
{{- end -}}
{{- $_ := set $made "redisPasswords" $passwords -}}
{{- end -}}
{{- $_ := set .Values "__generated" $made -}}
{{- end -}}
{{- end -}}

{{/*
The in-chart Redis' users, each a key of the users Secret (trellis-redis-users, or
redis.existingUsersSecret): admin, each component of files/redis-acl.yaml and, under
Sentinel, the replicas' and the Sentinels' users. A YAML list (fromYamlArray it).
*/}}
{{- define "trellis.redisUsers" -}}
{{- $acl := .Files.Get "files/redis-acl.yaml" | fromYaml -}}
{{- $names := prepend (keys $acl.users | sortAlpha) "admin" -}}
{{- if eq (include "trellis.redisMode" .) "sentinel" -}}
{{- $names = concat $names (values (include "trellis.redisSentinelUsers" . | fromYaml) | sortAlpha) -}}
{{- end -}}
{{- toYaml $names -}}
{{- end -}}
