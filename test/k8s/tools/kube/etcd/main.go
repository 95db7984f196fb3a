// Command etcd is etcd's own server (etcdmain), at the version Kubernetes
// itself is built and tested against, for the test cluster's API server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
