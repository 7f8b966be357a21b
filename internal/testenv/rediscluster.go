package testenv

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RedisClusterServer is a Redis Cluster of masters without replicas.
type RedisClusterServer struct {
	Addrs []string       // "127.0.0.1:PORT" of every node
	Nodes []*RedisServer // the node processes (each can be Stop/Kill/Start-ed)

	t testing.TB
}

// RedisCluster starts n >= 3 redis-server masters (cluster-enabled, node timeout 2000 ms,
// AOF on with appendfsync everysec, each in its own t.TempDir()), joins them with
// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, and waits until
// every node reports cluster_state:ok, knows all n nodes and sees all 16384 slots
// assigned. Takes about 2 s. Every node's port p and bus port p+10000 are reserved.
//
// Caveats: redis-cli --cluster create refuses fewer than 3 masters. Without replicas,
// a killed node's slots are unavailable until it is started again (Start keeps its
// port, dir and nodes.conf, so it rejoins with the same slots). Every key of one Lua
// script or MULTI must share a {hash tag}, or Redis answers CROSSSLOT.
func RedisCluster(t testing.TB, n int) *RedisClusterServer {
	skipShort(t, "a Redis Cluster")
	t.Helper()
	if n < 3 {
		t.Fatalf("testenv.RedisCluster: need at least 3 masters, got %d", n)
	}
	bin := lookBinary(t, "redis-server", "/usr/bin/redis-server")
	cli := lookBinary(t, "redis-cli", "/usr/bin/redis-cli")

	c := &RedisClusterServer{t: t}
	for i := 0; i < n; i++ {
		node := startClusterNode(t, bin)
		c.Nodes = append(c.Nodes, node)
		c.Addrs = append(c.Addrs, node.Addr)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	createArgs := append([]string{"--cluster", "create"}, c.Addrs...)
	createArgs = append(createArgs, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, cli, createArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	c.WaitHealthy(30 * time.Second)
	return c
}

// WaitHealthy waits until every node reports cluster_state:ok, knows every node and
// has all 16384 slots assigned; it fails the test after timeout. Call it after
// restarting a node.
func (c *RedisClusterServer) WaitHealthy(timeout time.Duration) {
	c.t.Helper()
	clients := make([]*redis.Client, len(c.Addrs))
	for i, a := range c.Addrs {
		clients[i] = redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1, DialTimeout: time.Second})
		defer clients[i].Close()
	}
	want := []string{
		"cluster_state:ok",
		"cluster_slots_assigned:16384",
		"cluster_known_nodes:" + strconv.Itoa(len(c.Addrs)),
	}
	var last string
	ok := Poll(timeout, func() bool {
		for i, cl := range clients {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			info, err := cl.ClusterInfo(ctx).Result()
			cancel()
			if err != nil {
				last = c.Addrs[i] + ": " + err.Error()
				return false
			}
			for _, w := range want {
				if !strings.Contains(info, w+"\r\n") && !strings.HasSuffix(info, w) {
					last = c.Addrs[i] + ": no " + w + " in\n" + info
					return false
				}
			}
		}
		return true
	})
	if !ok {
		c.t.Fatalf("testenv: redis cluster %v not healthy after %v: %s", c.Addrs, timeout, last)
	}
}

// Client returns a go-redis ClusterClient seeded with every node, closed in t.Cleanup.
func (c *RedisClusterServer) Client() *redis.ClusterClient {
	cl := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	c.t.Cleanup(func() { _ = cl.Close() })
	return cl
}

// startClusterNode starts one cluster-enabled redis-server, not yet part of
// any cluster, on a reserved port p (and bus port p+10000).
func startClusterNode(t testing.TB, bin string) *RedisServer {
	t.Helper()
	port := reservePorts(t, clusterLo, clusterHi, 10000)
	dir := t.TempDir()
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--dir", dir,
		"--logfile", filepath.Join(dir, "redis.log"),
		"--daemonize", "no",
		"--save", "",
		"--appendonly", "yes",
		"--appendfsync", "everysec",
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf", // relative to --dir
		"--cluster-node-timeout", "2000",
	}
	return newRedisServer(t, bin, port, dir, args)
}
