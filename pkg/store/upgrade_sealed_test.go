package store_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/seal"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestFiresSealedBlobsOfTheVersionBefore: messages sealed without flag bit
// 6, their group and schedule in clear and their group indexed by its name
// (pkg/envelope/testdata/sealed-v3.txt, written by that version), are
// found by their group, claimed, opened and acked after an upgrade, and
// leave nothing in the group's index: the ack names the group as the new
// version indexes it, and the index entry of the old form goes too.
func TestFiresSealedBlobsOfTheVersionBefore(t *testing.T) {
	ctx := context.Background()
	// The test key of pkg/envelope/sealed_test.go: "k1" and zeros.
	kr, err := seal.New("k1", []seal.Key{{ID: "k1", Secret: append([]byte("k1"), make([]byte, seal.KeySize-2)...)}})
	if err != nil {
		t.Fatal(err)
	}
	s := store.New(testenv.Redis(t).Client(), store.Options{Prefix: "up", Shards: 1, Sealer: kr})
	rdb, keys := s.Client(), s.Keys()
	f, err := os.Open("../envelope/testdata/sealed-v3.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]*envelope.Message{}
	groups := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		id, h, _ := strings.Cut(line, " ")
		blob, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(err)
		}
		m, err := envelope.Codec{Sealer: kr}.Decode(id, blob)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		want[id] = m
		if err := rdb.HSet(ctx, keys.Pool(0), id, blob).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, keys.DueAt(0, int(m.Priority)), redisZ(time.Now().Add(-time.Second), id)).Err(); err != nil {
			t.Fatal(err)
		}
		if m.Group != "" {
			groups[m.Group] = true
			if err := rdb.ZAdd(ctx, keys.Groups(0), redisZ(time.Time{}, m.Group+"\x00"+id)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(want) < 3 || len(groups) == 0 {
		t.Fatalf("%d blobs read, groups %v", len(want), groups)
	}
	for g := range groups {
		if ids, err := s.GroupMembers(ctx, g, 0); err != nil || len(ids) == 0 {
			t.Fatalf("group %s of the version before: %v %v", g, ids, err)
		}
	}
	c, err := s.Claim(ctx, 0, 10, time.Minute, nil)
	if err != nil || len(c.Messages) != len(want) {
		t.Fatalf("claim: %+v %v", c, err)
	}
	var ds []store.Done
	for _, m := range c.Messages {
		if m.Err != nil {
			t.Fatalf("%s: %v", m.ID, m.Err)
		}
		if !reflect.DeepEqual(m.Message, want[m.ID]) {
			t.Errorf("%s claimed as %+v, want %+v", m.ID, m.Message, want[m.ID])
		}
		ds = append(ds, store.Done{ID: m.ID, Group: m.Message.Group})
	}
	if n, err := s.Ack(ctx, c, ds); err != nil || n != len(want) {
		t.Fatalf("ack: %d %v", n, err)
	}
	if n, _ := rdb.ZCard(ctx, keys.Groups(0)).Result(); n != 0 {
		t.Errorf("%d group index entries left after the acks", n)
	}
	if n, _ := rdb.HLen(ctx, keys.Pool(0)).Result(); n != 0 {
		t.Fatalf("%d messages left in the pool", n)
	}
}
