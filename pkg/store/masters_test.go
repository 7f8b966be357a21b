package store_test

import (
	"context"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// ForEachMaster visits the masters that hold the store's keys, each once,
// and waits on no other node: with a replica hung (SIGSTOP), every call
// answers within its time. go-redis's ForEachMaster reads the slots again
// first from a node taken at random, and waited on the hung replica in
// about one call of seven (the capacity gate measures the masters' memory
// every quarter second under limits.max_redis_memory).
func TestForEachMasterWaitsOnNoOtherNode(t *testing.T) {
	cluster := testenv.RedisCluster(t, 3)
	replica := cluster.AddReplica(cluster.Nodes[1])
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cluster.Addrs})
	t.Cleanup(func() { _ = c.Close() })
	st := store.New(c, store.Options{Prefix: "m", Shards: 16})
	// The client reads the slots once, as a daemon does at its start,
	// before the replica hangs: the first read asks a node taken at random.
	if err := st.ForEachMaster(context.Background(), func(context.Context, *redis.Client) error { return nil }); err != nil {
		t.Fatal(err)
	}
	replica.Signal(syscall.SIGSTOP)
	defer replica.Signal(syscall.SIGCONT)
	var want []string
	for _, n := range cluster.Nodes[:3] {
		want = append(want, n.Addr)
	}
	slices.Sort(want)
	for i := 0; i < 30; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var mu sync.Mutex
		var got []string
		err := st.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu.Lock()
			got = append(got, c.Options().Addr)
			mu.Unlock()
			return c.Ping(ctx).Err()
		})
		cancel()
		slices.Sort(got)
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("call %d with a replica hung: visited %v (%v), want the masters %v", i, got, err, want)
		}
	}
}
