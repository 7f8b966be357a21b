package store_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// parkVaried parks one message of every kind the export must carry and
// brings some into every state: in flight, held, retried, dead, and in
// flight with a replacement waiting. It returns their IDs by kind.
func parkVaried(t *testing.T, s *store.Store) map[string]string {
	t.Helper()
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	far := now.Add(24 * time.Hour)
	past := now.Add(-time.Minute)
	big := bytes.Repeat([]byte{0, 1, 2, 0xff, 'x'}, 220_000) // ~1 MiB, base64 ~1.4 MiB on one line
	msgs := []*envelope.Message{
		{ID: "plain", DueAt: far, Sink: "s", Destination: "d", Body: []byte("hello")},
		{ID: "empty-key", DueAt: far, Sink: "s", Destination: "d", Key: []byte{}, Body: nil},
		{ID: "binary", DueAt: far.Add(time.Second), Sink: "s", Destination: "topic.x", Ingest: "in",
			IngestedAt: now, PublishedAt: now.Add(-time.Second), Key: []byte{0, 0xff, 0xfe},
			Headers: envelope.Headers{
				{Key: "dup", Value: "one"}, {Key: "dup", Value: "two"}, {Key: "Dup", Value: ""},
				{Key: "bin", Value: "\x00\xff\xfe bytes"}, {Key: "\xc3\x28", Value: "key not UTF-8"},
				{Key: "ctl", Value: "tab\tnl\n\"quote\" \\ <html>&"},
				{Key: "amqp-int", Value: "42", Native: "I\x00\x00\x00\x2a"},
				{Key: "amqp-table", Value: "{a:1}", Native: "F\x00\x00\x00\x07\x01ab\x00\xff"},
			},
			Properties: envelope.Headers{{Key: "content_type", Value: "application/json"},
				{Key: "priority", Value: "5", Native: "\x05"}, {Key: "correlation_id", Value: "\xff\xfe"}},
			Body: []byte{0, 1, 2, 3, 0xff}},
		{ID: "prio5", DueAt: far, Sink: "s", Destination: "d", Priority: 5, Body: []byte("p5")},
		{ID: "prio9", DueAt: far, Sink: "s", Destination: "d", Priority: 9, Body: []byte("p9")},
		{ID: "grouped-1", DueAt: far, Sink: "s", Destination: "d", Group: "cart-7", Body: []byte("g1")},
		{ID: "grouped-2", DueAt: far.Add(time.Hour), Sink: "s", Destination: "d", Group: "cart-7", Priority: 2, Body: []byte("g2")},
		{ID: "every", DueAt: far, Sink: "s", Destination: "d", Body: []byte("r1"), Recur: &envelope.Recurrence{
			Every: 90 * time.Second, Anchor: far.Add(-time.Hour), Until: far.Add(48 * time.Hour), Count: 10, N: 3, Missed: envelope.MissedAll}},
		{ID: "cron", DueAt: far, Sink: "s", Destination: "d", Body: []byte("r2"), Group: "crons", Recur: &envelope.Recurrence{
			Cron: "0 9 * * 1-5", TimeZone: "Europe/Paris", Anchor: far, N: 1, Missed: envelope.MissedSkip}},
		{ID: "big", DueAt: far, Sink: "s", Destination: "d", Body: big},
		{ID: "ünïcode-id", DueAt: far, Sink: "s", Destination: "d", Body: []byte("u")},
		// Due now, to be claimed below.
		{ID: "inflight", DueAt: past, Sink: "s", Destination: "d", Priority: 4, Body: []byte("f")},
		{ID: "held", DueAt: past.Add(time.Second), Sink: "blocked", Destination: "d", Priority: 1, Group: "cart-7", Body: []byte("h")},
		{ID: "retried", DueAt: past, Sink: "s", Destination: "d", Body: []byte("r")},
		{ID: "dead", DueAt: past, Sink: "s", Destination: "d", Priority: 3, Group: "cart-7", Body: []byte("dead")},
		{ID: "replaced", DueAt: past, Sink: "s", Destination: "d", PublishedAt: past, Body: []byte("v1")},
	}
	res, err := s.Park(ctx, msgs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r != store.Parked {
			t.Fatalf("park %s: %v", msgs[i].ID, r)
		}
	}
	// Claim what is due, holding the messages of the sink "blocked".
	leases := map[string]*store.Lease{}
	for sh := 0; sh < s.Shards(); sh++ {
		l, err := s.Claim(ctx, sh, 100, time.Hour, map[string]int{"blocked": 0})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range l.Messages {
			leases[c.ID] = l
		}
	}
	for _, id := range []string{"inflight", "retried", "dead", "replaced"} {
		if leases[id] == nil {
			t.Fatalf("%s was not claimed (claimed: %v)", id, leases)
		}
	}
	if n, err := s.Retry(ctx, leases["retried"], []store.RetryAt{{ID: "retried", At: far.Add(time.Minute), Reason: "broker said no | twice"}}); err != nil || n != 1 {
		t.Fatalf("retry: %d %v", n, err)
	}
	if n, err := s.MarkDead(ctx, leases["dead"], []store.Failure{{ID: "dead", Reason: "unroutable"}}); err != nil || n != 1 {
		t.Fatalf("dead: %d %v", n, err)
	}
	v2 := &envelope.Message{ID: "replaced", DueAt: far, Sink: "s", Destination: "d2", PublishedAt: now, Replace: true,
		Group: "cart-7", Headers: envelope.Headers{{Key: "v", Value: "2"}}, Body: []byte("v2")}
	if r, err := s.Park(ctx, []*envelope.Message{v2}); err != nil || r[0] != store.Queued {
		t.Fatalf("replacement: %v %v", r, err)
	}
	if info, err := s.Inspect(ctx, "held"); err != nil || !info.Held {
		t.Fatalf("held: %+v %v", info, err)
	}
	ids := map[string]string{}
	for _, m := range msgs {
		ids[m.ID] = m.ID
	}
	return ids
}

// exportAll exports s, failing the test on an error or an unreadable
// message.
func exportAll(t *testing.T, s *store.Store, dead bool) ([]byte, store.ExportStats) {
	t.Helper()
	var buf bytes.Buffer
	st, err := s.Export(context.Background(), &buf, store.ExportOptions{Dead: dead, Batch: 3,
		Failed: func(id string, err error) { t.Errorf("cannot read %s: %v", id, err) }})
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), st
}

// importAll imports data into s under the rules of ingest (ops.Service,
// with limits and sinks of any name), failing the test on a bad line.
func importAll(t *testing.T, s *store.Store, data []byte, o store.ImportOptions) store.ImportStats {
	t.Helper()
	o.Bad = func(le *store.LineError) { t.Errorf("bad line: %v", le) }
	st, err := ops.New(ops.Params{Store: s}).Import(context.Background(), bytes.NewReader(data), o)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// compareStores checks that every message of src is in dst with every field
// equal: the message itself, attempts, last error or dead reason and time,
// due time (an in-flight one at its due time, a held one not held), the
// priority's due set, the group index and the replacement waiting.
func compareStores(t *testing.T, src, dst *store.Store, ids map[string]string) {
	t.Helper()
	ctx := context.Background()
	for id := range ids {
		a, err := src.Inspect(ctx, id)
		if err != nil {
			t.Fatalf("source %s: %v", id, err)
		}
		b, err := dst.Inspect(ctx, id)
		if err != nil {
			t.Errorf("target %s: %v", id, err)
			continue
		}
		if a.Err != nil || b.Err != nil {
			t.Errorf("%s: decode errors %v / %v", id, a.Err, b.Err)
			continue
		}
		if !reflect.DeepEqual(a.Message, b.Message) {
			t.Errorf("%s: message differs:\n source %+v\n target %+v", id, a.Message, b.Message)
		}
		wantState, wantNext := a.State, a.NextAt
		switch {
		case a.State == store.StateInflight:
			wantState, wantNext = store.StateScheduled, a.Message.DueAt
		case a.Held:
			// imported scheduled: the target holds it when its sink is blocked there
			wantState, wantNext = store.StateScheduled, a.NextAt
		}
		if b.State != wantState || b.Held || b.Attempts != a.Attempts || b.Reason != a.Reason ||
			!b.NextAt.Equal(wantNext) || !b.DeadAt.Equal(a.DeadAt) {
			t.Errorf("%s: state differs:\n source %s held=%v attempts=%d reason=%q next=%v dead=%v\n target %s held=%v attempts=%d reason=%q next=%v dead=%v",
				id, a.State, a.Held, a.Attempts, a.Reason, a.NextAt, a.DeadAt, b.State, b.Held, b.Attempts, b.Reason, b.NextAt, b.DeadAt)
		}
		if b.State == store.StateScheduled {
			k := dst.Keys().DueAt(dst.ShardOf(id), int(min(b.Message.Priority, 9)))
			if err := dst.Client().ZScore(ctx, k, id).Err(); err != nil {
				t.Errorf("%s: not in its priority's due set %s: %v", id, k, err)
			}
		}
		na, nb := waiting(t, src, id), waiting(t, dst, id)
		if !reflect.DeepEqual(na, nb) {
			t.Errorf("%s: replacement differs:\n source %+v\n target %+v", id, na, nb)
		}
	}
	for _, g := range []string{"cart-7", "crons"} {
		ma, err := src.GroupMembers(ctx, g, 100)
		if err != nil {
			t.Fatal(err)
		}
		mb, err := dst.GroupMembers(ctx, g, 100)
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(ma)
		sort.Strings(mb)
		if !reflect.DeepEqual(ma, mb) || len(ma) == 0 {
			t.Errorf("group %s: source %v, target %v", g, ma, mb)
		}
	}
}

// waiting returns the replacement waiting for the version in flight of id.
func waiting(t *testing.T, s *store.Store, id string) *envelope.Message {
	t.Helper()
	blob, err := s.Client().HGet(context.Background(), s.Keys().Next(s.ShardOf(id)), id).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	m, err := envelope.Decode(id, []byte(blob))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// A varied set exported from 16 shards and imported into 5 shards, another
// prefix and a 3-node Redis Cluster comes out the same, field by field;
// importing again imports nothing; --replace overwrites.
func TestExportImportRoundTrip(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	src := store.New(r.Client(), store.Options{Prefix: "src", Shards: 16})
	ids := parkVaried(t, src)

	data, st := exportAll(t, src, true)
	if st.Exported != len(ids) || st.Dead != 1 || st.Failed != 0 || st.Vanished != 0 {
		t.Fatalf("export: %+v, want %d messages, 1 dead", st, len(ids))
	}
	if n := bytes.Count(data, []byte("\n")); n != len(ids) {
		t.Fatalf("%d lines, want %d", n, len(ids))
	}
	// Without --dead the dead one is left out.
	if _, st := exportAll(t, src, false); st.Exported != len(ids)-1 || st.LeftOut != 1 {
		t.Fatalf("export without dead: %+v", st)
	}

	cluster := testenv.RedisCluster(t, 3)
	targets := map[string]*store.Store{
		"5 shards":      store.New(r.Client(), store.Options{Prefix: "five", Shards: 5}),
		"other prefix":  store.New(r.Client(), store.Options{Prefix: "other", Shards: 16}),
		"redis cluster": store.New(cluster.Client(), store.Options{Prefix: "cl", Shards: 7}),
	}
	for name, dst := range targets {
		t.Run(name, func(t *testing.T) {
			got := importAll(t, dst, data, store.ImportOptions{MaxIDBytes: 256})
			if got.Imported != len(ids) || got.Dead != 1 || got.Known != 0 || got.Bad != 0 || got.Lines != len(ids) {
				t.Fatalf("import: %+v", got)
			}
			compareStores(t, src, dst, ids)
			// Idempotent: a second import imports nothing.
			again := importAll(t, dst, data, store.ImportOptions{})
			if again.Imported != 0 || again.Known != len(ids) {
				t.Fatalf("second import: %+v", again)
			}
			compareStores(t, src, dst, ids)
			// An export of the target is the export of the source, line for line.
			back, _ := exportAll(t, dst, true)
			for _, d := range lineDiff(sortedLines(data), sortedLines(back)) {
				t.Errorf("re-export differs: %s", d)
			}
		})
	}

	// --replace overwrites whatever is there: a changed body, a message
	// made dead scheduled again, and an in-flight one.
	dst := targets["5 shards"]
	for sh := 0; sh < dst.Shards(); sh++ { // puts "inflight", "replaced" ... in flight in the target
		if _, err := dst.Claim(ctx, sh, 100, time.Hour, nil); err != nil {
			t.Fatal(err)
		}
	}
	changed := rewrite(t, data, func(rec *store.Record) {
		rec.BodyBase64 = "Y2hhbmdlZA==" // "changed"
		if rec.State == store.StateDead {
			rec.State, rec.DeadAt, rec.Reason, rec.Attempts = store.StateScheduled, "", "", 0
		}
	})
	got := importAll(t, dst, changed, store.ImportOptions{Replace: true})
	if got.Replaced != len(ids) || got.Imported != 0 {
		t.Fatalf("replace: %+v", got)
	}
	for id := range ids {
		info, err := dst.Inspect(ctx, id)
		if err != nil || string(info.Message.Body) != "changed" || info.State != store.StateScheduled {
			t.Fatalf("%s after replace: %+v %v", id, info, err)
		}
	}
	if info, _ := dst.Inspect(ctx, "dead"); info.Attempts != 0 || info.Reason != "" {
		t.Errorf("dead imported scheduled with --replace: %+v", info)
	}
	if members, _ := dst.GroupMembers(ctx, "cart-7", 100); len(members) != 4 {
		t.Errorf("cart-7 after replace: %v", members)
	}
}

func sortedLines(b []byte) []string {
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	sort.Strings(lines)
	return lines
}

// lineDiff returns the lines of a missing from b and of b missing from a,
// each cut to 300 bytes.
func lineDiff(a, b []string) []string {
	count := map[string]int{}
	for _, l := range a {
		count[l]++
	}
	for _, l := range b {
		count[l]--
	}
	var out []string
	for l, n := range count {
		if len(l) > 300 {
			l = l[:300] + "..."
		}
		switch {
		case n > 0:
			out = append(out, "only in the first: "+l)
		case n < 0:
			out = append(out, "only in the second: "+l)
		}
	}
	return out
}

// rewrite applies f to every record of an export.
func rewrite(t *testing.T, data []byte, f func(*store.Record)) []byte {
	t.Helper()
	var out bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 16<<20)
	for sc.Scan() {
		var rec store.Record
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		f(&rec)
		b, err := json.Marshal(&rec)
		if err != nil {
			t.Fatal(err)
		}
		out.Write(append(b, '\n'))
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// asExported admits every message of a valid record as it is: for the tests
// of the format alone (ops.Service.Import applies the rules of ingest).
func asExported(m *envelope.Message, _ *store.RecordMeta) (*envelope.Message, error) { return m, nil }

// A line that is not a valid record is reported with its number; skip goes
// on with the good lines, stop ends the import there, and nothing of a bad
// line is ever written.
func TestImportBadLines(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	src := store.New(r.Client(), store.Options{Prefix: "src", Shards: 4})
	far := time.Now().Add(time.Hour)
	var good []*envelope.Message
	for i := range 4 {
		good = append(good, &envelope.Message{ID: fmt.Sprintf("good-%d", i), DueAt: far, Sink: "s", Destination: "d", Body: []byte("ok")})
	}
	if _, err := src.Park(ctx, good); err != nil {
		t.Fatal(err)
	}
	data, _ := exportAll(t, src, false)
	lines := sortedLines(data) // good-0 .. good-3
	valid := `{"v":1,"id":"%s","state":"scheduled","due_at":"2030-01-01T00:00:00.000Z","sink":"s","destination":"d","body_base64":"%s"}`
	bad := []struct{ line, id, want string }{
		{lines[0][:len(lines[0])/2], "good-0", "not a JSON record"},
		{fmt.Sprintf(valid, "bad-base64", "not*base64"), "bad-base64", "body_base64"},
		{strings.Replace(fmt.Sprintf(valid, "bad-due", "b2s="), "2030-01-01T00:00:00.000Z", "tomorrow", 1), "bad-due", `"due_at" "tomorrow" is not an RFC 3339 time`},
		{strings.Replace(fmt.Sprintf(valid, "", "b2s="), `"id":"",`, "", 1), "", `"id" is missing`},
		{fmt.Sprintf(valid, strings.Repeat("x", 300), "b2s="), strings.Repeat("x", 300), "over limits.max_id_bytes 256"},
		{strings.Replace(fmt.Sprintf(valid, "unknown-field", "b2s="), `"v":1,`, `"v":1,"colour":"red",`, 1), "unknown-field", `unknown field "colour"`},
		{strings.Replace(fmt.Sprintf(valid, "v2", "b2s="), `"v":1,`, `"v":2,`, 1), "v2", "written by a newer delaybridge"},
		{strings.Replace(fmt.Sprintf(valid, "deep", "b2s="), `"v":1,`, `"v":1,"headers":{"a":`+strings.Repeat("[", 70)+strings.Repeat("]", 70)+`},`, 1),
			"deep", "too_deep: the JSON document nests objects and arrays deeper than 64 levels"},
		// Read as strictly as the admin API reads a request: encoding/json
		// took the last of two ids, "ID" for "id", and a lone surrogate as
		// U+FFFD, an ID the API refuses.
		{strings.Replace(fmt.Sprintf(valid, "twice", "b2s="), `"v":1,`, `"v":1,"id":"once",`, 1), "twice", `"id" is given twice`},
		{strings.Replace(fmt.Sprintf(valid, "upper", "b2s="), `"id":`, `"ID":`, 1), "upper", `did you mean "id"`},
		{fmt.Sprintf(valid, `lone\ud800`, "b2s="), "", "lone UTF-16 surrogate"},
		{strings.Replace(fmt.Sprintf(valid, "past-count", "b2s="), `"v":1,`, `"v":1,"recurrence":{"every":"1m","anchor":"2030-01-01T00:00:00.000Z","count":4,"n":7,"missed":"once"},`, 1),
			"past-count", `"recurrence.n" 7 is past "recurrence.count" 4`},
		{strings.Replace(fmt.Sprintf(valid, "n-zero", "b2s="), `"v":1,`, `"v":1,"recurrence":{"every":"1m","anchor":"2030-01-01T00:00:00.000Z","count":4,"n":0,"missed":"once"},`, 1),
			"n-zero", `"recurrence.n" 0 is not at least 1`},
	}
	// good-1, bad..., good-2, "", good-3: line 1, then one line per bad record, then the three.
	file := []string{lines[1]}
	for _, b := range bad {
		file = append(file, b.line)
	}
	file = append(file, lines[2], "", lines[3])
	input := []byte(strings.Join(file, "\n")) // the last line has no line end

	t.Run("skip", func(t *testing.T) {
		dst := store.New(r.Client(), store.Options{Prefix: "skip", Shards: 3})
		var errs []*store.LineError
		st, err := dst.Import(ctx, bytes.NewReader(input), store.ImportOptions{MaxIDBytes: 256, Admit: asExported, Bad: func(le *store.LineError) { errs = append(errs, le) }})
		if err != nil {
			t.Fatal(err)
		}
		if st.Imported != 3 || st.Bad != len(bad) || st.Lines != 3+len(bad) {
			t.Fatalf("stats %+v", st)
		}
		if len(errs) != len(bad) {
			t.Fatalf("errors %v", errs)
		}
		for i, b := range bad {
			le := errs[i]
			if le.Line != i+2 || !strings.Contains(le.Error(), b.want) || !strings.HasPrefix(le.Error(), fmt.Sprintf("line %d: ", i+2)) ||
				!errors.Is(le, store.ErrBadRecord) {
				t.Errorf("bad line %d: %v, want line %d and %q", i, le, i+2, b.want)
			}
			if b.id != "" && b.id != "good-0" {
				if _, err := dst.Inspect(ctx, b.id); !errors.Is(err, store.ErrNotFound) {
					t.Errorf("%s of a bad line was written: %v", b.id, err)
				}
			}
		}
		if _, err := dst.Inspect(ctx, "good-0"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("the truncated line was written: %v", err)
		}
		for _, id := range []string{"good-1", "good-2", "good-3"} {
			if _, err := dst.Inspect(ctx, id); err != nil {
				t.Errorf("%s: %v", id, err)
			}
		}
	})
	t.Run("stop", func(t *testing.T) {
		dst := store.New(r.Client(), store.Options{Prefix: "stop", Shards: 3})
		st, err := dst.Import(ctx, bytes.NewReader(input), store.ImportOptions{MaxIDBytes: 256, Admit: asExported, Stop: true})
		var le *store.LineError
		if !errors.As(err, &le) || le.Line != 2 || !strings.Contains(err.Error(), "not a JSON record") {
			t.Fatalf("err %v, want line 2", err)
		}
		if st.Imported != 1 || st.Bad != 1 {
			t.Fatalf("stats %+v, want the line before imported", st)
		}
		for id, want := range map[string]error{"good-1": nil, "good-0": store.ErrNotFound, "good-2": store.ErrNotFound} {
			if _, err := dst.Inspect(ctx, id); !errors.Is(err, want) {
				t.Errorf("%s: %v, want %v", id, err, want)
			}
		}
		// Stopping at a bad base64 body writes nothing of it.
		st, err = dst.Import(ctx, strings.NewReader(bad[1].line+"\n"), store.ImportOptions{Admit: asExported, Stop: true})
		if !errors.As(err, &le) || le.Line != 1 || st.Imported != 0 {
			t.Fatalf("%+v %v", st, err)
		}
		if _, err := dst.Inspect(ctx, "bad-base64"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("bad-base64: %v", err)
		}
	})
	t.Run("too long", func(t *testing.T) {
		dst := store.New(r.Client(), store.Options{Prefix: "long", Shards: 3})
		long := fmt.Sprintf(valid, "long", strings.Repeat("QUFB", 1000))
		var errs []*store.LineError
		st, err := dst.Import(ctx, strings.NewReader(lines[0]+"\n"+long+"\r\n"+lines[1]+"\r\n"),
			store.ImportOptions{MaxLineBytes: 1000, Admit: asExported, Bad: func(le *store.LineError) { errs = append(errs, le) }})
		if err != nil || st.Imported != 2 || len(errs) != 1 || errs[0].Line != 2 || !strings.Contains(errs[0].Error(), "longer than 1000 bytes") {
			t.Fatalf("%+v %v %v", st, err, errs)
		}
	})
}

// A cancelled export or import ends with the context's error, and the
// reading and writing goroutines end with it.
func TestExportImportCancelled(t *testing.T) {
	r := testenv.Redis(t)
	s := store.New(r.Client(), store.Options{Prefix: "c", Shards: 4})
	var msgs []*envelope.Message
	for i := range 2000 {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("m-%d", i), DueAt: time.Now().Add(time.Hour), Sink: "s", Destination: "d",
			Body: make([]byte, 2000)}) // over the 1 MiB write buffer
	}
	if _, err := s.Park(context.Background(), msgs); err != nil {
		t.Fatal(err)
	}
	data, _ := exportAll(t, s, false)
	ctx, cancel := context.WithCancel(context.Background())
	var w cancelAfter
	w.cancel, w.n = cancel, 1
	if _, err := s.Export(ctx, &w, store.ExportOptions{Batch: 10}); !errors.Is(err, context.Canceled) {
		t.Fatalf("export: %v, want cancelled", err)
	}
	dst := store.New(r.Client(), store.Options{Prefix: "d", Shards: 4})
	if _, err := dst.Import(ctx, bytes.NewReader(data), store.ImportOptions{Admit: asExported}); !errors.Is(err, context.Canceled) {
		t.Fatalf("import: %v, want cancelled", err)
	}
}

// cancelAfter is a writer that cancels after n writes.
type cancelAfter struct {
	cancel context.CancelFunc
	n      int
}

func (w *cancelAfter) Write(b []byte) (int, error) {
	if w.n--; w.n <= 0 {
		w.cancel()
	}
	return len(b), nil
}

// Text keeps every byte: valid UTF-8 as a JSON string, anything else as
// {"base64": ...}.
func TestTextKeepsEveryByte(t *testing.T) {
	for _, s := range []string{"", "plain", "é ünï 日本", "\u2028\u2029", "a\"b\\c", "\x00\x01\x1f\x7f", "<&>", "\xff", "ok\xc3\x28", "\xed\xa0\x80"} {
		b, err := json.Marshal(store.Text(s))
		if err != nil {
			t.Fatal(err)
		}
		var back store.Text
		if err := json.Unmarshal(b, &back); err != nil || string(back) != s {
			t.Errorf("%q -> %s -> %q, %v", s, b, back, err)
		}
		if valid := !bytes.HasPrefix(b, []byte("{")); valid != utf8.ValidString(s) {
			t.Errorf("%q written as %s", s, b)
		}
	}
	for _, bad := range []string{`{"base64":"%%"}`, `{"b64":"AA=="}`, `{}`, `12`, `null`} {
		var v store.Text
		if err := json.Unmarshal([]byte(bad), &v); err == nil && bad != "null" {
			t.Errorf("%s accepted as %q", bad, v)
		}
	}
}

// An imported record whose ID the target knows as a message of another
// source is refused with id_taken, replace or not, and the known message
// is left as it was: a publisher cannot replace or drop another's message
// by reusing its ID, through import either. One of the same source is
// skipped, or replaced with Replace.
func TestImportRefusesAnotherSourcesID(t *testing.T) {
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	dst := newStore(t, 2)
	data := exportOf(t, "b", "x")
	mine := msg("x", due)
	mine.Ingest, mine.Body = "a", []byte("a's")
	park(t, dst, store.Parked, mine)
	for _, replace := range []bool{false, true} {
		var bad []*store.LineError
		st, err := dst.Import(ctx, bytes.NewReader(data), store.ImportOptions{Replace: replace, Admit: asExported,
			Bad: func(le *store.LineError) { bad = append(bad, le) }})
		if err != nil {
			t.Fatal(err)
		}
		if st.Bad != 1 || st.Replaced != 0 || st.Known != 0 || len(bad) != 1 || bad[0].Line != 1 ||
			!errors.Is(bad[0], store.ErrRefused) || !strings.Contains(bad[0].Error(), "id_taken") {
			t.Fatalf("replace %v: %+v, bad lines %v; want line 1 refused with id_taken", replace, st, bad)
		}
		if info, err := dst.Inspect(ctx, "x"); err != nil || string(info.Message.Body) != "a's" || info.Message.Ingest != "a" {
			t.Fatalf("replace %v: x is now %+v %v, want a's message", replace, info, err)
		}
	}
	own := rewrite(t, data, func(rec *store.Record) { rec.Ingest = "a" })
	if st := importAll(t, dst, own, store.ImportOptions{}); st.Known != 1 {
		t.Fatalf("a's own record again: %+v, want it skipped as known", st)
	}
	if st := importAll(t, dst, own, store.ImportOptions{Replace: true}); st.Replaced != 1 {
		t.Fatalf("a's own record with replace: %+v, want it replaced", st)
	}
}

// A file that starts with a UTF-8 byte order mark (as some editors save
// one) imports as it would without it.
func TestImportReadsPastAByteOrderMark(t *testing.T) {
	data := exportOf(t, "", "x")
	if st := importAll(t, newStore(t, 2), append([]byte("\xef\xbb\xbf"), data...), store.ImportOptions{}); st.Imported != 1 {
		t.Fatalf("import of a file with a byte order mark: %+v", st)
	}
}

// A record whose replacement names another ingest than its message is not
// valid: a later version of a message comes from its own source (ingest
// refuses another's as id_taken), so import refuses the line.
func TestImportRefusesAReplacementOfAnotherIngest(t *testing.T) {
	ctx := context.Background()
	dst := newStore(t, 2)
	data := exportOf(t, "a", "x")
	for _, ingest := range []string{"b", "a"} {
		line := rewrite(t, data, func(rec *store.Record) {
			rec.Replacement = &store.Record{DueAt: rec.DueAt, Sink: rec.Sink, Destination: rec.Destination, Ingest: store.Text(ingest), BodyBase64: "bmV3"}
		})
		var bad []*store.LineError
		st, err := dst.Import(ctx, bytes.NewReader(line), store.ImportOptions{Replace: true, Admit: asExported,
			Bad: func(le *store.LineError) { bad = append(bad, le) }})
		if err != nil {
			t.Fatal(err)
		}
		if ingest == "b" && (st.Bad != 1 || len(bad) != 1 || !strings.Contains(bad[0].Error(), `"replacement" has the "ingest" "b"`)) {
			t.Fatalf("a replacement of ingest b under a's message: %+v %v, want the line refused", st, bad)
		}
		if ingest == "a" && (st.Bad != 0 || st.Imported+st.Replaced != 1) {
			t.Fatalf("a replacement of the message's own ingest: %+v %v, want it imported", st, bad)
		}
	}
}

// With Stop, a line refused only as it is written (its ID another
// source's) ends the import after its batch: the next batches are not
// written, and the error names the line.
func TestImportStopsAtALineRefusedAsItIsWritten(t *testing.T) {
	ctx := context.Background()
	due := time.Now().Add(time.Hour)
	dst := newStore(t, 2)
	data := exportOf(t, "b", "x", "y")
	mine := msg("x", due)
	mine.Ingest = "a"
	park(t, dst, store.Parked, mine)
	lines := sortedLines(data) // x, then y
	st, err := dst.Import(ctx, strings.NewReader(strings.Join(lines, "\n")+"\n"), store.ImportOptions{Stop: true, Batch: 1, Admit: asExported})
	var le *store.LineError
	if !errors.As(err, &le) || le.Line != 1 || st.Imported != 0 {
		t.Fatalf("import: %+v %v, want it stopped at line 1 with nothing imported", st, err)
	}
	if _, err := dst.Inspect(ctx, "y"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("y, after the line that stopped the import: %v, want it not imported", err)
	}
}

// A stored message that cannot be read belongs to no source that import
// could tell: --replace writes the record's over it (a repair), and
// without it the record is skipped as known, not refused as id_taken.
func TestImportReplacesAStoredMessageThatCannotBeRead(t *testing.T) {
	ctx := context.Background()
	dst := newStore(t, 1)
	data := exportOf(t, "a", "x")
	park(t, dst, store.Parked, msg("x", time.Now().Add(time.Hour)))
	if err := dst.Client().HSet(ctx, dst.Keys().Pool(0), "x", "\x00not a stored message").Err(); err != nil {
		t.Fatal(err)
	}
	if st := importAll(t, dst, data, store.ImportOptions{}); st.Known != 1 {
		t.Fatalf("without --replace: %+v, want it skipped as known", st)
	}
	if st := importAll(t, dst, data, store.ImportOptions{Replace: true}); st.Replaced != 1 {
		t.Fatalf("with --replace: %+v, want it replaced", st)
	}
	if info, err := dst.Inspect(ctx, "x"); err != nil || info.Message == nil || info.Message.Ingest != "a" {
		t.Fatalf("x after the repair: %+v %v", info, err)
	}
}

// exportOf parks, in a store of its own, a message due in an hour of
// ingest for each of ids, and returns their export.
func exportOf(t *testing.T, ingest string, ids ...string) []byte {
	t.Helper()
	src := newStore(t, 2)
	for _, id := range ids {
		m := msg(id, time.Now().Add(time.Hour))
		m.Ingest = ingest
		park(t, src, store.Parked, m)
	}
	data, _ := exportAll(t, src, false)
	return data
}
