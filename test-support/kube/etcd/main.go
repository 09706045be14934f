// Command etcd runs etcd's server from the go.etcd.io/etcd/server/v3 module. meshkit's
// Kubernetes tests start it as the storage of their kube-apiserver.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
