package store

import (
	"context"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// replaceScript writes only where the stored blob is still the one read, and
// never brings back a message that is gone.
func TestReplaceScriptComparesAndSets(t *testing.T) {
	ctx := context.Background()
	s := New(testenv.Redis(t).Client(), Options{Prefix: "t", Shards: 1})
	pool := s.keys.Pool(0)
	if err := s.rdb.HSet(ctx, pool, "a", "old-a", "b", "newer-b").Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.run(ctx, "reencrypt", replaceScript, 0,
		"a", "old-a", "new-a", // unchanged since read: replaced
		"b", "old-b", "new-b", // changed since read: left alone
		"c", "old-c", "new-c", // gone since read: not brought back
	).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 3 || res[0] != 1 || res[1] != 0 || res[2] != 0 {
		t.Fatalf("results %v, want [1 0 0]", res)
	}
	got, err := s.rdb.HGetAll(ctx, pool).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a"] != "new-a" || got["b"] != "newer-b" {
		t.Fatalf("pool %v", got)
	}
}
