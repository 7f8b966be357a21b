package testenv

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// RedisSentinel starts one redis-server in sentinel mode monitoring the
// master masterAddr under masterName (quorum 1), with short timeouts so that
// a failover takes a few seconds: down-after 1 s, failover-timeout 3 s. It
// returns once the sentinel answers PING, and kills it at cleanup.
func RedisSentinel(t testing.TB, masterName, masterAddr string) *RedisServer {
	skipShort(t, "Redis Sentinel")
	t.Helper()
	bin := lookBinary(t, "redis-server", "/usr/bin/redis-server")
	port := reservePorts(t, portLo, portHi)
	dir := t.TempDir()
	host, mport, err := splitHostPort(masterAddr)
	if err != nil {
		t.Fatalf("testenv: sentinel: %v", err)
	}
	conf := fmt.Sprintf(`port %d
bind 127.0.0.1
dir %s
logfile %s
sentinel monitor %s %s %d 1
sentinel down-after-milliseconds %s 1000
sentinel failover-timeout %s 3000
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "redis.log"), masterName, host, mport, masterName, masterName, masterName)
	path := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatalf("testenv: sentinel: %v", err)
	}
	return newRedisServer(t, bin, port, dir, []string{path, "--sentinel"})
}

func splitHostPort(addr string) (string, int, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	p, err := strconv.Atoi(port)
	return host, p, err
}
