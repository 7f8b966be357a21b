package store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// Fixed test keys: key ID k1 is 32 bytes of 1, k2 of 2.
func testKey(id string) seal.Key {
	return seal.Key{ID: id, Secret: bytes.Repeat([]byte{id[len(id)-1] - '0'}, seal.KeySize)}
}

func keyringOf(t *testing.T, active string, ids ...string) *seal.Keyring {
	t.Helper()
	var keys []seal.Key
	for _, id := range ids {
		keys = append(keys, testKey(id))
	}
	k, err := seal.New(active, keys)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// sealedStore is a store on rdb sealing with sealer (nil: in clear).
func sealedStore(rdb redis.UniversalClient, sealer envelope.Sealer) *store.Store {
	return store.New(rdb, store.Options{Prefix: "t", Shards: 4, MaxDead: 1000, Sealer: sealer})
}

// secretMsg has a body, header value and Kafka key that must never be in
// Redis in clear.
func secretMsg(id string, due time.Time) *envelope.Message {
	return &envelope.Message{
		ID: id, DueAt: due.Truncate(time.Millisecond), Sink: "s", Destination: "d", Ingest: "in",
		Key:        []byte("KEY-" + id),
		Headers:    envelope.Headers{{Key: "authorization", Value: "HEADER-SECRET-" + id}},
		Body:       []byte("BODY-SECRET-" + id),
		IngestedAt: due.Truncate(time.Millisecond).Add(-time.Second),
	}
}

func checkSecret(t *testing.T, id string, m *envelope.Message, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	want := secretMsg(id, m.DueAt)
	if string(m.Body) != string(want.Body) || string(m.Key) != string(want.Key) || len(m.Headers) != 1 || m.Headers[0] != want.Headers[0] {
		t.Fatalf("%s: got body %q key %q headers %v", id, m.Body, m.Key, m.Headers)
	}
}

// rawBlob reads a message's stored form straight from Redis.
func rawBlob(t *testing.T, s *store.Store, id string) []byte {
	t.Helper()
	b, err := s.Client().HGet(context.Background(), s.Keys().Pool(s.ShardOf(id)), id).Bytes()
	if err != nil {
		t.Fatalf("HGET %s: %v", id, err)
	}
	return b
}

func keyIDOf(t *testing.T, s *store.Store, id string) string {
	t.Helper()
	k, sealed, err := envelope.SealedKeyID(rawBlob(t, s, id))
	if err != nil {
		t.Fatal(err)
	}
	if !sealed {
		return ""
	}
	return k
}

func TestSealedParkClaimInspect(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	now := time.Now()
	due, later := secretMsg("due", now.Add(-time.Second)), secretMsg("later", now.Add(time.Hour))
	if _, err := s.Park(ctx, []*envelope.Message{due, later}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reject(ctx, []store.Rejected{{Message: secretMsg("rejected", now), Reason: "x-delay is not a delay"}}); err != nil {
		t.Fatal(err)
	}
	// Nothing private is in Redis in clear: not in the pool, not anywhere.
	for _, id := range []string{"due", "later", "rejected"} {
		raw := rawBlob(t, s, id)
		for _, secret := range []string{"BODY-SECRET", "HEADER-SECRET", "authorization", "KEY-" + id} {
			if bytes.Contains(raw, []byte(secret)) {
				t.Fatalf("%s: %q in clear in Redis: %q", id, secret, raw)
			}
		}
		if k := keyIDOf(t, s, id); k != "k1" {
			t.Fatalf("%s sealed with %q", id, k)
		}
	}
	keys, err := rdb.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		dump, err := rdb.Dump(ctx, k).Bytes()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(dump, []byte("SECRET")) {
			t.Fatalf("key %s holds a secret in clear", k)
		}
	}

	for _, id := range []string{"due", "later", "rejected"} {
		info, err := s.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		checkSecret(t, id, info.Message, info.Err)
	}
	dead, err := s.ListDead(ctx, 10)
	if err != nil || len(dead) != 1 {
		t.Fatalf("ListDead = %v, %v", dead, err)
	}
	checkSecret(t, "rejected", dead[0].Message, dead[0].Err)
	got := claimAll(t, s, time.Minute)
	if len(got) != 1 {
		t.Fatalf("claimed %d, want due", len(got))
	}
	checkSecret(t, "due", got["due"].Message, got["due"].Err)
}

// Rotation: messages parked under k1 still read after k2 becomes active, new
// ones use k2, Reencrypt moves everything (messages in clear from before
// encryption too) to k2, and then a store with only k2 reads everything.
func TestSealedRotationAndReencrypt(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	now := time.Now()
	clear := sealedStore(rdb, nil)
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	s12 := sealedStore(rdb, keyringOf(t, "k2", "k1", "k2"))
	s2 := sealedStore(rdb, keyringOf(t, "k2", "k2"))

	var old, plain, newer []string
	for i := 0; i < 40; i++ {
		old = append(old, fmt.Sprintf("old-%d", i))
		if _, err := s1.Park(ctx, []*envelope.Message{secretMsg(old[i], now.Add(time.Duration(i%2)*time.Hour))}); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 5; i++ {
		plain = append(plain, fmt.Sprintf("plain-%d", i))
		if _, err := clear.Park(ctx, []*envelope.Message{secretMsg(plain[i], now.Add(time.Hour))}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s1.Reject(ctx, []store.Rejected{{Message: secretMsg("old-dead", now), Reason: "bad"}}); err != nil {
		t.Fatal(err)
	}
	old = append(old, "old-dead")
	for i := 0; i < 10; i++ {
		newer = append(newer, fmt.Sprintf("new-%d", i))
		if _, err := s12.Park(ctx, []*envelope.Message{secretMsg(newer[i], now.Add(time.Hour))}); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range old {
		if k := keyIDOf(t, s12, id); k != "k1" {
			t.Fatalf("%s sealed with %q, want k1", id, k)
		}
	}
	for _, id := range newer {
		if k := keyIDOf(t, s12, id); k != "k2" {
			t.Fatalf("%s sealed with %q, want k2", id, k)
		}
	}
	for _, id := range plain {
		if k := keyIDOf(t, s12, id); k != "" {
			t.Fatalf("%s sealed with %q, want in clear", id, k)
		}
	}
	// The rotated store reads all of them.
	all := append(append(append([]string(nil), old...), plain...), newer...)
	for _, id := range all {
		info, err := s12.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		checkSecret(t, id, info.Message, info.Err)
	}
	// ...and claims the due ones (k1) without error.
	claimed := claimAll(t, s12, time.Minute)
	if len(claimed) != 20 {
		t.Fatalf("claimed %d, want the 20 due", len(claimed))
	}
	for id, c := range claimed {
		checkSecret(t, id, c.Message, c.Err)
	}

	// Before reencrypt, a store with only k2 cannot read the k1 messages.
	if info, err := s2.Inspect(ctx, "old-1"); err != nil || !errors.Is(info.Err, envelope.ErrSealed) {
		t.Fatalf("k2-only store read a k1 message: %+v %v", info, err)
	}

	st, err := s12.Reencrypt(ctx, 7, func(id string, err error) { t.Errorf("failed %s: %v", id, err) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Reencrypted != len(old)+len(plain) || st.Plain != len(plain) || st.Current != len(newer) || st.Failed != 0 || st.Changed != 0 {
		t.Fatalf("reencrypt %+v; want %d re-encrypted (%d in clear), %d current", st, len(old)+len(plain), len(plain), len(newer))
	}
	for _, id := range all {
		if k := keyIDOf(t, s12, id); k != "k2" {
			t.Fatalf("%s sealed with %q after reencrypt", id, k)
		}
	}
	// Nothing else changed: states, scores and attempts are kept.
	for _, id := range all {
		info, err := s2.Inspect(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		checkSecret(t, id, info.Message, info.Err)
		_, wasClaimed := claimed[id]
		switch {
		case id == "old-dead" && info.State != store.StateDead:
			t.Fatalf("%s: state %s", id, info.State)
		case wasClaimed && (info.State != store.StateInflight || info.Attempts != 1):
			t.Fatalf("%s: state %s attempts %d", id, info.State, info.Attempts)
		}
	}
	dead, err := s2.ListDead(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].Err != nil || dead[0].Reason != "bad" {
		t.Fatalf("ListDead = %+v, %v", dead, err)
	}
	// A second run has nothing to do.
	st, err = s2.Reencrypt(ctx, 100, nil)
	if err != nil || st.Reencrypted != 0 || st.Current != len(all) {
		t.Fatalf("second reencrypt %+v, %v", st, err)
	}
	// The store with only k2 claims what comes due: the dead message, first
	// sealed with k1, retried.
	if err := s2.RetryDead(ctx, "old-dead"); err != nil {
		t.Fatal(err)
	}
	got := claimAll(t, s2, time.Minute)
	if len(got) != 1 {
		t.Fatalf("claimed %d, want old-dead", len(got))
	}
	checkSecret(t, "old-dead", got["old-dead"].Message, got["old-dead"].Err)
}

// A message sealed with a key that is not configured is still claimed (it is
// not dropped) with Err saying which key; the scheduler makes it dead with
// that reason. Reencrypt reports it and leaves it alone.
func TestSealedWithUnknownKey(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	s2 := sealedStore(rdb, keyringOf(t, "k2", "k2"))
	if _, err := s1.Park(ctx, []*envelope.Message{secretMsg("lost", time.Now())}); err != nil {
		t.Fatal(err)
	}
	before := rawBlob(t, s1, "lost")

	var failed []string
	st, err := s2.Reencrypt(ctx, 10, func(id string, err error) { failed = append(failed, id+": "+err.Error()) })
	if err != nil || st.Failed != 1 || st.Reencrypted != 0 || len(failed) != 1 {
		t.Fatalf("reencrypt %+v, %v, %q", st, err, failed)
	}
	if !strings.Contains(failed[0], `sealed with key "k1", which is not configured`) {
		t.Fatalf("failure %q", failed[0])
	}
	if !bytes.Equal(rawBlob(t, s1, "lost"), before) {
		t.Fatalf("reencrypt changed a message it could not read")
	}

	info, err := s2.Inspect(ctx, "lost")
	if err != nil || info.Message != nil || !errors.Is(info.Err, envelope.ErrSealed) {
		t.Fatalf("Inspect = %+v, %v", info, err)
	}
	// What is stored in clear is still shown: the due time and the route.
	if c := info.Clear; c == nil || c.Sink != "s" || c.Destination == "" || c.DueAt.IsZero() || len(c.Body) != 0 || c.Headers != nil {
		t.Fatalf("the part in clear of a message sealed with another key: %+v", c)
	}
	c, err := s2.Claim(ctx, s2.ShardOf("lost"), 10, time.Minute, nil)
	if err != nil || len(c.Messages) != 1 {
		t.Fatalf("Claim = %+v, %v", c, err)
	}
	m := c.Messages[0]
	if m.ID != "lost" || m.Message != nil || m.Err == nil {
		t.Fatalf("claimed %+v", m)
	}
	if !errors.Is(m.Err, envelope.ErrSealed) || !errors.Is(m.Err, envelope.ErrCorrupt) || !errors.Is(m.Err, seal.ErrUnknownKey) {
		t.Fatalf("Err %v is not ErrSealed/ErrCorrupt/ErrUnknownKey", m.Err)
	}
	want := `envelope: cannot open sealed message "lost": seal: unknown key: sealed with key "k1", which is not configured`
	if !strings.HasPrefix(m.Err.Error(), want) {
		t.Fatalf("reason %q, want it to start with %q", m.Err, want)
	}
	// What the scheduler does with it (pkg/scheduler: a decode error is
	// permanent): dead with the reason, kept, readable once k1 is back.
	reason := "cannot decode the stored message: " + m.Err.Error()
	if n, err := s2.MarkDead(ctx, c, []store.Failure{{ID: "lost", Reason: reason}}); err != nil || n != 1 {
		t.Fatalf("Dead = %d, %v", n, err)
	}
	dead, err := s2.ListDead(ctx, 10)
	if err != nil || len(dead) != 1 || dead[0].Reason != reason || !errors.Is(dead[0].Err, envelope.ErrSealed) {
		t.Fatalf("ListDead = %+v, %v", dead, err)
	}
	info, err = s1.Inspect(ctx, "lost")
	if err != nil || info.State != store.StateDead {
		t.Fatalf("with k1 back: %+v, %v", info, err)
	}
	checkSecret(t, "lost", info.Message, info.Err)
}

// Without encryption a sealed message is not read (ErrSealed), and
// Reencrypt refuses to run.
func TestSealedWithoutSealer(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	s1 := sealedStore(rdb, keyringOf(t, "k1", "k1"))
	clear := sealedStore(rdb, nil)
	if _, err := s1.Park(ctx, []*envelope.Message{secretMsg("m", time.Now())}); err != nil {
		t.Fatal(err)
	}
	info, err := clear.Inspect(ctx, "m")
	if err != nil || !errors.Is(info.Err, envelope.ErrSealed) || !strings.Contains(info.Err.Error(), "encryption is not configured") {
		t.Fatalf("Inspect without a sealer = %+v, %v", info, err)
	}
	if _, err := clear.Reencrypt(ctx, 10, nil); !errors.Is(err, store.ErrNoSealer) {
		t.Fatalf("Reencrypt without a sealer: %v", err)
	}
}

// TestRequireSealed: with encryption.require_sealed, a message put in Redis
// in clear (by an old daemon, or by someone with write access) is reported
// as unreadable instead of being published, and reencrypt still seals it.
func TestRequireSealed(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Redis(t).Client()
	now := time.Now()
	if _, err := sealedStore(rdb, nil).Park(ctx, []*envelope.Message{secretMsg("injected", now.Add(-time.Second))}); err != nil {
		t.Fatal(err)
	}
	kr := keyringOf(t, "k1", "k1")
	strict := store.New(rdb, store.Options{Prefix: "t", Shards: 4, MaxDead: 1000, Sealer: kr, RequireSealed: true})

	claimed := claimAll(t, strict, time.Minute)
	c, ok := claimed["injected"]
	if !ok || !errors.Is(c.Err, envelope.ErrSealed) || c.Message != nil {
		t.Fatalf("claim under require_sealed: %+v (found %v), want ErrSealed and no message", c, ok)
	}

	st, err := strict.Reencrypt(ctx, 10, func(id string, err error) { t.Errorf("failed %s: %v", id, err) })
	if err != nil {
		t.Fatal(err)
	}
	if st.Reencrypted != 1 || st.Plain != 1 {
		t.Fatalf("reencrypt %+v, want the clear message sealed", st)
	}
	info, err := strict.Inspect(ctx, "injected")
	if err != nil {
		t.Fatal(err)
	}
	checkSecret(t, "injected", info.Message, info.Err)
}
