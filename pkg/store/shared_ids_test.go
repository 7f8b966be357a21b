package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Message IDs and group keys are one space per store (redis.key_prefix),
// shared by every ingest, as docs/security.md ("The shared ID space")
// says: a publisher on one ingest cannot replace another ingest's message
// by its ID (x-delay-replace: IDTaken), but cancels it (x-delay-cancel)
// and cancels its group (x-delay-cancel-group); a store of another key
// prefix is out of reach. This test holds the page to what delaybridge
// does: if that changes, it fails, and the page must say so.
func TestIDsAndGroupsAreSharedByEveryIngest(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 4)
	other := store.New(s.Client(), store.Options{Prefix: "tenant-b", Shards: 4})
	now := time.Now()
	routeOf := func(ingest string) *envelope.Route {
		return &envelope.Route{Ingest: ingest, Sink: "out", Destination: "fired." + ingest}
	}
	parse := func(ingest string, published time.Time, kv ...string) envelope.Decision {
		in := &envelope.Incoming{Body: []byte(ingest), PublishedAt: published}
		for i := 0; i+1 < len(kv); i += 2 {
			in.Headers = append(in.Headers, envelope.Header{Key: kv[i], Value: kv[i+1]})
		}
		return envelope.Parse(in, routeOf(ingest), envelope.Limits{}, now, nil)
	}
	for _, st := range []*store.Store{s, other} {
		for _, id := range []string{"order-1", "order-2", "order-3"} {
			park(t, st, store.Parked, parse("tenant-a", now.Add(-time.Minute), "x-message-id", id, "x-delay", "1h", "x-delay-group", "cart-1").Message)
		}
	}
	// From the other ingest: a newer version of order-1 (refused), a
	// cancel of order-2, a cancel of the group cart-1.
	park(t, s, store.IDTaken, parse("tenant-b", now, "x-message-id", "order-1", "x-delay", "1h", "x-delay-replace", "true").Message)
	if got := inspect(t, s, "order-1").Message; got.Ingest != "tenant-a" || got.Destination != "fired.tenant-a" {
		t.Fatalf("order-1 after tenant-b's replace: %+v", got)
	}
	if d := parse("tenant-b", now, "x-delay-cancel", "order-2"); d.Action != envelope.Cancel || s.Cancel(ctx, d.CancelID) != nil {
		t.Fatalf("tenant-b cannot cancel order-2: %+v", d)
	}
	d := parse("tenant-b", now, "x-delay-cancel-group", "cart-1")
	if d.Action != envelope.CancelGroup {
		t.Fatalf("cancel-group: %+v", d)
	}
	if n, _, err := s.CancelGroup(ctx, d.Group); err != nil || n != 2 {
		t.Fatalf("tenant-b cancelled %d of tenant-a's group (%v), want order-1 and order-3", n, err)
	}
	for _, id := range []string{"order-1", "order-3"} {
		if _, err := s.Inspect(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("%s: %v", id, err)
		}
	}
	// Another key prefix is another ID space: untouched.
	for _, id := range []string{"order-1", "order-2", "order-3"} {
		if got := inspect(t, other, id).Message; got.Ingest != "tenant-a" {
			t.Fatalf("%s under the other prefix: %+v", id, got)
		}
	}
}
