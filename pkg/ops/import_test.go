package ops_test

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
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
