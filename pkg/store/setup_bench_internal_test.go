package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

// BenchmarkScriptSetup is what Redis spends on a script call apart from
// its work, per layout: "setup" includes the state library and returns at
// once (the constants, the table K of its keys and the library's code that
// always runs: the layout's check), "maxprio" adds the look at the priorities in use that most scripts
// begin with. At a moderate rate each park, claim and settle carries about
// one message, and this fixed part is much of a message's Redis time
// (docs/performance.md, Finding 8). It reports Redis's own time per call
// (INFO commandstats), not the round trip.
func BenchmarkScriptSetup(b *testing.B) {
	for _, l := range []int{Layout1, Layout2} {
		for _, c := range []struct{ name, body string }{{"setup", "return 1"}, {"maxprio", "return maxprio()"}} {
			b.Run(fmt.Sprintf("layout%d/%s", l, c.name), func(b *testing.B) {
				benchCalls(b, l, assemble(luaFile{name: "bench.lua", body: c.body, includes: []string{"due"}}, l), false)
			})
		}
	}
}

// BenchmarkScriptPrelude is what Redis spends on a call of the scripts of
// the hot path before their first line, in layout 2: the constants, K and
// the includes, "all" of them as written, "needed" what needed keeps (the
// form they run in). "paced" waits a millisecond between calls, as at
// 1k msg/s, where Redis wakes for each call with its caches cold; run it
// with -benchtime=500x. It reports Redis's own time per call.
func BenchmarkScriptPrelude(b *testing.B) {
	for _, sc := range []*script{parkScript, claimScript, commitScript, commitAckScript, settleScript, releaseScript} {
		f := sc.forms[Layout2-1]
		main := readLua("lua/" + sc.name + ".lua")
		var all strings.Builder
		for _, lib := range includes(main, Layout2) {
			all.WriteString(lib.body + "\n")
		}
		libs, _ := strings.CutSuffix(f.src, main.body)
		head := libs[:strings.Index(libs, "local PRIOFROM")]
		head = libs[:len(head)+strings.IndexByte(libs[len(head):], '\n')+1]
		for _, v := range []struct{ name, src string }{{"all", luaConstants + head + all.String()}, {"needed", libs}} {
			for _, paced := range []bool{false, true} {
				name := fmt.Sprintf("%s/%s/hot", sc.name, v.name)
				if paced {
					name = fmt.Sprintf("%s/%s/paced", sc.name, v.name)
				}
				b.Run(name, func(b *testing.B) {
					pre := assemble(luaFile{name: "prelude.lua"}, Layout2)
					pre.plain = redis.NewScript(v.src + "\nreturn 0\n")
					pre.keys = f.keys
					benchCalls(b, Layout2, pre, paced)
				})
			}
		}
	}
}

// benchCalls runs sc b.N times on a shard of layout l, a millisecond apart
// when paced, and reports Redis's own time per call.
func benchCalls(b *testing.B, l int, sc *scriptForm, paced bool) {
	rdb := testenv.Redis(b).Client()
	ctx := context.Background()
	s := New(rdb, Options{Prefix: "b", Shards: 1})
	if err := rdb.Set(ctx, s.keys.LayoutMark(0), strconv.Itoa(l), 0).Err(); err != nil {
		b.Fatal(err)
	}
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
		if paced {
			time.Sleep(time.Millisecond)
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
}
