package daemon_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// With redis.sentinel_addrs the store finds the master through Sentinel and
// follows a failover: after the master dies, the replica that Sentinel
// promotes takes the parks, and what was parked before is still there.
func TestSentinelFailover(t *testing.T) {
	master := testenv.Redis(t, testenv.WithAppendFsync("always"))
	replica := testenv.Redis(t, testenv.WithArgs("--replicaof", "127.0.0.1", fmt.Sprint(master.Port)))
	sentinel := testenv.RedisSentinel(t, "mymaster", master.Addr)

	cfg, err := config.Parse([]byte(fmt.Sprintf(`
redis: {sentinel_addrs: ["%s"], master_name: mymaster, key_prefix: s, shards: 4, read_timeout: 500ms, dial_timeout: 500ms}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:1"}}]
`, sentinel.Addr)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	st, err := daemon.OpenStore(ctx, cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Client().Close()

	park := func(id string) error {
		_, err := st.Park(ctx, []*envelope.Message{{ID: id, DueAt: time.Now().Add(time.Hour), Sink: "s", Destination: "d"}})
		return err
	}
	if err := park("before"); err != nil {
		t.Fatal(err)
	}
	// Wait until the replica has it, then lose the master.
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, _ := replica.Client().Exists(ctx, st.Keys().Pool(st.ShardOf("before"))).Result()
		return n == 1
	}, "replica never synced")
	master.Kill()

	testenv.Eventually(t, 30*time.Second, func() bool { return park("after") == nil }, "no master after failover")
	role, err := replica.Client().Do(ctx, "ROLE").Slice()
	if err != nil || role[0] != "master" {
		t.Fatalf("replica role %v %v: the write went elsewhere", role, err)
	}
	for _, id := range []string{"before", "after"} {
		if _, err := st.Inspect(ctx, id); err != nil {
			t.Fatalf("%s after failover: %v", id, err)
		}
	}
}
