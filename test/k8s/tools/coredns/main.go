// Command coredns is CoreDNS with only the plugins the test cluster's
// Corefile uses: bind, errors, health, ready, kubernetes (cluster.local
// records), cache and loadbalance. There is no forward plugin, so a name
// outside the cluster gets no answer rather than a query sent off the
// machine. CoreDNS's own directive order (dnsserver.Directives) still
// applies: a directive listed there but not linked in is simply unused.
package main

import (
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() { coremain.Run() }
