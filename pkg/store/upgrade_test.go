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

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// TestFiresBlobsOfTheVersionBefore: messages parked by the version before
// encoding version 3 (pkg/envelope/testdata/blobs-v2.txt, written by it)
// are claimed, fired and acked unchanged after an upgrade: the scripts read
// their routing (sink, group, priority) as before.
func TestFiresBlobsOfTheVersionBefore(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	rdb, keys := s.Client(), s.Keys()
	f, err := os.Open("../envelope/testdata/blobs-v2.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want := map[string]*envelope.Message{}
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
		m, err := envelope.Decode(id, blob)
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
		want[id] = m
		// Parked as that version's park script left it: in the pool, in
		// the due set of its priority (now: due), in its group's index.
		if err := rdb.HSet(ctx, keys.Pool(0), id, blob).Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.ZAdd(ctx, keys.DueAt(0, int(m.Priority)), redisZ(time.Now().Add(-time.Second), id)).Err(); err != nil {
			t.Fatal(err)
		}
		if m.Group != "" {
			if err := rdb.ZAdd(ctx, keys.Groups(0), redisZ(time.Time{}, m.Group+"\x00"+id)).Err(); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(want) < 3 {
		t.Fatalf("%d blobs read", len(want))
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
	for id, m := range want {
		if m.Group != "" {
			if ids, _ := s.GroupMembers(ctx, m.Group, 0); len(ids) != 0 {
				t.Errorf("%s is still in group %s after its ack", id, m.Group)
			}
		}
	}
	if n, _ := rdb.HLen(ctx, keys.Pool(0)).Result(); n != 0 {
		t.Fatalf("%d messages left in the pool", n)
	}
}

func redisZ(score time.Time, member string) redis.Z {
	var s float64
	if !score.IsZero() {
		s = float64(score.UnixMilli())
	}
	return redis.Z{Score: s, Member: member}
}

// TestScriptsReadVersion3: the scripts read the routing of a version 3
// blob (source, origin and print before the group): a rejected message
// with a source is in its group's index, and a follower is told from a
// re-read by the print.
func TestScriptsReadVersion3(t *testing.T) {
	ctx := context.Background()
	s := newStore(t, 1)
	m := msg("dead-1", time.Now())
	m.Source, m.Group = "delayed.orders.eu", "order-9"
	m.Origin = envelope.Origin{Print: 0xfeed}
	m.PublishedAt = time.Now().Add(-time.Second + 7)
	if _, err := s.Reject(ctx, []store.Rejected{{Message: m, Reason: "test"}}); err != nil {
		t.Fatal(err)
	}
	if ids, err := s.GroupMembers(ctx, "order-9", 0); err != nil || len(ids) != 1 || ids[0] != "dead-1" {
		t.Fatalf("group of a rejected version 3 message: %v %v", ids, err)
	}
	if got := inspect(t, s, "dead-1").Message; got.Source != m.Source || got.Origin != m.Origin {
		t.Fatalf("inspected %+v", got)
	}
}
