// Package kube is the "kube" runtime: each regular sandbox is a Kubernetes
// Pod created through the kube-apiserver and bound directly to the node the
// worker stands for (spec.nodeName, no scheduler: brisk's placer has already
// chosen the node, as KubeDirect's does), so that Pods are visible to
// kubectl, counted by ResourceQuotas and run by the node's kubelet. With
// PlaceScheduler the worker node stands for many Kubernetes nodes instead:
// its Pods are created unbound, carrying its name, and kube-scheduler
// places them (placement.go).
//
// Kubernetes objects are the record: the runtime keeps no state of its own.
// Readiness and ends are learned from the Pods through one shared informer
// (Shared), which many Runtimes in one process share (one per node, as in
// the many-node benchmarks); it watches only brisk's Pods (label
// app.kubernetes.io/managed-by=brisk) in one namespace and indexes them by
// worker node. A restarted worker finds its Pods in that cache (List) and
// adopts them; nothing is created again and nothing ended comes back.
//
// Emergency sandboxes never come here: they keep the worker's node-local
// fast path.
//
// What the runtime needs of the API: get, list, watch, create and delete on
// pods in its namespace (see Role); sizing a scheduling worker node from its
// nodes also needs get and list on nodes (NodeReaderRole).
package kube
