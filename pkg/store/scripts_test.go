package store

import (
	"context"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// TestLuaSaysNothingTwice: what the Go side states (the hold band, the
// lease, slot and ahead marks, the follower mark, the stored layout) is generated
// into the scripts, never written in a Lua file again; blobs are read by
// lua/lib/blob.lua alone; keys are named, never indexed by number.
func TestLuaSaysNothingTwice(t *testing.T) {
	forbidden := map[string]*regexp.Regexp{
		"the hold band (HOLDBAND)":         regexp.MustCompile(strconv.FormatInt(HoldBand, 10)),
		"the lease mark (LEASE_MARK)":      regexp.MustCompile(`[^0-9.]` + regexp.QuoteMeta(leaseMark) + `[^0-9]`),
		"the slot mark (SLOT_MARK)":        regexp.MustCompile(`[^0-9.]` + regexp.QuoteMeta(slotMark) + `[^0-9]`),
		"the ahead mark (AHEAD_MARK)":      regexp.MustCompile(`[^0-9.]` + regexp.QuoteMeta(aheadMark) + `[^0-9]`),
		"the follower mark (FOLLOWS)":      regexp.MustCompile(`'` + followsMark + `'`),
		"a KEYS index (name the key in K)": regexp.MustCompile(`KEYS\[[0-9]`),
	}
	blobReaders := regexp.MustCompile(`\b(uvar|svar|bstr)\(`)
	blockComment := regexp.MustCompile(`(?s)--\[\[.*?\]\]`)
	err := fs.WalkDir(luaFiles, "lua", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := luaFiles.ReadFile(name)
		if err != nil {
			return err
		}
		// Comments may say anything: the header block and -- comments.
		src := blockComment.ReplaceAllStringFunc(string(b), func(c string) string { return strings.Repeat("\n", strings.Count(c, "\n")) })
		for i, line := range strings.Split(src, "\n") {
			code, _, _ := strings.Cut(line, "--")
			for what, re := range forbidden {
				if re.MatchString(" " + code + " ") {
					t.Errorf("%s:%d states %s again: %s", name, i+1, what, strings.TrimSpace(line))
				}
			}
			if name != "lua/lib/blob.lua" && blobReaders.MatchString(code) {
				t.Errorf("%s:%d reads a blob's bytes: use parseblob (lib/blob.lua): %s", name, i+1, strings.TrimSpace(line))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLuaReadsTheLayoutGoWrites: lua/lib/blob.lua's parseblob reads of a stored
// message exactly what envelope.Decode reads, for every version and field
// the scripts use; the generated constants reach Lua as Go has them. A
// change of the encoding in Go that the Lua does not follow fails here.
func TestLuaReadsTheLayoutGoWrites(t *testing.T) {
	rdb := testenv.Redis(t).Client()
	ctx := context.Background()
	lib, err := luaFiles.ReadFile("lua/lib/blob.lua")
	if err != nil {
		t.Fatal(err)
	}
	probe := redis.NewScript(luaConstants + "local K = {}\nlocal NKEYS = 0\n" + string(lib) + `
if ARGV[1] == 'constants' then
  return {tostring(HOLDBAND), MAXPRIO, tostring(LEASE_MARK), tostring(SLOT_MARK), tostring(AHEAD_MARK), FOLLOWS}
end
local r = parseblob(ARGV[1])
return {r.due, r.pub, r.pubns, r.prio, r.sink, r.dest, r.ingest, r.log, r.pos, r.print, r.group, tostring(r.recur)}
`)
	got, err := probe.Run(ctx, rdb, nil, "constants").Slice()
	if err != nil {
		t.Fatal(err)
	}
	lm, _ := strconv.ParseFloat(leaseMark, 64)
	sm, _ := strconv.ParseFloat(slotMark, 64)
	am, _ := strconv.ParseFloat(aheadMark, 64)
	want := []any{fmt.Sprintf("%.14g", float64(HoldBand)), int64(MaxPriority), fmt.Sprint(lm), fmt.Sprint(sm), fmt.Sprint(am), followsMark}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("constants in Lua %q, want %q", got, want)
	}

	due := time.Date(2026, 12, 1, 10, 0, 0, 123e6, time.UTC)
	base := func() *envelope.Message {
		return &envelope.Message{ID: "m", DueAt: due, Sink: "s1", Destination: "orders.late", Ingest: "in", Priority: 3,
			IngestedAt: due.Add(-time.Minute), Body: []byte("b")}
	}
	cases := map[string]func(*envelope.Message){
		"version 1":      func(*envelope.Message) {},
		"published (v2)": func(m *envelope.Message) { m.PublishedAt = due.Add(-61 * time.Second) },
		"group (v2)":     func(m *envelope.Message) { m.Group = "order-42" },
		"recurring (v2)": func(m *envelope.Message) { m.Recur = &envelope.Recurrence{Every: time.Minute, Anchor: due, N: 2} },
		"native, properties": func(m *envelope.Message) {
			m.Headers = envelope.Headers{{Key: "n", Value: "1", Native: "x"}}
			m.Properties = m.Headers
		},
		"origin (v3)":      func(m *envelope.Message) { m.Origin = envelope.Origin{Log: "orders/3", Pos: 1<<40 + 7} },
		"print (v3)":       func(m *envelope.Message) { m.Origin = envelope.Origin{Print: 0x00fe00cafe00beef} },
		"source (v3)":      func(m *envelope.Message) { m.Source = "delayed.orders.eu"; m.Group = "g" },
		"nanoseconds (v3)": func(m *envelope.Message) { m.PublishedAt = due.Add(-time.Second + 123456) },
		"everything (v3)": func(m *envelope.Message) {
			m.PublishedAt, m.Group, m.Source = due.Add(-time.Second+999999), "g-1", "src"
			m.Origin = envelope.Origin{Log: "S", Pos: 9}
			m.Recur = &envelope.Recurrence{Cron: "* * * * *", TimeZone: "Europe/Berlin", Anchor: due, N: 1}
			m.NullBody, m.Headers = true, envelope.Headers{{Key: "h", Null: true}}
		},
	}
	for name, mod := range cases {
		m := base()
		mod(m)
		blob := envelope.Encode(nil, m)
		d, err := envelope.Decode(m.ID, blob)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		res, err := probe.Run(ctx, rdb, nil, string(blob)).Slice()
		if err != nil {
			t.Fatalf("%s: parseblob: %v", name, err)
		}
		var pub, pubns int64
		if !d.PublishedAt.IsZero() {
			pub, pubns = d.PublishedAt.UnixMilli(), d.PublishedAt.UnixNano()%1e6
		}
		print := ""
		if d.Origin.Print != 0 {
			print = fmt.Sprintf("%016x", d.Origin.Print)
		}
		want := []any{d.DueAt.UnixMilli(), pub, pubns, int64(d.Priority), d.Sink, d.Destination, d.Ingest,
			d.Origin.Log, int64(d.Origin.Pos), print, d.Group, strconv.FormatBool(d.Recur != nil)}
		if fmt.Sprint(res) != fmt.Sprint(want) {
			t.Errorf("%s (version %d): Lua read %v, Go %v", name, blob[0], res, want)
		}
	}
}
