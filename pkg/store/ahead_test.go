package store_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// claimAhead claims shard 0 of s with an ahead window, failing the test on
// error.
func claimAhead(t *testing.T, s *store.Store, ahead, lease time.Duration) *store.Lease {
	t.Helper()
	c, err := s.ClaimAhead(context.Background(), 0, nil, nil, store.Ask{Max: 100, Lease: lease, Ahead: ahead})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func byID(c *store.Lease) map[string]store.Claimed {
	out := map[string]store.Claimed{}
	for _, m := range c.Messages {
		out[m.ID] = m
	}
	return out
}

// A claim takes what is due in flight, what falls due within the ahead
// window ahead (not in flight: scheduled, at its due time), and nothing
// later; it says when a claim may find something new: halfway into the
// window of the next due message.
func TestClaimAheadTakesTheWindow(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	now := time.Now()
	if _, err := s.Park(ctx, []*envelope.Message{
		msg("due", now.Add(-time.Second)),
		msg("soon", now.Add(2*time.Second)),
		msg("later", now.Add(time.Hour)),
	}); err != nil {
		t.Fatal(err)
	}
	c := claimAhead(t, s, 10*time.Second, 2*time.Hour)
	got := byID(c)
	if len(got) != 2 || got["due"].Ahead || !got["soon"].Ahead {
		t.Fatalf("claimed %+v; want due in flight and soon ahead", got)
	}
	if want := now.Add(2 * time.Second).Truncate(time.Millisecond); !got["soon"].At.Equal(want) {
		t.Fatalf("soon falls due at %v, want %v", got["soon"].At, want)
	}
	if want := now.Add(time.Hour - 5*time.Second).Truncate(time.Millisecond); !c.Next.Equal(want) {
		t.Fatalf("next = %v, want %v (the next due time less half the window)", c.Next, want)
	}
	info, err := s.Inspect(ctx, "soon")
	if err != nil {
		t.Fatal(err)
	}
	if info.State != store.StateScheduled || !info.NextAt.Equal(got["soon"].At) || info.Attempts != 0 {
		t.Fatalf("inspect of a message claimed ahead: %s at %v, %d attempts; want scheduled at its due time, 0",
			info.State, info.NextAt, info.Attempts)
	}
	if info, _ := s.Inspect(ctx, "due"); info.State != store.StateInflight {
		t.Fatalf("inspect of the due one: %s, want inflight", info.State)
	}
	// A listing says the same as Inspect.
	page, err := s.Browse(ctx, store.BrowseQuery{State: store.StateScheduled, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, in := range page.Messages {
		found = found || in.ID == "soon"
		if in.ID == "soon" && (in.State != store.StateScheduled || !in.NextAt.Equal(got["soon"].At)) {
			t.Fatalf("listed a message claimed ahead as %s at %v; want scheduled at its due time %v (as Inspect)", in.State, in.NextAt, got["soon"].At)
		}
	}
	if !found {
		t.Fatal("the message claimed ahead is not listed as scheduled")
	}
	// Another instance takes none of it.
	if other := claimAhead(t, s, 10*time.Second, time.Minute); len(other.Messages) != 0 {
		t.Fatalf("a second claimer took %d messages claimed ahead by the first", len(other.Messages))
	}
}

// Commit puts a message claimed ahead in flight only once it is due on
// Redis's clock, and only if nothing changed it since the claim: a cancel,
// a replace or a reschedule that Redis ran first wins.
func TestCommitHonoursWhatCameFirst(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	due := time.Now().Add(300 * time.Millisecond)
	var msgs []*envelope.Message
	for _, id := range []string{"kept", "cancelled", "replaced", "rescheduled", "given-back"} {
		msgs = append(msgs, msg(id, due))
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	c := claimAhead(t, s, time.Minute, time.Minute)
	if len(c.Messages) != len(msgs) {
		t.Fatalf("claimed %d ahead, want %d", len(c.Messages), len(msgs))
	}
	got := byID(c)

	now, res, err := s.Commit(ctx, c, []store.Claimed{got["kept"]}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if now.Before(got["kept"].At) && res[0] != store.NotYet {
		t.Fatalf("commit before the due instant: %v, want NotYet", res[0])
	}

	if err := s.Cancel(ctx, "cancelled"); err != nil {
		t.Fatal(err)
	}
	nr := msg("replaced", due.Add(time.Hour))
	nr.Replace = true
	if r, err := s.Park(ctx, []*envelope.Message{nr}); err != nil || r[0] != store.Replaced {
		t.Fatalf("replace of a message claimed ahead: %v %v; want replaced (it is not in flight)", r, err)
	}
	if _, err := s.Reschedule(ctx, "rescheduled", due.Add(time.Hour), time.Time{}); err != nil {
		t.Fatalf("reschedule of a message claimed ahead: %v (it is not in flight)", err)
	}
	// A stop gives back what it holds ahead: scheduled again at its due time.
	if _, _, err := s.Commit(ctx, c, nil, []store.Claimed{got["given-back"]}); err != nil {
		t.Fatal(err)
	}

	testenv.Eventually(t, 10*time.Second, func() bool { return time.Now().After(due.Add(5 * time.Millisecond)) })
	commit := []store.Claimed{got["kept"], got["cancelled"], got["replaced"], got["rescheduled"], got["given-back"]}
	now, res, err = s.Commit(ctx, c, commit, nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Committed{store.InFlight, store.Gone, store.Gone, store.Gone, store.Gone}
	for i, r := range res {
		if r != want[i] {
			t.Errorf("commit of %s at %v: %v, want %v", commit[i].ID, now, r, want[i])
		}
	}
	if info, _ := s.Inspect(ctx, "kept"); info.State != store.StateInflight {
		t.Fatalf("kept after its commit: %s, want inflight", info.State)
	}
	if n, err := s.Ack(ctx, c, acks("kept")); err != nil || n != 1 {
		t.Fatalf("ack of the committed message under its lease: %d %v", n, err)
	}
	for id, due := range map[string]time.Time{"replaced": due.Add(time.Hour), "rescheduled": due.Add(time.Hour), "given-back": due} {
		info, err := s.Inspect(ctx, id)
		if err != nil || info.State != store.StateScheduled || !info.NextAt.Equal(due.Truncate(time.Millisecond)) {
			t.Errorf("%s: %+v %v; want scheduled at %v", id, info, err, due)
		}
	}
	if _, err := s.Inspect(ctx, "cancelled"); err == nil {
		t.Error("the cancelled message is still known")
	}
	// What was given back is anybody's at its due time, a first attempt.
	again := claimAhead(t, s, 0, time.Minute)
	if m := byID(again)["given-back"]; m.ID == "" || m.Ahead || m.Attempt != 1 {
		t.Fatalf("claim after the give-back: %+v; want given-back in flight, attempt 1", byID(again))
	}
}

// A claimer that dies holding messages claimed ahead loses nothing: at the
// end of the lease any instance claims them, never before their due time
// (a window longer than the lease is cut to it), and the claim ahead that
// never published counts no attempt. The dead claimer's late commit does
// nothing.
func TestExpiredClaimAheadIsClaimedAgain(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	due := time.Now().Add(time.Second).Truncate(time.Millisecond)
	if _, err := s.Park(ctx, []*envelope.Message{msg("a", due)}); err != nil {
		t.Fatal(err)
	}
	first := claimAhead(t, s, 5*time.Second, 1500*time.Millisecond)
	if len(first.Messages) != 1 || !first.Messages[0].Ahead {
		t.Fatalf("first claim: %+v", first.Messages)
	}
	var second *store.Lease
	testenv.Eventually(t, 10*time.Second, func() bool {
		second = claimAhead(t, s, 5*time.Second, time.Minute)
		return len(second.Messages) == 1
	}, "not claimed again after the lease of the claim ahead ended")
	if m := second.Messages[0]; m.Ahead || m.Attempt != 1 {
		t.Fatalf("claimed again: ahead %v, attempt %d; want in flight, attempt 1", m.Ahead, m.Attempt)
	}
	if second.Now.Before(due) || second.Now.Before(first.Expiry()) {
		t.Fatalf("claimed again at %v, before its due time %v or the end of the first lease %v", second.Now, due, first.Expiry())
	}
	// A window longer than the lease is cut to it.
	if _, err := s.Park(ctx, []*envelope.Message{msg("b", time.Now().Add(time.Hour))}); err != nil {
		t.Fatal(err)
	}
	if c := claimAhead(t, s, 2*time.Hour, time.Minute); len(c.Messages) != 0 {
		t.Fatalf("a claim ahead of 2h with a lease of 1m took %+v: it would come back before its due time", c.Messages)
	}
	if _, res, err := s.Commit(ctx, first, first.Messages, nil); err != nil || res[0] != store.Gone {
		t.Fatalf("the first claimer's commit: %v %v, want Gone", res, err)
	}
}

// A message committed ahead is in flight before its due instant (at most
// the commit lead before it): a cancel and a group's cancel refuse it (it
// will be published), and the changes that take effect are answered after
// that instant: a reschedule (in flight) and a replacement (parked behind
// it, after the instant). What was answered before the instant therefore
// still won. The store runs
// with a lead of 300 ms (2 ms in a deployment), so that the changes start
// inside it on a loaded machine too.
func TestChangesWaitForACommitAhead(t *testing.T) {
	const lead = 300 * time.Millisecond
	ctx := context.Background()
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "w", Shards: 1, MaxDead: 1000, CommitLead: lead})
	now, err := r.Client().Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	due := now.Add(time.Second).Truncate(time.Millisecond)
	kinds := []string{"cancel", "group", "move", "replace"}
	var msgs []*envelope.Message
	for _, id := range kinds {
		m := msg(id, due)
		if id == "group" {
			m.Group = "g"
		}
		msgs = append(msgs, m)
	}
	if _, err := s.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}
	c := claimAhead(t, s, time.Minute, time.Minute)
	if len(c.Messages) != len(msgs) {
		t.Fatalf("claimed %d ahead, want %d", len(c.Messages), len(msgs))
	}
	// Nothing is committed before the lead; everything from then on.
	var committed time.Time
	testenv.Eventually(t, 10*time.Second, func() bool {
		redisNow, res, err := s.Commit(ctx, c, c.Messages, nil)
		if err != nil {
			t.Fatal(err)
		}
		early := redisNow.Before(due.Add(-lead))
		for i, r := range res {
			if r == store.Gone || (r == store.InFlight) == early {
				t.Fatalf("commit of %s at %v, %v before its instant: %v (lead %v)", c.Messages[i].ID, redisNow, due.Sub(redisNow), r, lead)
			}
		}
		committed = redisNow
		return !early
	}, "not committed within the lead")
	if !committed.Before(due) {
		t.Fatalf("the first commit within the lead came %v after the instant: the test's Eventually polled too slowly", committed.Sub(due))
	}

	type answer struct {
		started, answered time.Time
		err               error
		res               string
	}
	answers := make([]answer, len(kinds))
	var wg sync.WaitGroup
	for i, kind := range kinds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := answer{started: time.Now()}
			switch kind {
			case "cancel":
				a.err = s.Cancel(ctx, kind)
			case "group":
				var n, inflight int
				n, inflight, a.err = s.CancelGroup(ctx, "g")
				a.res = fmt.Sprint(n, "/", inflight)
			case "move":
				_, a.err = s.Reschedule(ctx, kind, due.Add(time.Hour), time.Time{})
			case "replace":
				nr := msg(kind, due.Add(time.Hour))
				nr.Replace = true
				var res []store.ParkResult
				res, a.err = s.Park(ctx, []*envelope.Message{nr})
				if a.err == nil {
					a.res = res[0].String()
				}
			}
			a.answered = time.Now() // Redis's clock is this machine's
			answers[i] = a
		}()
	}
	wg.Wait()
	want := map[string]string{"cancel": store.ErrInFlight.Error() + " ", "group": "<nil> 0/1", "move": store.ErrInFlight.Error() + " ", "replace": "<nil> queued"}
	for i, kind := range kinds {
		a := answers[i]
		if got := fmt.Sprintf("%v %s", a.err, a.res); got != want[kind] {
			t.Errorf("%s of a message committed ahead: %q, want %q", kind, got, want[kind])
		}
		if !a.started.Before(due) {
			t.Errorf("%s started %v after the instant, although the commit came %v before it: nothing was checked", kind, a.started.Sub(due), due.Sub(committed))
			continue
		}
		if a.answered.Before(due) && kind != "cancel" && kind != "group" { // refused: nothing to win over
			t.Errorf("%s of a message committed ahead, started %v before its instant, answered %v before it: it is published all the same",
				kind, due.Sub(a.started), due.Sub(a.answered))
		}
	}
}
