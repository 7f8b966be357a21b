package store_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
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

// TestStatsAnsweringLeavesOutAMasterDown: with one master of a Redis
// Cluster down (here with cluster-require-full-coverage no, so that the
// others serve their slots), Stats fails, as what bounds and alerts on the
// counts needs; StatsAnswering counts the shards that answer and lists the
// others, where the operators' view failed as a whole. When the master
// down holds the sinks record, the hold bands are those last read.
func TestStatsAnsweringLeavesOutAMasterDown(t *testing.T) {
	for _, sinksDown := range []bool{false, true} {
		t.Run(map[bool]string{false: "another master", true: "the sinks record's master"}[sinksDown], func(t *testing.T) {
			statsWithAMasterDown(t, sinksDown)
		})
	}
}

func statsWithAMasterDown(t *testing.T, sinksDown bool) {
	cluster := testenv.RedisCluster(t, 3)
	c := cluster.Client()
	ctx := context.Background()
	st := store.New(c, store.Options{Prefix: "m", Shards: 16})
	now := time.Now().Truncate(time.Millisecond)
	var msgs []*envelope.Message
	for i := range 64 {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("m-%d", i), DueAt: now.Add(time.Hour), Sink: "s", Destination: "d", Body: []byte("x")})
	}
	park(t, st, store.Parked, msgs...)
	if err := st.SetPaused(ctx, "s", false); err != nil { // the sinks record exists
		t.Fatal(err)
	}
	if _, err := st.Stats(ctx); err != nil { // and its bands are read
		t.Fatal(err)
	}
	sinksAt, err := c.MasterForKey(ctx, st.Keys().Sinks())
	if err != nil {
		t.Fatal(err)
	}
	var down *testenv.RedisServer
	for _, n := range cluster.Nodes {
		if err := n.Client().ConfigSet(ctx, "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
		if down == nil && (n.Addr == sinksAt.Options().Addr) == sinksDown {
			down = n
		}
	}
	owner := map[int]string{} // shard -> the address of its master
	for shard := range 16 {
		m, err := c.MasterForKey(ctx, st.Keys().Pool(shard))
		if err != nil {
			t.Fatal(err)
		}
		owner[shard] = m.Options().Addr
	}
	down.Kill()

	if _, err := st.Stats(ctx); err == nil {
		t.Errorf("Stats with a master down: no error; what bounds the counts would read too few")
	}
	got, err := st.StatsAnswering(ctx)
	if err != nil {
		t.Fatalf("StatsAnswering with one master of three down: %v", err)
	}
	var want []int
	for shard := range 16 {
		if owner[shard] == down.Addr {
			want = append(want, shard)
		}
	}
	if !slices.Equal(got.Unanswered, want) || got.UnansweredErr == nil {
		t.Errorf("unanswered %v (%v), want the shards of the master down %v", got.Unanswered, got.UnansweredErr, want)
	}
	var parked int64
	for _, m := range msgs {
		if !slices.Contains(want, st.ShardOf(m.ID)) {
			parked++
		}
	}
	if got.Parked != parked || len(got.Shards) != 16-len(want) {
		t.Errorf("parked %d over %d shards, want %d over %d: the shards that answer", got.Parked, len(got.Shards), parked, 16-len(want))
	}
	for _, ss := range got.Shards {
		if slices.Contains(want, ss.Shard) {
			t.Errorf("shard %d of the master down is counted: %+v", ss.Shard, ss)
		}
	}
	if (got.BandsErr != nil) != sinksDown {
		t.Errorf("the hold bands as last read: %v, want that error only with the sinks record's master down", got.BandsErr)
	}
}
