package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// roundTrip parks a message due now, claims it and acks it, and fails
// unless each step did what it should.
func roundTrip(t *testing.T, s *store.Store, id string) {
	t.Helper()
	ctx := context.Background()
	park(t, s, store.Parked, msg(id, time.Now().Add(-time.Millisecond)))
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 || c.Messages[0].ID != id {
		t.Fatalf("claim of %s: %+v %v", id, c, err)
	}
	if n, err := s.Ack(ctx, c, []store.Done{{ID: id}}); err != nil || n != 1 {
		t.Fatalf("ack of %s: %d acked, %v", id, n, err)
	}
	if _, err := s.Inspect(ctx, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after the ack of %s: inspect %v, want not found", id, err)
	}
}

// scriptCalls returns Redis's count of FCALL and of EVALSHA and EVAL calls.
func scriptCalls(t *testing.T, rdb redis.UniversalClient) (fcalls, scripts float64) {
	t.Helper()
	stats, err := testenv.CommandStats(rdb)
	if err != nil {
		t.Fatal(err)
	}
	return stats["fcall"].Calls, stats["evalsha"].Calls + stats["eval"].Calls
}

// The hot path's scripts run as Redis functions, loaded once; a Redis
// that lost them (FUNCTION FLUSH, as a server that came back empty) gets
// them again at the next call, and nothing fails meanwhile.
func TestHotScriptsRunAsFunctions(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "fn", Shards: 1})
	roundTrip(t, s, "a")
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "delaybridge_*"}).Result()
	if err != nil || len(libs) < 3 {
		t.Fatalf("libraries loaded after a park, a claim and an ack: %d, %v; want one each", len(libs), err)
	}
	rdb.ConfigResetStat(ctx)
	roundTrip(t, s, "b")
	if fcalls, _ := scriptCalls(t, rdb); fcalls < 3 {
		t.Fatalf("a park, a claim and an ack made %v FCALLs, want 3", fcalls)
	}
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s, "c")
	if libs, _ := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: "delaybridge_*"}).Result(); len(libs) < 3 {
		t.Fatalf("after FUNCTION FLUSH and a round trip, %d libraries loaded again", len(libs))
	}
}

// A user who may not load functions (or a Redis without them) runs the
// same scripts with EVALSHA: functions are a saving, never a condition.
func TestScriptsRunWhereFunctionsAreRefused(t *testing.T) {
	r := testenv.Redis(t, testenv.WithArgs("--user", "nofn", "on", ">pw", "~*", "+@all", "-function"))
	rdb := redis.NewClient(&redis.Options{Addr: r.Addr, Username: "nofn", Password: "pw"})
	t.Cleanup(func() { _ = rdb.Close() })
	s := store.New(rdb, store.Options{Prefix: "fn", Shards: 1})
	roundTrip(t, s, "a")
	roundTrip(t, s, "b")
	fcalls, scripts := scriptCalls(t, r.Client())
	if fcalls > 1 || scripts < 6 {
		t.Fatalf("%v FCALLs (at most the first, refused) and %v script calls, want the scripts to run", fcalls, scripts)
	}
}

// NoFunctions runs the hot path as scripts, for a comparison.
func TestNoFunctions(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "fn", Shards: 1, NoFunctions: true})
	roundTrip(t, s, "a")
	if fcalls, _ := scriptCalls(t, rdb); fcalls != 0 {
		t.Fatalf("NoFunctions made %v FCALLs", fcalls)
	}
	if n, _ := rdb.FunctionList(ctx, redis.FunctionListQuery{}).Result(); len(n) != 0 {
		t.Fatalf("NoFunctions loaded %d libraries", len(n))
	}
}
