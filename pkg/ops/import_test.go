package ops_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A dead message that had publish attempts is imported whatever its
// sink's size limit says (a retry checks it, as it checks its sink):
// those that died as too large for their sink are what an export of a
// store holds of them. A scheduled one too large for its sink is refused,
// as ingest refuses it.
func TestImportKeepsDeadMessagesTooLargeForTheirSink(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	from := store.New(r.Client(), store.Options{Prefix: "from", Shards: 1})
	due := time.Now().Add(-time.Second).Truncate(time.Millisecond)
	for _, id := range []string{"died", "waits"} {
		m := &envelope.Message{ID: id, DueAt: due, Sink: "s", Destination: "d", IngestedAt: due, Body: []byte("a large body")}
		if id == "waits" {
			m.DueAt = due.Add(time.Hour)
		}
		if _, err := from.Park(ctx, []*envelope.Message{m}); err != nil {
			t.Fatal(err)
		}
	}
	lease, err := from.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(lease.Messages) != 1 {
		t.Fatalf("claim %+v %v", lease, err)
	}
	if _, err := from.MarkDead(ctx, lease, []store.Failure{{ID: "died", Reason: "too large"}}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := from.Export(ctx, &buf, store.ExportOptions{Dead: true}); err != nil {
		t.Fatal(err)
	}
	to := store.New(r.Client(), store.Options{Prefix: "to", Shards: 1})
	o := ops.New(ops.Params{Store: to, Limits: envelope.Limits{MaxDelay: 24 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 200,
		Fits: func(m *envelope.Message) error { return errors.New("sink s takes 4 bytes") }}})
	st, err := o.Import(ctx, &buf, store.ImportOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Imported != 1 || st.Dead != 1 || st.Bad != 1 {
		t.Fatalf("imported %+v, want the dead one in and the scheduled one refused", st)
	}
	if info, err := to.Inspect(ctx, "died"); err != nil || info.State != store.StateDead {
		t.Fatalf("the dead message: %+v %v", info, err)
	}
}

// A series keeps through export and import the missed_max it was parked
// with, as it keeps its missed policy: the importing route's applied to it
// instead. A line without it (the previous release's export) takes the
// route's, as before.
func TestImportKeepsASeriesMissedMax(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	from := store.New(r.Client(), store.Options{Prefix: "from", Shards: 1})
	due := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	m := &envelope.Message{ID: "series", DueAt: due, Sink: "s", Destination: "d", Ingest: "in", IngestedAt: due.Add(-time.Hour), Body: []byte("b"),
		Recur: &envelope.Recurrence{Every: time.Hour, Anchor: due, N: 1, Missed: envelope.MissedAll, MissedMax: 5}}
	if _, err := from.Park(ctx, []*envelope.Message{m}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := from.Export(ctx, &buf, store.ExportOptions{}); err != nil {
		t.Fatal(err)
	}
	line := buf.String()
	if !strings.Contains(line, `"missed_max":5`) {
		t.Fatalf("the export line has no missed_max 5: %s", line)
	}
	dests := destination.Sinks{"s": rabbitbroker.Destinations}.Lookup
	route := &envelope.Route{Ingest: "in", Sink: "s", Destination: "d", Sinks: dests, Missed: envelope.MissedSkip, MissedMax: 2}
	for _, c := range []struct {
		prefix, line string
		want         int
	}{
		{"kept", line, 5},
		{"earlier", strings.Replace(line, `,"missed_max":5`, "", 1), 2},
	} {
		to := store.New(r.Client(), store.Options{Prefix: c.prefix, Shards: 1})
		o := ops.New(ops.Params{Store: to, Limits: envelope.Limits{MaxDelay: 24 * time.Hour, MaxPayloadBytes: 1 << 20, MaxHeaderBytes: 64 << 10, MaxIDBytes: 200},
			Destinations: dests, Routes: func(string) (*envelope.Route, bool) { return route, true }})
		if st, err := o.Import(ctx, strings.NewReader(c.line), store.ImportOptions{}); err != nil || st.Imported != 1 {
			t.Fatalf("%s: import %+v %v", c.prefix, st, err)
		}
		info, err := to.Inspect(ctx, "series")
		if err != nil || info.Message.Recur == nil {
			t.Fatalf("%s: %+v %v", c.prefix, info, err)
		}
		if got := info.Message.Recur; got.MissedBound() != c.want || got.Missed != envelope.MissedAll {
			t.Errorf("%s: imported with missed %v, missed_max %d; want all and %d", c.prefix, got.Missed, got.MissedBound(), c.want)
		}
		if v := ops.NewRecurrenceView(info.Message.Recur, info.Message.DueAt, false); v.MissedMax != c.want {
			t.Errorf("%s: the view shows missed_max %d, want %d", c.prefix, v.MissedMax, c.want)
		}
	}
}
