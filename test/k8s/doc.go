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
// and leaves it running. By hand:
//
//	cd test/k8s/tools && go build -o /var/cache/puzzleq-k8s/bin/cluster ./cluster && cd -
//	C=/var/cache/puzzleq-k8s/bin/cluster
//	$C up -keda; $C check; $C deploy dev; $C kubectl -n puzzleq get pods; $C down
//
// check and deploy create the API's keys Secret with random keys, kept in
// /var/lib/puzzleq-k8s/api-keys.json. The pods' and services' ranges
// (10.217.0.0/16, 10.218.0.0/16) live on the bridge pzq0, nothing is
// masqueraded, and a mangle rule drops anything forwarded off the
// machine; cluster down removes every chain, bridge, mount, cgroup and
// namespace it made, restores the sysctls it changed, and fails if
// anything is left.
package k8s
