package testenv

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Growing a running Redis Cluster: a new empty master, then slots moved onto it
// with redis-cli, as an operator does (docs/operations.md, "How to grow").

// AddMaster starts one more cluster-enabled redis-server configured like
// RedisCluster's nodes, joins it as an empty master (`redis-cli --cluster
// add-node NEW EXISTING`), appends it to Addrs and Nodes, and waits until every
// node knows every other one (WaitHealthy). It owns no slot until Rebalance (or
// a reshard) moves some onto it.
func (c *RedisClusterServer) AddMaster() *RedisServer {
	c.t.Helper()
	return c.addNode()
}

// AddReplica starts one more cluster-enabled redis-server configured like
// RedisCluster's nodes, joins it as a replica of master (`redis-cli
// --cluster add-node NEW EXISTING --cluster-slave --cluster-master-id ID`),
// appends it to Addrs and Nodes, and waits until every node knows every
// other one (WaitHealthy).
func (c *RedisClusterServer) AddReplica(master *RedisServer) *RedisServer {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id, err := master.Client().Do(ctx, "CLUSTER", "MYID").Text()
	if err != nil {
		c.t.Fatalf("testenv: CLUSTER MYID of %s: %v", master.Addr, err)
	}
	return c.addNode("--cluster-slave", "--cluster-master-id", id)
}

// addNode starts a node and joins it (`redis-cli --cluster add-node NEW
// EXISTING` and args), appends it to Addrs and Nodes, and waits until
// every node knows every other one.
func (c *RedisClusterServer) addNode(args ...string) *RedisServer {
	c.t.Helper()
	bin := lookBinary(c.t, "redis-server", "/usr/bin/redis-server")
	node := startClusterNode(c.t, bin)
	a := append([]string{"--cluster", "add-node", node.Addr, c.Addrs[0]}, args...)
	if out, err := c.cli(60*time.Second, a...); err != nil {
		c.t.Fatalf("testenv: redis-cli %s: %v\n%s", strings.Join(a, " "), err, out)
	}
	c.Nodes = append(c.Nodes, node)
	c.Addrs = append(c.Addrs, node.Addr)
	c.WaitHealthy(30 * time.Second)
	return node
}

// Rebalance runs `redis-cli --cluster rebalance ADDR --cluster-use-empty-masters`
// with args appended (e.g. "--cluster-pipeline", "10") and returns its output.
// It moves slots, with their keys (MIGRATE), onto masters that have fewer than
// their share, empty ones included, while clients go on using the cluster:
// a command on a slot being moved is answered ASK (the client follows it), and
// one naming several keys of that slot, some moved and some not, TRYAGAIN.
//
// It does not fail the test, so that it can run beside a scenario's traffic
// (in another goroutine); the caller checks the error. Allow minutes for
// thousands of slots.
func (c *RedisClusterServer) Rebalance(timeout time.Duration, args ...string) (string, error) {
	a := append([]string{"--cluster", "rebalance", c.Addrs[0], "--cluster-use-empty-masters"}, args...)
	return c.cli(timeout, a...)
}

// Check runs `redis-cli --cluster check ADDR`: an error when the nodes
// disagree about the slots' owners or a slot is left open (migrating or
// importing), with redis-cli's report.
func (c *RedisClusterServer) Check() (string, error) {
	return c.cli(30*time.Second, "--cluster", "check", c.Addrs[0])
}

func (c *RedisClusterServer) cli(timeout time.Duration, args ...string) (string, error) {
	cli := lookBinary(c.t, "redis-cli", "/usr/bin/redis-cli")
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err == nil && strings.Contains(string(out), "[ERR]") {
		err = fmt.Errorf("redis-cli %s reported an error", strings.Join(args[:2], " "))
	}
	return string(out), err
}

// MoveSlot moves one hash slot, with its keys, onto the master `to`, the way
// `redis-cli --cluster reshard` moves each slot: CLUSTER SETSLOT IMPORTING on
// the target and MIGRATING on the source, MIGRATE of the slot's keys, then
// CLUSTER SETSLOT NODE on the target, the source and every other master. When
// midway is not nil it is called with the slot open and about half of its keys
// moved, so that a test can hold the slot there, as a slot stays open for as
// long as its keys take to migrate (a big key, or many, take seconds). While it
// is open, a command naming several keys of the slot of which some are on one
// node and some on the other (or do not exist) is answered TRYAGAIN; one whose
// keys are all on the target, ASK.
//
// It returns how many keys moved. It does not fail the test (call it from any
// goroutine); on an error the slot may be left open, which Check reports.
func (c *RedisClusterServer) MoveSlot(slot int, to *RedisServer, midway func()) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	clients := map[string]*redis.Client{}
	for _, a := range c.Addrs {
		clients[a] = redis.NewClient(&redis.Options{Addr: a})
		defer clients[a].Close()
	}
	ids := map[string]string{}
	for a, cl := range clients {
		id, err := cl.Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return 0, fmt.Errorf("CLUSTER MYID on %s: %w", a, err)
		}
		ids[a] = id
	}
	slots, err := clients[to.Addr].ClusterSlots(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("CLUSTER SLOTS: %w", err)
	}
	from := ""
	for _, s := range slots {
		if s.Start <= slot && slot <= s.End && len(s.Nodes) > 0 {
			from = s.Nodes[0].Addr
		}
	}
	switch {
	case from == "":
		return 0, fmt.Errorf("slot %d has no owner", slot)
	case from == to.Addr:
		return 0, nil
	case clients[from] == nil:
		return 0, fmt.Errorf("slot %d is owned by %s, not a node of this cluster", slot, from)
	}
	src, dst := clients[from], clients[to.Addr]
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", ids[from]).Err(); err != nil {
		return 0, fmt.Errorf("SETSLOT %d IMPORTING on %s: %w", slot, to.Addr, err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", ids[to.Addr]).Err(); err != nil {
		return 0, fmt.Errorf("SETSLOT %d MIGRATING on %s: %w", slot, from, err)
	}
	moved := 0
	migrate := func(keys []string) error {
		for len(keys) > 0 {
			n := min(len(keys), 100)
			args := []any{"MIGRATE", to.Addr[:strings.LastIndexByte(to.Addr, ':')], to.Port, "", 0, 10000, "KEYS"}
			for _, k := range keys[:n] {
				args = append(args, k)
			}
			// NOKEY: every key named was gone (expired) meanwhile.
			if err := src.Do(ctx, args...).Err(); err != nil && !strings.Contains(err.Error(), "NOKEY") {
				return fmt.Errorf("MIGRATE of slot %d to %s: %w", slot, to.Addr, err)
			}
			moved += n
			keys = keys[n:]
		}
		return nil
	}
	keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1<<30).Result()
	if err != nil {
		return 0, fmt.Errorf("GETKEYSINSLOT %d: %w", slot, err)
	}
	if err := migrate(keys[:len(keys)/2]); err != nil {
		return moved, err
	}
	if midway != nil {
		midway()
	}
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
		if err != nil {
			return moved, fmt.Errorf("GETKEYSINSLOT %d: %w", slot, err)
		}
		if len(keys) == 0 {
			break
		}
		if err := migrate(keys); err != nil {
			return moved, err
		}
	}
	// The target first, then the source, then the others, as redis-cli does.
	order := []string{to.Addr, from}
	for _, a := range c.Addrs {
		if a != to.Addr && a != from {
			order = append(order, a)
		}
	}
	for _, a := range order {
		if err := clients[a].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", ids[to.Addr]).Err(); err != nil {
			return moved, fmt.Errorf("SETSLOT %d NODE on %s: %w", slot, a, err)
		}
	}
	return moved, nil
}
