package ops_test

import (
	"context"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/brokers/rabbitbroker"
	"github.com/delaybridge/delaybridge/pkg/destination"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A POST's delay counts from the request's arrival to the nanosecond the
// daemon's clock gives: the due time is that arrival plus the delay,
// rounded up to the millisecond. Truncated to the millisecond first, a
// request that arrived late in a millisecond was due up to a millisecond
// before its arrival plus its delay.
func TestPostDelayNeverEndsBeforeArrivalPlusDelay(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "p", Shards: 1})
	arrival := time.Now().Add(time.Minute).Truncate(time.Millisecond).Add(999_999 * time.Nanosecond)
	o := ops.New(ops.Params{Store: st, Limits: envelope.Limits{MaxDelay: 24 * time.Hour},
		Destinations: destination.Sinks{"rabbit": rabbitbroker.Destinations}.Lookup,
		Now:          func() time.Time { return arrival }})
	body := "x"
	v, err := o.Post(ctx, &ops.PostRequest{Delay: ops.Text("1000"), Sink: "rabbit", Destination: "orders.expired", Body: &body})
	if err != nil {
		t.Fatal(err)
	}
	if want := envelope.FormatTime(envelope.CeilMillis(arrival.Add(time.Second))); v.DueAt != want {
		t.Fatalf("due %s, want %s (arrival %v plus 1s, rounded up)", v.DueAt, want, arrival)
	}
}
