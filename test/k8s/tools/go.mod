// Module tools holds the one-node test cluster's driver (./cluster) and
// the pause program (./pause). It is separate from puzzleq's go.mod so
// that nothing the cluster needs reaches the service's dependency graph;
// the Kubernetes, CoreDNS and KEDA builds have modules of their own below
// (kube/, coredns/, keda/).
module github.com/puzzleq/puzzleq/test/k8s/tools

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
