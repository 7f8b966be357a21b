package store_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
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

// A user who may not load functions, or may not call them (an ACL
// written for scripts), runs the same scripts with EVALSHA: functions are a
// saving, never a condition. Refused once, they are not tried again.
func TestScriptsRunWhereFunctionsAreRefused(t *testing.T) {
	for _, refused := range []string{"-function", "-fcall"} {
		t.Run(refused, func(t *testing.T) {
			r := testenv.Redis(t, testenv.WithArgs("--user", "nofn", "on", ">pw", "~*", "+@all", refused))
			rdb := redis.NewClient(&redis.Options{Addr: r.Addr, Username: "nofn", Password: "pw"})
			t.Cleanup(func() { _ = rdb.Close() })
			s := store.New(rdb, store.Options{Prefix: "fn", Shards: 1})
			roundTrip(t, s, "a")
			roundTrip(t, s, "b")
			fcalls, scripts := scriptCalls(t, r.Client())
			if fcalls > 1 || scripts < 6 {
				t.Fatalf("%v FCALLs (at most the first, refused) and %v script calls, want the scripts to run", fcalls, scripts)
			}
		})
	}
}

// A library Redis cannot load for now (maxmemory reached, after FUNCTION
// FLUSH) leaves the hot path to the scripts for a while: not an FCALL and
// a FUNCTION LOAD refused at every call.
func TestScriptsRunWhileALibraryCannotBeLoaded(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	rdb := r.Client()
	s := store.New(rdb, store.Options{Prefix: "fn", Shards: 1})
	park(t, s, store.Parked, msg("big", time.Now().Add(time.Hour))) // the store in use
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	used := rdb.Info(ctx, "memory").Val()
	var bytes int64
	for _, line := range strings.Split(used, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			bytes, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", strconv.FormatInt(bytes/2, 10)).Err(); err != nil { // over it: writes refused
		t.Fatal(err)
	}
	rdb.ConfigResetStat(ctx)
	for range 5 { // claims: firing runs at maxmemory (allow-oom)
		if _, err := s.Claim(ctx, 0, 10, time.Minute, nil); err != nil {
			t.Fatalf("claim at maxmemory without the library: %v", err)
		}
	}
	stats, err := testenv.CommandStats(rdb)
	if err != nil {
		t.Fatal(err)
	}
	// The first claim's FCALL finds no function and its FUNCTION LOAD is
	// refused (INFO counts it among rejected calls); it and the others run
	// as scripts.
	if fcalls, scripts := stats["fcall"].Calls, stats["evalsha"].Calls+stats["eval"].Calls; fcalls != 1 || scripts < 5 {
		t.Fatalf("five claims made %v FCALLs and %v script calls, want one FCALL, then scripts", fcalls, scripts)
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
