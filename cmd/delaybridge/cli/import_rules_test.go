package cli

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// importRulesConfig has a NATS sink "out" (so destinations follow NATS's
// syntax), the default limits (max_payload_bytes 1 MiB, max_delay 365
// days), and an ingest whose allowed_destinations name a part of the KV
// API, which only its messages may reach.
const importRulesConfig = `
redis: {addr: "%s", key_prefix: %s, shards: 4}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222", jetstream: true}}]
ingest:
  - name: kv-in
    nats: {url: "nats://127.0.0.1:4222", subject: "kv.>", stream: KV, durable: d}
    route: {sink: out, destination: "$KV.orders.x", allowed_destinations: ["$KV.orders.>"]}
`

// importRecord is one line of an export: a scheduled message due in an
// hour to out/fired.x, with edit applied to its JSON fields.
func importRecord(id string, edit func(map[string]string)) string {
	f := map[string]string{
		"v": "1", "id": q(id), "state": q("scheduled"), "sink": q("out"), "destination": q("fired.x"),
		"due_at":      q(time.Now().Add(time.Hour).UTC().Format("2006-01-02T15:04:05.000Z")),
		"body_base64": q(base64.StdEncoding.EncodeToString([]byte("body"))),
	}
	if edit != nil {
		edit(f)
	}
	var parts []string
	for _, k := range []string{"v", "id", "state", "due_at", "sink", "destination", "ingest", "recurrence", "attempts", "dead_at", "reason", "headers", "body_base64", "replacement"} {
		if v, ok := f[k]; ok {
			parts = append(parts, fmt.Sprintf("%q:%s", k, v))
		}
	}
	return "{" + strings.Join(parts, ",") + "}\n"
}

func q(s string) string { return fmt.Sprintf("%q", s) }

// Import refuses what ingest refuses: each of eight records that break a
// rule of ingest is refused, named with its line number and the rule, and
// nothing of it is written.
func TestImportRefusesWhatIngestRefuses(t *testing.T) {
	r := testenv.Redis(t)
	recurrence := func(fields string) func(map[string]string) {
		return func(f map[string]string) {
			f["recurrence"] = `{` + fields + `,"anchor":` + f["due_at"] + `,"n":1,"missed":"once"}`
		}
	}
	findings := []struct {
		name string
		edit func(map[string]string)
		want string
	}{
		{"every 1ms", recurrence(`"every":"1ms"`), `"recurrence.every" "1ms" is shorter than limits.min_interval 1s`},
		{"cron that does not parse", recurrence(`"cron":"61 * * * *"`), `"recurrence.cron" "61 * * * *" is not a 5- or 6-field cron expression`},
		{"zone Local", recurrence(`"cron":"0 9 * * *","timezone":"Local"`), `"recurrence.timezone" "Local" is not an IANA time zone`},
		{"destination with CR LF", func(f map[string]string) { f["destination"] = q("fired.x\r\nPUB evil 1") },
			"destination contains a control character such as NUL, CR or LF"},
		{"empty destination", func(f map[string]string) { f["destination"] = q("") }, `"destination" is empty`},
		{"body over max_payload_bytes", func(f map[string]string) {
			f["body_base64"] = q(base64.StdEncoding.EncodeToString(make([]byte, 3<<19)))
		}, "body is 1572864 bytes, over limits.max_payload_bytes 1048576\n"},
		{"due in 2100, beyond max_delay", func(f map[string]string) { f["due_at"] = q("2100-01-01T00:00:00.000Z") },
			"due time 2100-01-01T00:00:00.000Z is more than limits.max_delay 8760h0m0s from now"},
		{"control header x-delay-cancel", func(f map[string]string) { f["headers"] = `[{"key":"x-delay-cancel","value":"victim"}]` },
			`"headers"[0] "x-delay-cancel" is a control header, which ingest reads and never forwards`},
	}
	for i, c := range findings {
		t.Run(c.name, func(t *testing.T) {
			prefix := fmt.Sprintf("finding%d", i)
			cfg := writeConfig(t, fmt.Sprintf(importRulesConfig, r.Addr, prefix))
			file := filepath.Join(t.TempDir(), "in.jsonl")
			id := fmt.Sprintf("refused-%d", i)
			if err := os.WriteFile(file, []byte(importRecord(id, c.edit)), 0o600); err != nil {
				t.Fatal(err)
			}
			code, _, errOut := run(t, "import", "-c", cfg, "--in", file)
			want := "line 1: refused by the rules of ingest: " + c.want
			if code != 1 || !strings.Contains(errOut, want) || !strings.Contains(errOut, "imported 0 (0 dead)") {
				t.Errorf("exit %d, stderr:\n%s\nwant exit 1 and %q", code, errOut, want)
			}
			s := store.New(r.Client(), store.Options{Prefix: prefix, Shards: 4})
			if _, err := s.Inspect(context.Background(), id); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the refused record was written: %v", err)
			}
		})
	}
}

// A line longer than two POST /v1/messages bodies may be (each twice
// max_payload_bytes and max_header_bytes, and 64 KiB: a record holds a
// message and the version waiting behind it) is refused before it is
// decoded; a record of two bodies of max_payload_bytes each, as export
// writes for a message in flight and its replacement, is imported.
func TestImportRefusesALineOverTheDocumentLimit(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(importRulesConfig, r.Addr, "long"))
	file := filepath.Join(t.TempDir(), "in.jsonl")
	body := func(n int) func(map[string]string) {
		return func(f map[string]string) { f["body_base64"] = q(base64.StdEncoding.EncodeToString(make([]byte, n))) }
	}
	huge := importRecord("huge", body(4<<20))
	full := importRecord("full", func(f map[string]string) {
		body(1 << 20)(f)
		f["replacement"] = fmt.Sprintf(`{"due_at":%s,"sink":"out","destination":"fired.x","body_base64":%s}`,
			f["due_at"], q(base64.StdEncoding.EncodeToString(make([]byte, 1<<20))))
	})
	if err := os.WriteFile(file, []byte(huge+full+importRecord("fine", nil)), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "import", "-c", cfg, "--in", file, "--on-error", "skip")
	if want := fmt.Sprintf("line 1: not a valid export record: longer than %d bytes", 2*(2<<20+2*(64<<10)+64<<10)); code != 1 || !strings.Contains(errOut, want) ||
		!strings.Contains(errOut, "imported 2 (0 dead)") {
		t.Errorf("exit %d, stderr:\n%s\nwant exit 1, %q and the other two lines imported", code, errOut, want)
	}
}

// What ingest would have parked is what import writes, under the route of
// the record's ingest: among valid lines, each refused one is named with
// its own line number (--on-error=skip); a destination in the KV API is
// imported for the ingest whose route gives it and refused for any other,
// and for that ingest too when its route would not have let a publisher
// choose it (no allow_override); a scheduled message for a sink the configuration lacks is
// refused, a dead one kept (a retry asks for a sink); a message that died
// at ingest keeps the control headers ingest kept.
func TestImportUnderTheRoutesOfIngest(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(importRulesConfig, r.Addr, "routes"))
	kv := func(f map[string]string) { f["destination"], f["ingest"] = q("$KV.orders.x"), q("kv-in") }
	lines := []string{
		importRecord("ok-1", nil),
		importRecord("kv-other", func(f map[string]string) { f["destination"] = q("$KV.orders.42") }),
		importRecord("kv", kv),
		importRecord("kv-chosen", func(f map[string]string) { f["destination"], f["ingest"] = q("$KV.orders.42"), q("kv-in") }),
		importRecord("no-sink", func(f map[string]string) { f["sink"] = q("gone") }),
		importRecord("dead-no-sink", func(f map[string]string) {
			f["sink"], f["state"], f["attempts"], f["dead_at"], f["reason"] = q("gone"), q("dead"), "3", f["due_at"], q("unroutable")
		}),
		importRecord("rejected", func(f map[string]string) {
			f["state"], f["dead_at"], f["reason"] = q("dead"), f["due_at"], q("x-delay and x-deliver-at given")
			f["headers"] = `[{"key":"x-delay","value":"5s"},{"key":"x-deliver-at","value":"2030-01-01T00:00:00Z"}]`
		}),
		importRecord("ok-2", nil),
		importRecord("ghost", func(f map[string]string) { f["destination"], f["ingest"] = q("elsewhere.z"), q("ghost") }),
		importRecord("dead-ghost", func(f map[string]string) { // a retry would publish it by a route of its own
			f["destination"], f["ingest"], f["state"], f["attempts"], f["dead_at"], f["reason"] = q("elsewhere.z"), q("ghost"), q("dead"), "1", f["due_at"], q("timeout")
		}),
	}
	file := filepath.Join(t.TempDir(), "in.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "import", "-c", cfg, "--in", file, "--on-error=skip")
	wantRefused(t, code, errOut,
		`line 2: refused by the rules of ingest: destination_reserved: NATS subject "$KV.orders.42" begins with "$"`,
		`line 4: refused by the rules of ingest: "sink"/"destination" given, but the route of ingest "kv-in" does not allow overrides (route.allow_override)`,
		`line 5: refused by the rules of ingest: sink "gone" names no configured sink`,
		`line 9: refused by the rules of ingest: no ingest "ghost" is configured`,
		`line 10: refused by the rules of ingest: no ingest "ghost" is configured`,
		"imported 5 (2 dead), replaced 0, skipped 0 known, 5 bad line(s): lines 2, 4, 5, 9, 10",
	)
	s := store.New(r.Client(), store.Options{Prefix: "routes", Shards: 4})
	for id, state := range map[string]string{"ok-1": store.StateScheduled, "kv": store.StateScheduled, "ok-2": store.StateScheduled,
		"dead-no-sink": store.StateDead, "rejected": store.StateDead, "kv-other": "", "kv-chosen": "", "no-sink": "", "ghost": "", "dead-ghost": ""} {
		info, err := s.Inspect(ctx, id)
		switch {
		case state == "" && !errors.Is(err, store.ErrNotFound):
			t.Errorf("%s was written: %+v %v", id, info, err)
		case state != "" && (err != nil || info.State != state):
			t.Errorf("%s: %+v %v, want %s", id, info, err, state)
		}
	}
	if info, err := s.Inspect(ctx, "rejected"); err == nil && len(info.Message.Headers) != 2 {
		t.Errorf("the rejected message lost the control headers ingest kept: %v", info.Message.Headers)
	}
}

// Import holds new recurring series to limits.max_series, as ingest does:
// past it a record is refused with the rule and its line, nothing of it
// written.
func TestImportHoldsTheSeriesBound(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(importRulesConfig, r.Addr, "series")+"limits: {max_series: 1}\n")
	series := func(f map[string]string) {
		f["recurrence"] = `{"every":"1h","anchor":` + f["due_at"] + `,"n":1,"missed":"once"}`
	}
	file := filepath.Join(t.TempDir(), "in.jsonl")
	lines := importRecord("s1", series) + importRecord("s2", series) + importRecord("one-shot", nil) + importRecord("s3", series)
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := run(t, "import", "-c", cfg, "--in", file, "--on-error=skip")
	wantRefused(t, code, errOut,
		"line 2: refused by the rules of ingest: the store holds as many live recurring series as limits.max_series allows",
		"line 4: refused by the rules of ingest: the store holds as many live recurring series as limits.max_series allows",
		"imported 2 (0 dead), replaced 0, skipped 0 known, 2 bad line(s)",
	)
	s := store.New(r.Client(), store.Options{Prefix: "series", Shards: 4})
	if st, err := s.Stats(context.Background()); err != nil || st.Series != 1 || st.Parked != 2 {
		t.Errorf("stats: %d series, %d parked (%v); want 1 and 2", st.Series, st.Parked, err)
	}
}

// wantRefused checks an import that refused lines: exit 1, and stderr
// holding each of wants.
func wantRefused(t *testing.T, code int, errOut string, wants ...string) {
	t.Helper()
	for _, want := range wants {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
}

// The summary names bad lines in the file's order, whenever each was
// found (a line refused when its batch is written comes after later ones).
func TestLineListInOrder(t *testing.T) {
	if got, want := lineList([]int{1806, 1931, 1172}, 4), ": lines 1172, 1806, 1931 and 1 more"; got != want {
		t.Fatalf("lineList: %q, want %q", got, want)
	}
}
