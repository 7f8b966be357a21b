package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/admin"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ops"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// list, reschedule, fire, groups and sinks give the same answers against
// Redis and through a daemon's admin API, and Redis agrees with them.
func TestScheduleCommandsBothWays(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: ops, shards: 4}
limits: {max_delay: 24h}
sinks:
  - {name: rabbit, nats: {url: "nats://127.0.0.1:4222"}, max_rate: 500}
  - {name: kafka, nats: {url: "nats://127.0.0.1:4222"}}
`, r.Addr))
	st := store.New(r.Client(), store.Options{Prefix: "ops", Shards: 4})
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Token: "tok", Ops: ops.New(ops.Params{Store: st,
		Limits: envelope.Limits{MaxDelay: 24 * time.Hour},
		Sinks: func() []ops.SinkStatus { // as a scheduler that applied the pause in Redis
			states, _ := st.SinkStates(context.Background(), nil)
			return []ops.SinkStatus{{Name: "rabbit", Known: true, Rate: 3, MaxRate: 500, Paused: states["rabbit"].Paused}, {Name: "kafka", Known: true}}
		}})})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())

	ways := map[string][]string{
		"redis": {"-c", cfg},
		"api":   {"--admin", "http://" + srv.Addr(), "--token", "tok"},
	}
	for way, flags := range ways {
		t.Run(way, func(t *testing.T) {
			ctx := context.Background()
			p := way + "-"
			cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }
			due := time.Now().Add(time.Hour).Truncate(time.Second)
			var msgs []*envelope.Message
			for i := range 7 {
				m := &envelope.Message{ID: fmt.Sprintf("%sm%d", p, i), DueAt: due.Add(time.Duration(i) * time.Second),
					Sink: "rabbit", Destination: "d", Group: p + "g", Body: []byte("x")}
				if i >= 5 {
					m.Sink, m.Group = "kafka", ""
				}
				msgs = append(msgs, m)
			}
			msgs[6].Recur = &envelope.Recurrence{Every: time.Hour, Anchor: msgs[6].DueAt, N: 1}
			if _, err := st.Park(ctx, msgs); err != nil {
				t.Fatal(err)
			}

			// list: pages, --all, --json, filters.
			code, out, errOut := cmd("list", "--limit", "3", "--sink", "rabbit", "--group", p+"g")
			if code != 0 || strings.Count(out, p+"m") != 3 || !strings.Contains(errOut, "more: --cursor ") {
				t.Fatalf("list page: %d %q %q", code, out, errOut)
			}
			cursor := strings.TrimSpace(strings.TrimPrefix(errOut, "more: --cursor "))
			code, out, _ = cmd("list", "--limit", "3", "--sink", "rabbit", "--group", p+"g", "--cursor", cursor, "--json")
			var lv ops.ListView
			if code != 0 || json.Unmarshal([]byte(out), &lv) != nil || len(lv.Messages) != 2 || lv.Messages[0].ID != p+"m3" {
				t.Fatalf("list next page: %d %s", code, out)
			}
			code, out, _ = cmd("list", "--all", "--json", "--limit", "2", "--recurring")
			if code != 0 || !strings.Contains(out, `"id":"`+p+`m6"`) || strings.Count(out, "\n") != strings.Count(out, `"schedule":"every 1h0m0s"`) {
				t.Fatalf("list --recurring: %d %s", code, out)
			}
			if code, _, errOut := cmd("list", "--cursor", cursor+"x"); code != 2 || !strings.Contains(errOut, "cursor") {
				t.Fatalf("altered cursor: %d %s", code, errOut)
			}
			if code, _, _ := cmd("list", "--state", "parked"); code != 2 {
				t.Fatalf("bad --state: exit %d", code)
			}

			// reschedule and fire.
			code, out, errOut = cmd("reschedule", p+"m0", "--delay", "2h")
			if code != 0 || !strings.Contains(out, "due at") {
				t.Fatalf("reschedule: %d %s %s", code, out, errOut)
			}
			info, _ := st.Inspect(ctx, p+"m0")
			if d := time.Until(info.Message.DueAt); d < 119*time.Minute || d > 121*time.Minute {
				t.Fatalf("Redis has %v", info.Message.DueAt)
			}
			at := due.Add(3 * time.Hour).UTC().Format(time.RFC3339)
			if code, _, errOut := cmd("reschedule", p+"m1", "--at", at, "--if-due-at", due.Add(time.Minute).UTC().Format(time.RFC3339)); code != 1 || !strings.Contains(errOut, "changed meanwhile") {
				t.Fatalf("stale --if-due-at: %d %s", code, errOut)
			}
			if code, _, errOut := cmd("reschedule", p+"m1", "--at", at, "--if-due-at", msgs[1].DueAt.UTC().Format(time.RFC3339Nano)); code != 0 {
				t.Fatalf("--if-due-at: %d %s", code, errOut)
			}
			if info, _ := st.Inspect(ctx, p+"m1"); info.Message.DueAt.UTC().Format(time.RFC3339) != at {
				t.Fatalf("Redis has %v, want %s", info.Message.DueAt, at)
			}
			if code, _, errOut := cmd("reschedule", p+"m1", "--delay", "48h"); code != 2 || !strings.Contains(errOut, "limits.max_delay") {
				t.Fatalf("beyond max_delay: %d %s", code, errOut)
			}
			if code, out, _ := cmd("reschedule", p+"m1", "--at", "2020-01-01T00:00:00Z"); code != 0 || !strings.Contains(out, "due now") {
				t.Fatalf("into the past: %d %s", code, out)
			}
			if code, _, _ := cmd("reschedule", p+"m1", "--delay", "1m", "--at", at); code != 2 {
				t.Fatalf("both --delay and --at: exit %d", code)
			}
			if code, _, _ := cmd("reschedule", p+"nope", "--delay", "1m"); code != 1 {
				t.Fatalf("unknown: exit %d", code)
			}
			if code, out, _ := cmd("fire", p+"m2"); code != 0 || !strings.Contains(out, "due now") {
				t.Fatalf("fire: %d %s", code, out)
			}
			if info, _ := st.Inspect(ctx, p+"m2"); time.Since(info.Message.DueAt) > 5*time.Second || time.Since(info.Message.DueAt) < 0 {
				t.Fatalf("fired message due %v", info.Message.DueAt)
			}
			if code, _, _ := cmd("fire", p+"nope"); code != 1 {
				t.Fatalf("fire unknown: exit %d", code)
			}

			// groups.
			code, out, _ = cmd("groups", "show", p+"g")
			if code != 0 || !strings.Contains(out, "group "+p+"g: 5 messages") || strings.Count(out, p+"m") != 5 {
				t.Fatalf("groups show: %d %s", code, out)
			}
			if code, out, _ := cmd("groups", "cancel", p+"g"); code != 0 || !strings.Contains(out, "cancelled 5") {
				t.Fatalf("groups cancel: %d %s", code, out)
			}
			if ids, _ := st.GroupMembers(ctx, p+"g", 0); len(ids) != 0 {
				t.Fatalf("Redis still has the group: %v", ids)
			}
			if code, _, _ := cmd("groups", "show", p+"g"); code != 1 {
				t.Fatalf("show an empty group: exit %d", code)
			}
			if code, _, _ := cmd("groups", "cancel", p+"g"); code != 1 {
				t.Fatalf("cancel an empty group: exit %d", code)
			}
		})
	}

	// sinks, both ways: the pause is in Redis.
	for way, flags := range ways {
		cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }
		code, out, errOut := cmd("sinks", "pause", "rabbit")
		if code != 0 || !strings.Contains(out, "paused rabbit") {
			t.Fatalf("%s: pause: %d %s %s", way, code, out, errOut)
		}
		if !strings.Contains(out, "next refresh (within scheduler.max_sleep)") {
			// Written to Redis, the pause reaches the running daemons (but
			// the one asked) when they look.
			t.Fatalf("%s: pause does not say when the running daemons apply it: %s", way, out)
		}
		if s, _ := st.SinkStates(context.Background(), nil); !s["rabbit"].Paused {
			t.Fatalf("%s: not paused in Redis", way)
		}
		code, out, _ = cmd("sinks", "--json")
		var views []ops.SinkView
		if code != 0 || json.Unmarshal([]byte(out), &views) != nil || len(views) != 2 || views[1].Name != "rabbit" || !views[1].Paused || views[1].MaxRate != 500 {
			t.Fatalf("%s: sinks: %d %s", way, code, out)
		}
		if way == "api" && (views[1].Rate == nil || *views[1].Rate != 3) || way == "redis" && views[1].Ready != nil {
			t.Fatalf("%s: what is known of the sink: %s", way, out)
		}
		if code, out, _ := cmd("sinks"); code != 0 || !strings.Contains(out, "paused") || !strings.Contains(out, "MAX RATE") {
			t.Fatalf("%s: sinks table: %d %s", way, code, out)
		} else if explained := strings.Contains(out, "ask a running daemon with --admin"); explained != (way == "redis") {
			// kafka is not paused: through Redis its status is unknown, and the table says why.
			t.Fatalf("%s: sinks table explains unknown: %v, want %v:\n%s", way, explained, way == "redis", out)
		}
		if code, _, _ := cmd("sinks", "resume", "rabbit"); code != 0 {
			t.Fatalf("%s: resume: exit %d", way, code)
		}
		if s, _ := st.SinkStates(context.Background(), nil); s["rabbit"].Paused {
			t.Fatalf("%s: still paused in Redis", way)
		}
		if code, _, errOut := cmd("sinks", "pause", "nope"); code != 1 || !strings.Contains(errOut, "kafka, rabbit") {
			t.Fatalf("%s: pause unknown: %d %s", way, code, errOut)
		}
	}
}

// Every new command explains itself with an example.
func TestScheduleCommandsHelp(t *testing.T) {
	for _, c := range [][]string{{"list"}, {"reschedule"}, {"fire"}, {"groups", "show"}, {"groups", "cancel"}, {"sinks"}, {"sinks", "pause"}, {"sinks", "resume"}} {
		code, out, _ := run(t, append(c, "--help")...)
		if code != 0 || !strings.Contains(out, "Examples:") || !strings.Contains(out, "delaybridge "+strings.Join(c, " ")) {
			t.Errorf("%v --help: %d %s", c, code, out)
		}
	}
}

// Bad values of the sink knobs are clear errors of validate, with the
// field path, never a crash.
func TestBadSinkKnobs(t *testing.T) {
	for _, c := range []struct{ value, want string }{
		{"-5", "sinks[0].max_rate (s): must not be negative"},
		{"1e12", "sinks[0].max_rate (s): 1e+12 messages/s is over"},
		{"0.0000001", "sinks[0].max_rate (s): 1e-07 messages/s is under one message in 1000 s"},
		{".nan", "sinks[0].max_rate (s): must not be negative"},
		{"fast", "max_rate"},
	} {
		cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "127.0.0.1:6379"}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}, max_rate: %s}]
`, c.value))
		code, _, errOut := run(t, "validate", "-c", cfg)
		if code != 1 || !strings.Contains(errOut, c.want) {
			t.Errorf("max_rate %s: exit %d, %q; want %q", c.value, code, errOut, c.want)
		}
	}
}

// dead retry takes --sink and --destination (needed for a message that died
// for its destination), dead list and dead purge take the filters, and
// purge is one request through the API; both ways agree with Redis.
func TestDeadCommandsBothWays(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: dead, shards: 4}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr))
	st := store.New(r.Client(), store.Options{Prefix: "dead", Shards: 4})
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Token: "tok", Ops: ops.New(ops.Params{Store: st})})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	ctx := context.Background()
	for way, flags := range map[string][]string{"redis": {"-c", cfg}, "api": {"--admin", "http://" + srv.Addr(), "--token", "tok"}} {
		t.Run(way, func(t *testing.T) {
			cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }
			p := way + "-"
			// One died at the sink for its destination, two at ingest.
			m := &envelope.Message{ID: p + "noroute", DueAt: time.Now().Add(-time.Minute).Truncate(time.Millisecond), Sink: "out", Destination: "gone.x", Ingest: p + "a"}
			if _, err := st.Park(ctx, []*envelope.Message{m}); err != nil {
				t.Fatal(err)
			}
			l, err := st.Claim(ctx, st.ShardOf(m.ID), 10, time.Minute, nil)
			if err != nil {
				t.Fatal(err)
			}
			if n, err := st.MarkDead(ctx, l, []store.Failure{{ID: m.ID, Reason: "nats sink out: no stream stores this subject"}}); err != nil || n != 1 {
				t.Fatalf("mark dead: %d %v", n, err)
			}
			for _, id := range []string{"x", "y"} {
				rm := &envelope.Message{ID: p + id, DueAt: time.Now().Truncate(time.Millisecond), Sink: "out", Destination: "d", Ingest: p + id}
				if _, err := st.Reject(ctx, []store.Rejected{{Message: rm, Reason: "x-delay is empty"}}); err != nil {
					t.Fatal(err)
				}
			}

			if code, _, errOut := cmd("dead", "retry", p+"noroute"); code != 1 || !strings.Contains(errOut, "broker refused") || !strings.Contains(errOut, "--destination") {
				t.Fatalf("retry without a destination: %d %s", code, errOut)
			}
			if code, out, errOut := cmd("dead", "retry", p+"noroute", "--destination", "orders.back"); code != 0 || !strings.Contains(out, "scheduled again") {
				t.Fatalf("retry with a destination: %d %s %s", code, out, errOut)
			}
			if info, err := st.Inspect(ctx, p+"noroute"); err != nil || info.State != store.StateScheduled || info.Message.Destination != "orders.back" ||
				time.Since(info.Message.DueAt) > 5*time.Second {
				t.Fatalf("Redis after the retry: %+v %v", info, err)
			}
			code, out, _ := cmd("dead", "list", "--json", "--ingest", p+"x")
			var list []ops.DeadView
			if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 || list[0].ID != p+"x" {
				t.Fatalf("dead list --ingest: %d %s", code, out)
			}
			if code, out, _ := cmd("dead", "purge", "--ingest", p+"x"); code != 0 || !strings.Contains(out, "deleted 1 dead") {
				t.Fatalf("dead purge --ingest: %d %s", code, out)
			}
			if _, err := st.Inspect(ctx, p+"y"); err != nil {
				t.Fatalf("purge deleted what its filter did not select: %v", err)
			}
			if code, _, errOut := cmd("dead", "purge", "--dead-after", "soon"); code != 2 || !strings.Contains(errOut, "dead_after") {
				t.Fatalf("dead purge with a bad time: %d %s", code, errOut)
			}
		})
	}
}

// TestEmptyFilterFlagsRefused: a filter flag given empty (--group "") or
// malformed is exit 2 naming it, both ways, and purges nothing: `dead
// purge --group ""` once deleted every dead message.
func TestEmptyFilterFlagsRefused(t *testing.T) {
	r := testenv.Redis(t)
	cfg := writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: empty, shards: 4}
sinks: [{name: out, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr))
	st := store.New(r.Client(), store.Options{Prefix: "empty", Shards: 4})
	srv := admin.New(admin.Params{Listen: "127.0.0.1:0", Token: "tok", Ops: ops.New(ops.Params{Store: st})})
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	ctx := context.Background()
	for _, id := range []string{"x", "y"} {
		rm := &envelope.Message{ID: id, DueAt: time.Now().Truncate(time.Millisecond), Sink: "out", Destination: "d", Ingest: "in", Group: "g"}
		if _, err := st.Reject(ctx, []store.Rejected{{Message: rm, Reason: "x-delay is empty"}}); err != nil {
			t.Fatal(err)
		}
	}
	for way, flags := range map[string][]string{"redis": {"-c", cfg}, "api": {"--admin", "http://" + srv.Addr(), "--token", "tok"}} {
		t.Run(way, func(t *testing.T) {
			cmd := func(args ...string) (int, string, string) { return run(t, append(args, flags...)...) }
			var calls [][]string
			for _, f := range []string{"--sink", "--destination", "--ingest", "--group", "--dead-after", "--dead-before"} {
				calls = append(calls, []string{"dead", "purge", f, ""}, []string{"dead", "purge", "--ingest", "in", f + "="}, []string{"dead", "list", f, ""})
			}
			for _, f := range []string{"--sink", "--destination", "--ingest", "--group", "--state", "--due-after", "--due-before", "--cursor"} {
				calls = append(calls, []string{"list", f, ""})
			}
			calls = append(calls,
				[]string{"groups", "show", "g", "--sink", ""},
				[]string{"dead", "retry", "x", "--destination", ""},
				[]string{"dead", "purge", "--sink", " "},
				[]string{"dead", "purge", "--group", "g\x01"},
				[]string{"list", "--ingest", "a\x00b"},
			)
			for _, c := range calls {
				code, out, errOut := cmd(c...)
				var name string // the last flag of the call, the one at fault
				for _, a := range c {
					if strings.HasPrefix(a, "--") {
						name = strings.TrimSuffix(strings.TrimPrefix(a, "--"), "=")
					}
				}
				if code != 2 || !strings.Contains(errOut, name) {
					t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 naming %s", c, code, out, errOut, name)
				}
			}
			if s, err := st.Stats(ctx); err != nil || s.Dead != 2 {
				t.Fatalf("after refused purges: %d dead, want 2 (%v)", s.Dead, err)
			}
		})
	}
}
