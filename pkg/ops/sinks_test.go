package ops_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A resume answers once this instance has applied it, without waiting for
// a long pause's held backlog to be released (1.38M messages took 73 s:
// the admin CLI, which waits 30 s, reported an error for a resume that
// was made). The release goes on after the answer.
func TestResumeAnswersBeforeALongReleaseEnds(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "r", Shards: 1})
	if err := st.SetPaused(ctx, "s", true); err != nil {
		t.Fatal(err)
	}
	releasing := make(chan struct{})
	released := make(chan struct{})
	o := ops.New(ops.Params{Store: st, Limits: envelope.Limits{MaxDelay: time.Hour},
		Sinks: func() []ops.SinkStatus { return []ops.SinkStatus{{Name: "s", Known: true}} },
		Refresh: func(ctx context.Context) error { // a release that outlasts any caller
			close(releasing)
			<-ctx.Done()
			close(released)
			return ctx.Err()
		}})
	type answer struct {
		v   *ops.SinkView
		err error
	}
	got := make(chan answer, 1)
	go func() {
		v, err := o.SetPaused(ctx, "s", false)
		got <- answer{v, err}
	}()
	<-releasing
	select {
	case a := <-got:
		if a.err != nil || a.v.Paused {
			t.Fatalf("resume: %+v %v, want the sink resumed", a.v, a.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the resume did not answer within 30 s: it waits for the whole release")
	}
	<-released
	states, err := st.SinkStates(ctx, []string{"s"})
	if err != nil || states["s"].Paused {
		t.Fatalf("the sink in Redis after the resume: %+v %v", states, err)
	}
}

// A count that leaves shards out (store.Store.StatsAnswering: a master
// down) says which and why, in the view every reader of GET /v1/stats,
// `delaybridge stats` and the dashboard gets.
func TestStatsViewSaysWhatItLeavesOut(t *testing.T) {
	st := &store.Stats{Parked: 5, Shards: []store.ShardStats{{Shard: 0, Parked: 5}, {Shard: 2}},
		Unanswered: []int{1, 3}, UnansweredErr: errors.New("store.stats shard 3: dial tcp 10.0.0.3:6379: connection refused")}
	v := ops.NewStatsView(st)
	if !slices.Equal(v.UnansweredShards, []int{1, 3}) || !strings.Contains(v.Warning, "2 of 4 shards") ||
		!strings.Contains(v.Warning, "[1 3]") || !strings.Contains(v.Warning, "connection refused") {
		t.Errorf("unanswered %v, warning %q; want shards 1 and 3, of 4, with the error", v.UnansweredShards, v.Warning)
	}
	if v := ops.NewStatsView(&store.Stats{Shards: []store.ShardStats{{Shard: 0}}}); v.Warning != "" || v.UnansweredShards != nil {
		t.Errorf("every shard counted: warning %q, unanswered %v", v.Warning, v.UnansweredShards)
	}
	bands := errors.New("store.stats: the sinks record did not answer, hold bands as last read: connection refused")
	if v := ops.NewStatsView(&store.Stats{Shards: []store.ShardStats{{Shard: 0}}, BandsErr: bands}); v.Warning != bands.Error() {
		t.Errorf("the hold bands as last read: warning %q", v.Warning)
	}
}
