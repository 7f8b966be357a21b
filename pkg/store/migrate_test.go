package store_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// MigrateDown copies each mark of the dedupe window into the key of one
// message that the releases before the seen buckets read (Keys.Done),
// expiring with its bucket, so that after a rollback a re-read of a
// message this build delivered is still told as one; a second run writes
// nothing.
func TestMigrateDown(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "t", Shards: 2, DedupeWindow: time.Minute})
	m := msg("m", time.Now().Add(-time.Millisecond))
	m.Origin = envelope.Origin{Log: "orders/3", Pos: 5}
	park(t, s, store.Parked, m)
	c, err := s.Claim(ctx, s.ShardOf("m"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if n, err := s.Ack(ctx, c, []store.Done{{ID: "m", Origin: m.Origin}}); err != nil || n != 1 {
		t.Fatalf("ack: %d %v", n, err)
	}
	want := 1
	if store.LayoutOfTests() == store.Layout1 {
		want = 0 // the ack wrote it (TestAcksInLayout1KeepThePreviousReleasesMark)
	}
	if n, err := s.MigrateDown(ctx); err != nil || n.Marks != want {
		t.Fatalf("migrate down: %+v %v, want %d key written", n, err, want)
	}
	done := s.Keys().Done(s.ShardOf("m"), "m", "orders/3")
	if v, err := r.Client().Get(ctx, done).Result(); err != nil || v != "5" {
		t.Fatalf("%s: %q %v, want the position 5", done, v, err)
	}
	if ttl := r.Client().PTTL(ctx, done).Val(); ttl <= 0 || ttl > 3*time.Minute {
		t.Fatalf("%s expires in %v, want with its bucket (at most three windows)", done, ttl)
	}
	if n, err := s.MigrateDown(ctx); err != nil || n.Marks != 0 {
		t.Fatalf("migrate down again: %+v %v, want nothing written", n, err)
	}
	// Without the buckets, as a release before them reads the store: the
	// re-read is still a duplicate.
	seen, err := r.Client().Keys(ctx, "t:*:seen:*").Result()
	if err != nil || len(seen) == 0 {
		t.Fatalf("seen buckets: %v %v", seen, err)
	}
	r.Client().Del(ctx, seen...)
	park(t, s, store.Duplicate, m)
}

// MigrateUp moves every message that is not parked out of its due set into
// the key of its state, scored by its time (layout 2), and MigrateDown
// moves them back: each message reads the same before, between and after
// (Inspect, Stats, a listing), a claim made before a conversion is settled
// after it, and a second run of either moves nothing.
func TestMigrateUpAndDown(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	rdb := r.Client()
	s := store.New(rdb, store.Options{Prefix: "mig", Shards: 1, MaxDead: 100})
	k := s.Keys()
	if _, err := s.MigrateDown(ctx); err != nil { // layout 1, whatever the tests run in
		t.Fatal(err)
	}
	bands, err := s.SinkStates(ctx, []string{"s", "b"})
	if err != nil {
		t.Fatal(err)
	}
	band := bands["b"].Band
	now := time.Now()
	held, h5 := msg("held", now.Add(-time.Second)), msg("h5", now.Add(-2*time.Second))
	held.Sink, h5.Sink = "b", "b"
	p5, f5 := msg("p5", now.Add(time.Hour)), msg("f5", now.Add(-time.Second))
	p5.Priority, f5.Priority, h5.Priority = 5, 5, 5
	park(t, s, store.Parked, msg("parked", now.Add(time.Hour)), msg("flight", now.Add(-time.Second)),
		msg("ahead", now.Add(20*time.Second)), msg("slot", now.Add(-time.Second)), msg("dead", now.Add(-time.Second)),
		held, h5, p5, f5)
	l, err := s.ClaimAhead(ctx, 0, nil, nil, store.Ask{Max: 100, Lease: time.Minute, Ahead: 30 * time.Second, Blocked: map[string]int{"b": band}})
	if err != nil || len(l.Messages) != 5 {
		t.Fatalf("claim: %+v %v, want flight, slot, dead and f5 due and ahead claimed ahead", l, err)
	}
	slotAt := now.Add(10 * time.Second).Truncate(time.Millisecond)
	if n, err := s.Defer(ctx, l, []store.Slot{{ID: "slot", At: slotAt}}); err != nil || n != 1 {
		t.Fatalf("defer: %d %v", n, err)
	}
	if n, err := s.MarkDead(ctx, l, []store.Failure{{ID: "dead", Reason: "x"}}); err != nil || n != 1 {
		t.Fatalf("dead: %d %v", n, err)
	}
	ids := []string{"parked", "flight", "ahead", "slot", "dead", "held", "h5", "p5", "f5"}
	// snapshot is what the API reads of the store, its times aside. One
	// reading differs by layout, and is made the same here: layout 2 counts
	// the message waiting for its slot (in 10 s) as due, where layout 1
	// counts it at its slot.
	snapshot := func() string {
		t.Helper()
		l, err := s.CheckLayout(ctx, false)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, id := range ids {
			info := inspect(t, s, id)
			fmt.Fprintf(&b, "%s %s next=%d held=%v attempts=%d\n", id, info.State, info.NextAt.UnixMilli(), info.Held, info.Attempts)
		}
		st, err := s.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l == store.Layout1 {
			st.Due, st.DueIn.Overdue, st.DueIn.Minute = st.Due+1, st.DueIn.Overdue+1, st.DueIn.Minute-1
		}
		fmt.Fprintf(&b, "parked=%d due=%d dead=%d held=%d in=%+v forecast=%+v\n", st.Parked, st.Due, st.Dead, st.Held, st.DueIn, st.Forecast)
		got, _, _ := browseAll(t, s, store.BrowseQuery{})
		fmt.Fprintf(&b, "listing %v\n", got)
		return b.String()
	}
	zset := func(key string) map[string]float64 {
		t.Helper()
		out := map[string]float64{}
		for _, z := range rdb.ZRangeWithScores(ctx, key, 0, -1).Val() {
			out[z.Member.(string)] = z.Score
		}
		return out
	}
	before := snapshot()

	moved, err := s.MigrateUp(ctx)
	if err != nil || moved != 6 {
		t.Fatalf("migrate up: %d %v, want 6 moved (flight, f5, ahead, slot, held, h5)", moved, err)
	}
	exp := float64(l.ExpiryMs)
	for key, want := range map[string]map[string]float64{
		k.DueAt(0, 0):        {"parked": float64(now.Add(time.Hour).Truncate(time.Millisecond).UnixMilli())},
		k.DueAt(0, 5):        {"p5": float64(now.Add(time.Hour).Truncate(time.Millisecond).UnixMilli())},
		k.InflightAt(0, 0):   {"flight": exp},
		k.InflightAt(0, 5):   {"f5": exp},
		k.AheadAt(0, 0):      {"ahead": exp},
		k.SlotAt(0, 0):       {"slot": float64(slotAt.UnixMilli())},
		k.HeldAt(0, band, 0): {"held": float64(now.Add(-time.Second).Truncate(time.Millisecond).UnixMilli())},
		k.HeldAt(0, band, 5): {"h5": float64(now.Add(-2 * time.Second).Truncate(time.Millisecond).UnixMilli())},
	} {
		if got := zset(key); !maps.Equal(got, want) {
			t.Errorf("%s: %v, want %v", key, got, want)
		}
	}
	if v := rdb.HGet(ctx, k.Holding(0), "held").Val(); v != strconv.Itoa(band)+":0" {
		t.Errorf("holding says %q of the held message, want %d:0", v, band)
	}
	if v := rdb.HGet(ctx, k.Holding(0), "h5").Val(); v != strconv.Itoa(band)+":5" {
		t.Errorf("holding says %q of the held message of priority 5, want %d:5", v, band)
	}
	if v := rdb.Get(ctx, k.LayoutMark(0)).Val(); v != "2" {
		t.Errorf("the shard's marker is %q, want 2", v)
	}
	if l, err := s.CheckLayout(ctx, false); err != nil || l != store.Layout2 {
		t.Errorf("recorded layout %d %v, want 2", l, err)
	}
	if after := snapshot(); after != before {
		t.Fatalf("the store reads otherwise in layout 2:\n%s\nwas:\n%s", after, before)
	}
	if again, err := s.MigrateUp(ctx); err != nil || again != 0 {
		t.Fatalf("migrate up again: %d %v, want nothing moved", again, err)
	}
	// The claim of layout 1 is settled in layout 2.
	if n, err := s.Ack(ctx, l, []store.Done{{ID: "flight"}}); err != nil || n != 1 {
		t.Fatalf("ack of a claim made before the migration: %d %v", n, err)
	}
	ids = slices.DeleteFunc(ids, func(id string) bool { return id == "flight" })
	before = snapshot()

	down, err := s.MigrateDown(ctx)
	if err != nil || down.Moved != 5 {
		t.Fatalf("migrate down: %+v %v, want 5 moved (f5, ahead, slot, held, h5)", down, err)
	}
	for _, key := range []string{k.InflightAt(0, 0), k.InflightAt(0, 5), k.AheadAt(0, 0), k.SlotAt(0, 0), k.HeldAt(0, band, 0), k.HeldAt(0, band, 5), k.Holding(0)} {
		if rdb.Exists(ctx, key).Val() != 0 {
			t.Errorf("%s is left after migrate down", key)
		}
	}
	if v := rdb.Get(ctx, k.LayoutMark(0)).Val(); v != "1" {
		t.Errorf("the shard's marker is %q after migrate down, want 1", v)
	}
	if got := zset(k.DueAt(0, 0)); len(got) != 4 || got["slot"] != float64(slotAt.UnixMilli())+0.25 || got["ahead"] != exp+0.75 {
		t.Errorf("due set after migrate down: %v, want parked, ahead, slot and held at their layout-1 scores", got)
	}
	if after := snapshot(); after != before {
		t.Fatalf("the store reads otherwise back in layout 1:\n%s\nwas:\n%s", after, before)
	}
	if again, err := s.MigrateDown(ctx); err != nil || again.Moved != 0 {
		t.Fatalf("migrate down again: %+v %v, want nothing moved", again, err)
	}
}

// A daemon of this build that runs while another process migrates follows
// each shard, empty ones included, both ways: after migrate down its next
// scripts run in layout 1 (an empty shard is not marked 2 again), its looks
// at Redis that run no script (Occupied, ReleaseAll) read either layout
// whatever it takes a shard to be in, and after migrate up it runs in
// layout 2 again.
func TestMigrateWhileADaemonRuns(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	rdb := r.Client()
	o := store.Options{Prefix: "run", Shards: 2, MaxDead: 100}
	daemon, other := store.New(rdb, o), store.New(rdb, o)
	k := daemon.Keys()
	if _, err := daemon.MigrateUp(ctx); err != nil { // layout 2, whatever the tests run in
		t.Fatal(err)
	}
	bands, err := daemon.SinkStates(ctx, []string{"s", "b"})
	if err != nil {
		t.Fatal(err)
	}
	band := bands["b"].Band
	// m in its shard; the other shard empty, as the daemon knows it
	m := msg("m", time.Now().Add(-time.Second))
	park(t, daemon, store.Parked, m)
	sh := daemon.ShardOf("m")
	empty := 1 - sh
	if _, err := daemon.Claim(ctx, empty, 10, time.Minute, nil); err != nil {
		t.Fatal(err)
	}

	if _, err := other.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	// The daemon, still taking both shards for layout 2, claims the empty
	// one and parks into it, and holds m for its blocked sink.
	if _, err := daemon.Claim(ctx, empty, 10, time.Minute, nil); err != nil {
		t.Fatalf("claim of the empty shard after migrate down: %v", err)
	}
	var into string
	for i := 0; ; i++ {
		if id := fmt.Sprintf("n%d", i); daemon.ShardOf(id) == empty {
			into = id
			break
		}
	}
	park(t, daemon, store.Parked, msg(into, time.Now().Add(time.Hour)))
	held := msg("h0", time.Now().Add(-time.Second))
	held.Sink = "b"
	for i := 1; daemon.ShardOf(held.ID) != sh; i++ {
		held.ID = fmt.Sprintf("h%d", i)
	}
	park(t, daemon, store.Parked, held)
	if c, err := daemon.Claim(ctx, sh, 10, time.Minute, map[string]int{"b": band}); err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim after migrate down: %+v %v, want m in flight and the held one held", c, err)
	}
	for shard := range 2 {
		if v := rdb.Get(ctx, k.LayoutMark(shard)).Val(); v != "1" {
			t.Errorf("shard %d's marker is %q after the daemon ran on it, want 1", shard, v)
		}
		for _, key := range []string{k.InflightAt(shard, 0), k.HeldAt(shard, band, 0), k.Holding(shard)} {
			if rdb.Exists(ctx, key).Val() != 0 {
				t.Errorf("the daemon wrote %s in layout 1", key)
			}
		}
	}
	if n := rdb.ZCard(ctx, k.Due(empty)).Val(); n != 1 {
		t.Errorf("the empty shard's due set holds %d, want the message parked into it", n)
	}

	// Up again under it: its looks that run no script read layout 2 while
	// it still takes the shards for layout 1.
	if _, err := other.MigrateUp(ctx); err != nil {
		t.Fatal(err)
	}
	if occ, err := daemon.Occupied(ctx, []int{sh}); err != nil || !occ[0] {
		t.Errorf("occupied after migrate up by another process: %v %v, want m's lease seen", occ, err)
	}
	if n := rdb.ZCard(ctx, k.HeldAt(sh, band, 0)).Val(); n != 1 {
		t.Fatalf("held set of band %d holds %d after migrate up, want the held message", band, n)
	}
	if n, err := daemon.ReleaseAll(ctx, band, 100); err != nil || n != 1 {
		t.Errorf("release after migrate up by another process: %d %v, want the held message", n, err)
	}
	if info := inspect(t, daemon, held.ID); info.State != store.StateScheduled {
		t.Errorf("the released message is %s, want scheduled", info.State)
	}
}

// A store begun in layout 2 has no marker on a shard no script has written
// yet. Migrate down marks it "1" too: a daemon of this build that still
// takes the store for layout 2 and parks there afterwards then writes
// layout 1, which the previous release reads, instead of marking the
// shard "2".
func TestMigrateDownMarksUntouchedShards(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	o := store.Options{Prefix: "fresh", Shards: 2, MaxDead: 100}
	daemon, other := store.New(rdb, o), store.New(rdb, o)
	k := daemon.Keys()
	if _, err := other.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	for shard := range 2 {
		if v := rdb.Get(ctx, k.LayoutMark(shard)).Val(); v != "1" {
			t.Errorf("shard %d's marker is %q after migrate down of a store nothing was written to, want 1", shard, v)
		}
	}
	m := msg("m", time.Now().Add(-time.Second))
	park(t, daemon, store.Parked, m)
	sh := daemon.ShardOf("m")
	if c, err := daemon.Claim(ctx, sh, 10, time.Minute, nil); err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim after migrate down: %+v %v, want m", c, err)
	}
	if v := rdb.Get(ctx, k.LayoutMark(sh)).Val(); v != "1" {
		t.Errorf("shard %d's marker is %q after the daemon parked and claimed there, want 1", sh, v)
	}
	if rdb.Exists(ctx, k.InflightAt(sh, 0)).Val() != 0 {
		t.Errorf("the claim wrote %s, a layout-2 key, after migrate down", k.InflightAt(sh, 0))
	}
	if n := rdb.ZCard(ctx, k.Due(sh)).Val(); n != 1 {
		t.Errorf("the due set holds %d, want m in flight there at its layout-1 score", n)
	}
}

// Migrate down takes out the marks a cancel leaves on a series in flight
// (endseries), which the previous release would take for a message
// waiting, and keeps a message that waited behind one.
func TestMigrateDownDropsTheSeriesEndMarks(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := store.New(rdb, store.Options{Prefix: "t", Shards: 1})
	next := s.Keys().Next(0)
	rdb.HSet(ctx, next, "ended", "E", "ended-then-new", "EFblob", "replaced", "blob")
	if _, err := s.MigrateDown(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := rdb.HGetAll(ctx, next).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["ended-then-new"] != "Fblob" || got["replaced"] != "blob" {
		t.Errorf("Keys.Next after migrate down: %v, want the follower and the replacement, no end mark", got)
	}
}

// In layout 1, where the previous release runs beside this build during a
// rolling upgrade, an ack also writes the key Keys.Done that that release
// reads to tell a re-read, as it wrote it itself: a re-read of a message
// this build delivered that reaches one of its daemons is a duplicate
// there too. (Before, this build remembered it in the seen buckets only,
// and that release parked and published such re-reads again: 207 of 400 in
// a probe.) In layout 2, which that release never runs in, nothing more is
// written.
func TestAcksInLayout1KeepThePreviousReleasesMark(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	rdb := r.Client()
	s := store.New(rdb, store.Options{Prefix: "side", Shards: 2, DedupeWindow: time.Minute})
	if _, err := s.MigrateDown(ctx); err != nil { // layout 1, as a store the previous release wrote
		t.Fatal(err)
	}
	deliver := func(id string, pos uint64) *envelope.Message {
		t.Helper()
		m := msg(id, time.Now().Add(-time.Millisecond))
		m.Origin = envelope.Origin{Log: "orders/3", Pos: pos}
		park(t, s, store.Parked, m)
		c, err := s.Claim(ctx, s.ShardOf(id), 10, time.Minute, nil)
		if err != nil || len(c.Messages) != 1 {
			t.Fatalf("claim %s: %+v %v", id, c, err)
		}
		if n, err := s.Ack(ctx, c, []store.Done{{ID: id, Origin: m.Origin}}); err != nil || n != 1 {
			t.Fatalf("ack %s: %d %v", id, n, err)
		}
		return m
	}
	m := deliver("m", 5)
	done := s.Keys().Done(s.ShardOf("m"), "m", "orders/3")
	if v, err := rdb.Get(ctx, done).Result(); err != nil || v != "5" {
		t.Fatalf("%s after an ack in layout 1: %q %v, want the position 5", done, v, err)
	}
	if ttl := rdb.PTTL(ctx, done).Val(); ttl <= 0 || ttl > 3*time.Minute {
		t.Fatalf("%s expires in %v, want with its bucket (at most three windows)", done, ttl)
	}
	// Read as that release reads the store, without the buckets: a
	// duplicate.
	seen, err := rdb.Keys(ctx, "side:*:seen:*").Result()
	if err != nil || len(seen) == 0 {
		t.Fatalf("seen buckets: %v %v", seen, err)
	}
	rdb.Del(ctx, seen...)
	park(t, s, store.Duplicate, m)

	if _, err := s.MigrateUp(ctx); err != nil {
		t.Fatal(err)
	}
	deliver("n", 6)
	if n := rdb.Exists(ctx, s.Keys().Done(s.ShardOf("n"), "n", "orders/3")).Val(); n != 0 {
		t.Fatal("an ack in layout 2 wrote the previous release's key")
	}
}
