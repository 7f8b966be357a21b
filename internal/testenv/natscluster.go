package testenv

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// NATSNode is one server of a NATSCluster.
type NATSNode struct {
	Server *server.Server
	URL    string // its client URL
	Tag    string // its server tag, "node:<i>": a stream's placement names it
}

// NATSCluster starts n nats-servers in this process as one JetStream
// cluster (client and route ports chosen by the system), and waits until
// the cluster has its JetStream leader. Each node can be shut down on its
// own (Server.Shutdown); all are at the end of the test.
func NATSCluster(t testing.TB, n int) []*NATSNode {
	skipShort(t, "a NATS cluster")
	t.Helper()
	clients, routes := make([]int, n), make([]int, n)
	var routeURLs []*url.URL
	for i := range n {
		clients[i], routes[i] = reservePorts(t, portLo, portHi), reservePorts(t, portLo, portHi)
		routeURLs = append(routeURLs, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", routes[i])})
	}
	nodes := make([]*NATSNode, n)
	for i := range nodes {
		tag := fmt.Sprintf("node:%d", i)
		s, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("testenv-node-%d", i),
			Host:       "127.0.0.1", Port: clients[i],
			JetStream: true, StoreDir: t.TempDir(), Tags: []string{tag},
			Cluster: server.ClusterOpts{Name: "testenv", Host: "127.0.0.1", Port: routes[i]},
			Routes:  routeURLs,
			NoLog:   true, NoSigs: true,
		})
		if err != nil {
			t.Fatalf("testenv: nats cluster node %d: %v", i, err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		nodes[i] = &NATSNode{Server: s, URL: fmt.Sprintf("nats://127.0.0.1:%d", clients[i]), Tag: tag}
	}
	for i, nd := range nodes {
		if !nd.Server.ReadyForConnections(30 * time.Second) {
			t.Fatalf("testenv: nats cluster node %d not ready after 30s", i)
		}
	}
	Eventually(t, 30*time.Second, func() bool {
		leaders := 0
		for _, nd := range nodes {
			if !nd.Server.JetStreamIsCurrent() {
				return false
			}
			if nd.Server.JetStreamIsLeader() {
				leaders++
			}
		}
		return leaders == 1
	}, "the NATS cluster's JetStream has its leader")
	return nodes
}
