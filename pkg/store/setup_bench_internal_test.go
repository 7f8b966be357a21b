package store

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkScriptSetup is what Redis spends on a script call apart from
// its work, per layout: "setup" includes the state library and returns at
// once (the constants, the table K of its keys and the library's functions
// made), "maxprio" adds the look at the priorities in use that most scripts
// begin with. At a moderate rate each park, claim and settle carries about
// one message, and this fixed part is much of a message's Redis time
// (docs/performance.md, Finding 8). It reports Redis's own time per call
// (INFO commandstats), not the round trip.
func BenchmarkScriptSetup(b *testing.B) {
	for _, l := range []int{Layout1, Layout2} {
		for _, c := range []struct{ name, body string }{{"setup", "return 1"}, {"maxprio", "return maxprio()"}} {
			b.Run(fmt.Sprintf("layout%d/%s", l, c.name), func(b *testing.B) {
				rdb := testenv.Redis(b).Client()
				ctx := context.Background()
				s := New(rdb, Options{Prefix: "b", Shards: 1})
				if err := rdb.Set(ctx, s.keys.LayoutMark(0), strconv.Itoa(l), 0).Err(); err != nil {
					b.Fatal(err)
				}
				sc := assemble(luaFile{name: "bench.lua", body: c.body, includes: []string{"due"}}, l)
				keys := s.keys.scriptKeys(sc, 0)
				if err := sc.plain.Run(ctx, rdb, keys).Err(); err != nil { // loads it
					b.Fatal(err)
				}
				if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				b.ResetTimer()
				for range b.N {
					if err := sc.plain.Run(ctx, rdb, keys).Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				stats, err := testenv.CommandStats(rdb)
				if err != nil {
					b.Fatal(err)
				}
				ev := stats["evalsha"]
				if ev.Calls < float64(b.N) {
					b.Fatalf("Redis counted %v EVALSHA calls of %d", ev.Calls, b.N)
				}
				b.ReportMetric(ev.Usec/ev.Calls, "redis-µs/call")
			})
		}
	}
}
