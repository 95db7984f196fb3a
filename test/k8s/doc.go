// Package k8s is puzzleq's suite on a real, one-node Kubernetes cluster
// (build tag k8s; needs root). The cluster is test/k8s/tools/cluster:
// Kubernetes, etcd, CoreDNS and KEDA built from the Go module proxy,
// containerd and runc from Debian, images packed from this checkout. The
// suite applies the overlays of deploy/k8s as they are, sends work
// through the api Service and checks every answer against a local solve,
// kills and rolls pods under load, and watches KEDA scale the workers.
//
//	go test -tags k8s ./test/k8s/ -v -timeout 40m
//
// It starts the cluster itself and tears it down at the end; with
// PUZZLEQ_K8S_REUSE=1 it uses one already started by `cluster up -keda`
// and leaves it running.
package k8s
