{{/* Names, labels and the kopf command line, shared by every template. */}}

{{- define "compilecache.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* RELEASE-NAME, or RELEASE alone when it already contains the chart name; at most 63 characters. */}}
{{- define "compilecache.fullname" -}}
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

{{- define "compilecache.selectorLabels" -}}
app.kubernetes.io/name: {{ include "compilecache.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "compilecache.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "compilecache.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: compilecache-operator
{{- end }}

{{- define "compilecache.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "compilecache.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "compilecache.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}

{{/* Peering (kopf --peering) is always on, also with one replica: a rolling update's surge pod then
starts paused behind the running one instead of being a second active controller (docs/high-availability.md). */}}
{{- define "compilecache.peering" -}}
true
{{- end }}

{{- define "compilecache.peeringName" -}}
{{- default (include "compilecache.fullname" .) .Values.peering.name }}
{{- end }}

{{- define "compilecache.webhookService" -}}
{{- printf "%s-webhook" (include "compilecache.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The Secret with the webhook's serving certificate: the user's own (webhook.existingSecret), or the chart's. */}}
{{- define "compilecache.webhookSecret" -}}
{{- if .Values.webhook.existingSecret }}
{{- .Values.webhook.existingSecret }}
{{- else }}
{{- printf "%s-webhook-tls" (include "compilecache.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The arguments after `compilecache operator`: kopf run's own options. */}}
{{- define "compilecache.kopfArgs" -}}
{{- if include "compilecache.peering" . }}
- --peering={{ include "compilecache.peeringName" . }}
{{- else }}
- --standalone
{{- end }}
{{- if .Values.watchNamespaces }}
{{- range .Values.watchNamespaces }}
- --namespace={{ . }}
{{- end }}
{{- else }}
- --all-namespaces
{{- end }}
- --liveness=http://0.0.0.0:{{ .Values.healthPort }}/healthz
{{- with (get (dict "quiet" "--quiet" "verbose" "--verbose" "debug" "--debug") .Values.logLevel) }}
- {{ . }}
{{- end }}
{{- end }}

{{/*
RBAC rules on namespaced resources: in the ClusterRole when every namespace is watched, else in
one Role per watched namespace. Each verb is one the operator (or kopf in it) was recorded making
against the API emulator (tests/test_chart.py derives them), or is on the test's documented list.
*/}}
{{- define "compilecache.namespacedRules" -}}
# kopf lists and watches the CompileCaches it serves; each reconciliation reads the cache again.
- apiGroups: [compilecache.dev]
  resources: [compilecaches]
  verbs: [get, list, watch]
# The reconciliation writes only the status sub-resource.
- apiGroups: [compilecache.dev]
  resources: [compilecaches/status]
  verbs: [patch]
# Jobs and claims the operator creates name their cache as owner with blockOwnerDeletion, which an
# API server with OwnerReferencesPermissionEnforcement (OpenShift) admits only from a user who may
# update the owner's finalizers (kubernetes.io/docs/reference/access-authn-authz/admission-controllers/
# #ownerreferencespermissionenforcement). The operator itself never writes finalizers.
- apiGroups: [compilecache.dev]
  resources: [compilecaches/finalizers]
  verbs: [update]
# Warm-up and expiry Jobs: kopf lists and watches them into the operator's indexes, which passes read;
# a pass creates and deletes (older spec hashes) them, lists them again after a 409 on a create (the
# watch may not have brought what another party made), and reads a training Job that
# podTemplate.templateRef names.
# With spec.warmup.provisioningRequest a Job is created suspended and patched (spec.suspend: false) once
# its ProvisioningRequest is Provisioned.
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, delete, patch]
# Training's pod template that spec.warmup.podTemplate.templateRef names (a PodTemplate, a Job above,
# or a workload kind below): PodTemplates are watched into an index (and read by name after a 409).
# With spec.warmup.provisioningRequest, each warm-up Job's pod template is also made a PodTemplate (what
# its ProvisioningRequest points at), deleted with the request once the Job has finished.
- apiGroups: [""]
  resources: [podtemplates]
  verbs: [get, list, watch, create, delete]
# Cluster Autoscaler's ProvisioningRequests of caches that ask for their capacity with one: listed by the
# cache's label at each of their passes (not watched: most clusters do not serve the kind), created before
# the Job, deleted once the Job has finished or is superseded.
- apiGroups: [autoscaling.x-k8s.io]
  resources: [provisioningrequests]
  verbs: [list, create, delete]
{{- if .Values.kueue.enabled }}
# Kueue's Workloads: of a warm-up or expiry Job that waits in a queue (spec.warmup.queue), listed by
# the Job's uid at each pass while the Job is suspended, so the pool says why it is not admitted yet;
# of training Jobs, listed and watched by kopf for the AdmissionCheck controller (get: a read by name),
# which patches only a Workload's status: a JSON patch that tests, then replaces, its own check's entry
# in status.admissionChecks. Never the spec, nor create or delete: Kueue owns admission.
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads]
  verbs: [get, list, watch]
- apiGroups: [kueue.x-k8s.io]
  resources: [workloads/status]
  verbs: [patch]
{{- end }}
# The workload kinds a templateRef may name besides those above, each read (get) by name at each pass
# of a cache that names one; a TrainJob's namespaced TrainingRuntime too (a ClusterTrainingRuntime is
# cluster-scoped: in the ClusterRole).
- apiGroups: [jobset.x-k8s.io]
  resources: [jobsets]
  verbs: [get]
- apiGroups: [leaderworkerset.x-k8s.io]
  resources: [leaderworkersets]
  verbs: [get]
- apiGroups: [trainer.kubeflow.org]
  resources: [trainjobs, trainingruntimes]
  verbs: [get]
- apiGroups: [kubeflow.org]
  resources: [pytorchjobs]
  verbs: [get]
- apiGroups: [ray.io]
  resources: [rayjobs]
  verbs: [get]
# The cache's claim: watched into an index (read by name after a 409), and created when
# spec.storage.pvc.create asks for it.
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, list, watch, create]
# The headless Service of a multi-host warm-up Job: watched into an index, created with the Job and
# deleted once its Job has finished or is superseded.
- apiGroups: [""]
  resources: [services]
  verbs: [list, watch, create, delete]
# Events about caches, posted by the operator and by kopf; a pass lists the Events on a warm-up or
# expiry pod that waits for a node (by its uid: what the cluster autoscaler or Karpenter said).
- apiGroups: [""]
  resources: [events]
  verbs: [list, create]
# Pods: watched into an index (training pods by cache, warm-up and expiry pods by Job) and patched to
# lift the gate; the gate watchdog lists unscheduled ones. Not tied to webhook.enabled: the operator
# watches them either way, and kopf fails on a denied watch.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, patch]
{{- end }}
