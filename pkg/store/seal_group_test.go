package store_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// groupIndex reads every member of every shard's group index.
func groupIndex(t *testing.T, s *store.Store) []string {
	t.Helper()
	var all []string
	for sh := 0; sh < s.Shards(); sh++ {
		m, err := s.Client().ZRange(context.Background(), s.Keys().Groups(sh), 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, m...)
	}
	slices.Sort(all)
	return all
}

// groupIDs lists a group's members as GET /v1/groups/{key} does, and as
// a browse by group (parked, then dead) does, and checks that both agree
// with its size.
func groupIDs(t *testing.T, s *store.Store, group string) []string {
	t.Helper()
	ctx := context.Background()
	ids, err := s.GroupMembers(ctx, group, 0)
	if err != nil {
		t.Fatal(err)
	}
	n, err := s.GroupSize(ctx, group)
	if err != nil || int(n) != len(ids) {
		t.Fatalf("GroupSize %d %v, members %v", n, err, ids)
	}
	var browsed []string
	for _, state := range []string{"", store.StateDead} {
		p, err := s.Browse(ctx, store.BrowseQuery{State: state, Group: group, Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		for _, info := range p.Messages {
			browsed = append(browsed, info.ID)
		}
	}
	slices.Sort(browsed)
	if !slices.Equal(browsed, ids) {
		t.Fatalf("browse by group %v, members %v", browsed, ids)
	}
	return ids
}

// With encryption, the group index holds a keyed hash of the group, not
// the group, and a group is still found, listed and cancelled
// by its name: across a key rotation (messages sealed with the old key, the
// new one, and in clear from before encryption), an ack that names the
// group as the active key indexes it takes a message of the old key or in
// clear out of the index too, and reencrypt moves the index with the blob.
func TestSealedGroupIndex(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	now := time.Now()
	const group = "GROUP-SECRET-order-42"
	clear := sealedStore(rdb, nil)
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	s12 := sealedStore(rdb, keyringOf(t, "k2", "k1", "k2"))
	grouped := func(id string, due time.Time) *envelope.Message {
		m := secretMsg(id, due)
		m.Group = group
		return m
	}
	cron := grouped("k1-cron", now.Add(time.Hour))
	cron.Recur = &envelope.Recurrence{Cron: "0 9 * * 1-5", TimeZone: "America/New_York", Anchor: cron.DueAt, N: 1}
	park(t, clear, store.Parked, grouped("clear-due", now.Add(-time.Second)))
	park(t, s1, store.Parked, grouped("k1-due", now.Add(-time.Second)), grouped("k1-later", now.Add(time.Hour)), cron)
	park(t, s12, store.Parked, grouped("k2-later", now.Add(time.Hour)))
	if _, err := s12.Reject(ctx, []store.Rejected{{Message: grouped("k2-dead", now), Reason: "rejected"}}); err != nil {
		t.Fatal(err)
	}

	index := groupIndex(t, s12)
	var inClear []string
	for _, m := range index {
		if strings.Contains(m, "GROUP-SECRET") {
			inClear = append(inClear, m)
		}
	}
	if len(index) != 6 || !slices.Equal(inClear, []string{group + "\x00clear-due"}) {
		t.Fatalf("index %q: want 6 entries, the group in clear only for the message parked before encryption", index)
	}
	all := []string{"clear-due", "k1-cron", "k1-due", "k1-later", "k2-dead", "k2-later"}
	if got := groupIDs(t, s12, group); !slices.Equal(got, all) {
		t.Fatalf("rotated store lists %v, want %v", got, all)
	}
	// A store that knows only k1 finds what k1 and the clear form index.
	if got := groupIDs(t, s1, group); !slices.Equal(got, []string{"clear-due", "k1-cron", "k1-due", "k1-later"}) {
		t.Fatalf("k1 store lists %v", got)
	}
	if got := groupIDs(t, s12, "GROUP-SECRET-order-43"); len(got) != 0 {
		t.Fatalf("another group lists %v", got)
	}
	// The same when a browse reads the messages' blobs instead of the index
	// (a group too large for it).
	restore := store.SetBrowseGroupIndexMax(0)
	if got := groupIDs(t, s12, group); !slices.Equal(got, all) {
		t.Fatalf("browsed without the index: %v, want %v", got, all)
	}
	restore()

	// Delivered by the rotated store: the ack names the group as k2 indexes
	// it, and the k1 and clear entries go all the same.
	for sh := 0; sh < s12.Shards(); sh++ {
		l, err := s12.Claim(ctx, sh, 100, time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		var done []store.Done
		for _, c := range l.Messages {
			if c.Err != nil || c.Message.Group != group {
				t.Fatalf("claimed %s: %v %+v", c.ID, c.Err, c.Message)
			}
			done = append(done, store.Done{ID: c.ID, Group: c.Message.Group})
		}
		if _, err := s12.Ack(ctx, l, done); err != nil {
			t.Fatal(err)
		}
	}
	if got := groupIDs(t, s12, group); !slices.Equal(got, []string{"k1-cron", "k1-later", "k2-dead", "k2-later"}) {
		t.Fatalf("after the acks %v", got)
	}
	if n := len(groupIndex(t, s12)); n != 4 {
		t.Fatalf("%d index entries after the acks, want 4 (none left behind)", n)
	}

	// Reencrypt moves every message to k2, and its index entry with it.
	if _, err := s12.Reencrypt(ctx, 10, nil); err != nil {
		t.Fatal(err)
	}
	s2 := sealedStore(rdb, keyringOf(t, "k2", "k2"))
	if got := groupIDs(t, s2, group); !slices.Equal(got, []string{"k1-cron", "k1-later", "k2-dead", "k2-later"}) {
		t.Fatalf("after reencrypt, the k2 store lists %v", got)
	}
	if n := len(groupIndex(t, s2)); n != 4 {
		t.Fatalf("%d index entries after reencrypt, want 4", n)
	}
	if info, err := s2.Inspect(ctx, "k1-cron"); err != nil || info.Message.Group != group ||
		info.Message.Recur == nil || info.Message.Recur.TimeZone != "America/New_York" {
		t.Fatalf("k1-cron after reencrypt: %+v %v", info, err)
	}
	// Cancelled by its name (DELETE /v1/groups/{key}, x-delay-cancel-group).
	if n, _, err := s2.CancelGroup(ctx, group); err != nil || n != 4 {
		t.Fatalf("CancelGroup = %d %v, want 4", n, err)
	}
	if index := groupIndex(t, s2); len(index) != 0 {
		t.Fatalf("index after the cancel: %q", index)
	}
}

// A dead reason or last error is sealed with the message (it may quote a
// header value): across a rotation it still reads, reencrypt seals it again
// with the active key (one stored in clear before encryption too), and a
// store with only the new key reads it then.
func TestSealedReasonsAcrossRotation(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	now := time.Now()
	clear := sealedStore(rdb, nil)
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	s12 := sealedStore(rdb, keyringOf(t, "k2", "k1", "k2"))
	reason := func(id string) string { return `x-delay "REASON-SECRET-` + id + `" is not a delay` }
	for id, s := range map[string]*store.Store{"r-clear": clear, "r-k1": s1, "r-k2": s12} {
		if _, err := s.Reject(ctx, []store.Rejected{{Message: secretMsg(id, now), Reason: reason(id)}}); err != nil {
			t.Fatal(err)
		}
	}
	reasons := func(s *store.Store) map[string]string {
		out := map[string]string{}
		for _, id := range []string{"r-clear", "r-k1", "r-k2"} {
			out[id] = inspect(t, s, id).Reason
		}
		return out
	}
	for id, got := range reasons(s12) {
		if got != reason(id) {
			t.Errorf("%s reads %q", id, got)
		}
	}
	st, err := s12.Reencrypt(ctx, 10, nil)
	if err != nil || st.Reasons != 2 || st.ReasonsFailed != 0 {
		t.Fatalf("reencrypt %+v %v: want the reasons of r-clear and r-k1 sealed again", st, err)
	}
	for id, got := range reasons(sealedStore(rdb, keyringOf(t, "k2", "k2"))) {
		if got != reason(id) {
			t.Errorf("after reencrypt, %s reads %q with k2 alone", id, got)
		}
	}
	for _, r := range readEverything(t, rdb) {
		if strings.Contains(r.text, "REASON-SECRET") {
			t.Errorf("%s %s holds a reason in clear: %q", r.key, r.what, r.text)
		}
	}
}

// A message sent without a confirmation stays so when a key rotation
// encrypts it anew (Reencrypt): it is the same message, which its broker
// may take yet.
func TestReencryptKeepsTheUnconfirmedMark(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	park(t, s1, store.Parked, secretMsg("sent", time.Now().Add(-time.Second)))
	var l *store.Lease
	for sh := 0; sh < s1.Shards() && (l == nil || len(l.Messages) == 0); sh++ {
		var err error
		if l, err = s1.Claim(ctx, sh, 10, time.Minute, nil); err != nil {
			t.Fatal(err)
		}
	}
	if len(l.Messages) != 1 {
		t.Fatalf("claimed %+v", l.Messages)
	}
	st := store.Settlement{Lease: l, Retry: []store.RetryAt{{ID: "sent", At: time.Now().Add(time.Hour), Reason: "timeout"}}, Unconfirmed: []string{"sent"}}
	if _, errs := s1.Settle(ctx, []store.Settlement{st}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	s12 := sealedStore(rdb, keyringOf(t, "k2", "k1", "k2"))
	if r, err := s12.Reencrypt(ctx, 10, nil); err != nil || r.Reencrypted != 1 {
		t.Fatalf("reencrypt: %+v %v", r, err)
	}
	if err := s12.Cancel(ctx, "sent"); !errors.Is(err, store.ErrInFlight) {
		t.Fatalf("cancel after the rotation: %v, want ErrInFlight", err)
	}
}
