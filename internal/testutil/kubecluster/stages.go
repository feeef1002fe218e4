package kubecluster

import (
	"strconv"
	"time"
)

// Labels and annotations KWOK's stages below act on.
const (
	// NodeAnnotation marks the nodes KWOK manages (its
	// --manage-nodes-with-annotation-selector).
	NodeAnnotation = "kwok.x-k8s.io/node"
	// FailLabel set to "true" on a Pod makes KWOK fail it (phase Failed,
	// its containers exited with status 1) FailDelay after it runs: the
	// stand-in for a sandbox that crashes.
	FailLabel = "stage.kwok.brisk.dev/fail"
	// FailDelay is how long a FailLabel Pod runs first.
	FailDelay = 200 * time.Millisecond
)

var failDelayMs = strconv.FormatInt(FailDelay.Milliseconds(), 10)

// stages is KWOK's configuration: without Stage objects it starts nothing
// (and v0.8.0 refuses to start). They play a kubelet that does everything
// at once, with go templates over the object and KWOK's functions (Now,
// NodeIPWith, PodIPWith):
//   - a node becomes Ready with an InternalIP;
//   - a Pending Pod bound to a managed node runs at once, ready, with an
//     IP from its node's spec.podCIDR (loopback here: see nodePodCIDR);
//   - a running Pod labelled FailLabel fails after FailDelay;
//   - a Pod being deleted is removed (as a kubelet does once its
//     containers have stopped).
var stages = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  podPlayStageParallelism: 16
  nodePlayStageParallelism: 4
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: brisk-node-ready
spec:
  resourceRef:
    apiGroup: v1
    kind: Node
  selector:
    matchExpressions:
    - key: '.status.conditions.[] | select( .type == "Ready" ) | .status'
      operator: NotIn
      values: ["True"]
  next:
    statusTemplate: |
      {{ $now := Now | Quote }}
      conditions:
      - type: Ready
        status: "True"
        reason: KubeletReady
        message: faked by KWOK for brisk's tests
        lastHeartbeatTime: {{ $now }}
        lastTransitionTime: {{ $now }}
      addresses:
      - type: InternalIP
        address: {{ NodeIP | Quote }}
      - type: Hostname
        address: {{ .metadata.name | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: brisk-pod-run
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Pending]
  next:
    statusTemplate: |
      {{ $now := Now | Quote }}
      phase: Running
      startTime: {{ $now }}
      conditions:
      {{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
      - type: {{ . }}
        status: "True"
        lastTransitionTime: {{ $now }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now }}
      {{ end }}
      hostIP: {{ NodeIPWith .spec.nodeName | Quote }}
      podIP: {{ PodIPWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) | Quote }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: brisk-pod-fail
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.labels["` + FailLabel + `"]'
      operator: In
      values: ["true"]
    - key: .metadata.deletionTimestamp
      operator: DoesNotExist
    - key: .status.phase
      operator: In
      values: [Running]
  delay:
    durationMilliseconds: ` + failDelayMs + `
  next:
    statusTemplate: |
      {{ $now := Now | Quote }}
      phase: Failed
      conditions:
      {{ range list "ContainersReady" "Ready" }}
      - type: {{ . }}
        status: "False"
        lastTransitionTime: {{ $now }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        ready: false
        started: false
        restartCount: 0
        state:
          terminated:
            exitCode: 1
            reason: Error
            message: the test asked KWOK to fail this pod
            startedAt: {{ $now }}
            finishedAt: {{ $now }}
      {{ end }}
---
apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: brisk-pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: .metadata.deletionTimestamp
      operator: Exists
  next:
    delete: true
`
