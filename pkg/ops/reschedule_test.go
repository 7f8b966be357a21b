package ops_test

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The daemon's clock (Params.Now) is never behind Redis's and may lead it
// by a round trip of its measure. A reschedule to a deliver_at that this
// clock has passed and Redis's has not must keep that time: taken for
// passed, it was set to Redis's now, before the time asked for. One passed
// by far fires now, as before.
func TestRescheduleToATimeOnlyOurClockPassed(t *testing.T) {
	ctx := context.Background()
	st := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "o", Shards: 1})
	m := &envelope.Message{ID: "m", DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond), Sink: "s", Destination: "d", IngestedAt: time.Now(), Body: []byte("x")}
	if _, err := st.Park(ctx, []*envelope.Message{m}); err != nil {
		t.Fatal(err)
	}
	const lead = 300 * time.Millisecond // this Redis runs on this machine: its clock is time.Now's
	o := ops.New(ops.Params{Store: st, Limits: envelope.Limits{MaxDelay: 24 * time.Hour},
		Now: func() time.Time { return time.Now().Add(lead) }})
	at := time.Now().Add(lead / 2).Truncate(time.Millisecond).Add(time.Millisecond)
	v, err := o.Reschedule(ctx, "m", ops.RescheduleRequest{DeliverAt: ops.Text(strconv.FormatInt(at.UnixMilli(), 10))})
	if err != nil {
		t.Fatal(err)
	}
	if v.DueAt != envelope.FormatTime(at) {
		t.Fatalf("rescheduled to %s, want %s (Now %v)", v.DueAt, envelope.FormatTime(at), v.Now)
	}
	v, err = o.Reschedule(ctx, "m", ops.RescheduleRequest{DeliverAt: ops.Text("2001-01-01T00:00:00Z")})
	if err != nil {
		t.Fatal(err)
	}
	if due, _ := time.Parse(time.RFC3339Nano, v.DueAt); !v.Now || time.Since(due) > 5*time.Second {
		t.Fatalf("into the past: %+v, want now", v)
	}
}

// A change of a message this instance cannot read (sealed with a key it
// does not have) is a conflict that says so, not an internal error.
func TestChangeOfAMessageSealedWithAnotherKeyIsAConflict(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	parkSealed(t, rdb, time.Hour)
	o := ops.New(ops.Params{Store: store.New(rdb, store.Options{Prefix: "k", Shards: 1, Sealer: keyring(t, "k3", 3)}),
		Limits: envelope.Limits{MaxDelay: 24 * time.Hour}, Now: time.Now})
	err := o.Fire(ctx, "m")
	if !errors.Is(err, ops.ErrConflict) || !strings.Contains(err.Error(), "cannot open what is stored") {
		t.Fatalf("fire: %v, want a conflict saying the instance cannot read it", err)
	}
	_, err = o.Reschedule(ctx, "m", ops.RescheduleRequest{Delay: ops.Text("5m")})
	if !errors.Is(err, ops.ErrConflict) {
		t.Fatalf("reschedule: %v, want a conflict", err)
	}
	if err := o.Cancel(ctx, "m"); err != nil {
		t.Fatalf("cancel of a message this instance cannot read: %v", err)
	}
}

// A dead message this instance cannot open (sealed with a key it does not
// have) is whole: its retry is refused with what to do (configure the
// key, or retry where it is), never "delete it".
func TestRetryOfADeadMessageSealedWithAnotherKeySaysWhatToDo(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	sealed := parkSealed(t, rdb, -time.Second)
	c, err := sealed.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("claim: %+v %v", c, err)
	}
	if _, err := sealed.MarkDead(ctx, c, []store.Failure{{ID: "m", Reason: "refused"}}); err != nil {
		t.Fatal(err)
	}
	o := ops.New(ops.Params{Store: store.New(rdb, store.Options{Prefix: "k", Shards: 1, Sealer: keyring(t, "k3", 3)}),
		Limits: envelope.Limits{MaxDelay: 24 * time.Hour}, Now: time.Now})
	err = o.RetryDead(ctx, "m", ops.RetryRequest{})
	if !errors.Is(err, ops.ErrConflict) || !strings.Contains(err.Error(), "configure its key") || strings.Contains(err.Error(), "delete it") {
		t.Fatalf("retry: %v, want a conflict that says to configure the key", err)
	}
}

// keyring is a keyring of one key, id, of 32 bytes b.
func keyring(t *testing.T, id string, b byte) *seal.Keyring {
	t.Helper()
	k, err := seal.New(id, []seal.Key{{ID: id, Secret: bytes.Repeat([]byte{b}, seal.KeySize)}})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// parkSealed parks a message "m" due in due, sealed with the key k2, in a
// store of prefix "k" and one shard, and returns that store.
func parkSealed(t *testing.T, rdb redis.UniversalClient, due time.Duration) *store.Store {
	t.Helper()
	sealed := store.New(rdb, store.Options{Prefix: "k", Shards: 1, Sealer: keyring(t, "k2", 2)})
	m := &envelope.Message{ID: "m", DueAt: time.Now().Add(due).Truncate(time.Millisecond), Sink: "s", Destination: "d", IngestedAt: time.Now(), Body: []byte("x")}
	if _, err := sealed.Park(context.Background(), []*envelope.Message{m}); err != nil {
		t.Fatal(err)
	}
	return sealed
}
