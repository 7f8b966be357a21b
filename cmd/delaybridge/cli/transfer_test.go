package cli

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// export and import through the command line: a file or stdout, summaries
// on stderr, a second import skips everything, a bad line is named with its
// number and sets exit 1, and the shard count recorded in Redis is checked.
func TestExportImportCommands(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	cfg := func(prefix string, shards int) string {
		return writeConfig(t, fmt.Sprintf(`
redis: {addr: "%s", key_prefix: %s, shards: %d}
sinks: [{name: s, nats: {url: "nats://127.0.0.1:4222"}}]
`, r.Addr, prefix, shards))
	}
	oldCfg, newCfg := cfg("old", 16), cfg("new", 5)
	src := store.New(r.Client(), store.Options{Prefix: "old", Shards: 16})
	var msgs []*envelope.Message
	for i := range 50 {
		msgs = append(msgs, &envelope.Message{ID: fmt.Sprintf("m-%d", i), DueAt: time.Now().Add(time.Hour).Truncate(time.Millisecond),
			Sink: "s", Destination: "d", Body: []byte("body")})
	}
	if _, err := src.Park(ctx, msgs); err != nil {
		t.Fatal(err)
	}

	file := filepath.Join(t.TempDir(), "parked.jsonl")
	code, out, errOut := run(t, "export", "-c", oldCfg, "--out", file)
	if code != 0 || out != "" || !strings.Contains(errOut, "exported 50 (0 dead)") {
		t.Fatalf("export: %d %q %q", code, out, errOut)
	}
	code, stdout, _ := run(t, "export", "-c", oldCfg)
	data, err := os.ReadFile(file)
	defer func() { // after the rest: a message that cannot be read
		pool := store.NewKeys("old").Pool(src.ShardOf("m-0"))
		if err := r.Client().HSet(ctx, pool, "m-0", "\xff not a stored message").Err(); err != nil {
			t.Fatal(err)
		}
		partial := filepath.Join(t.TempDir(), "partial.jsonl")
		code, _, errOut := run(t, "export", "-c", oldCfg, "--out", partial)
		if _, serr := os.Stat(partial); code != 1 || !strings.Contains(errOut, "m-0") || !os.IsNotExist(serr) {
			t.Errorf("export with an unreadable message: exit %d, %q, the file: %v; want exit 1 naming it and no file", code, errOut, serr)
		}
	}()
	if err != nil || code != 0 || len(stdout) != len(data) || bytes.Count(data, []byte("\n")) != 50 {
		t.Fatalf("stdout export (%d bytes, exit %d) vs file (%d bytes, %v)", len(stdout), code, len(data), err)
	}

	code, _, errOut = run(t, "import", "-c", newCfg, "--in", file)
	if code != 0 || !strings.Contains(errOut, "imported 50 (0 dead), replaced 0, skipped 0 known, 0 bad line(s)") {
		t.Fatalf("import: %d %q", code, errOut)
	}
	dst := store.New(r.Client(), store.Options{Prefix: "new", Shards: 5})
	if st, err := dst.Stats(ctx); err != nil || st.Parked != 50 {
		t.Fatalf("target parked %+v %v", st, err)
	}
	code, _, errOut = run(t, "import", "-c", newCfg, "--in", file)
	if code != 0 || !strings.Contains(errOut, "imported 0 (0 dead), replaced 0, skipped 50 known") {
		t.Fatalf("second import: %d %q", code, errOut)
	}
	code, _, errOut = run(t, "import", "-c", newCfg, "--in", file, "--replace")
	if code != 0 || !strings.Contains(errOut, "replaced 50") {
		t.Fatalf("replace: %d %q", code, errOut)
	}

	// Bad lines: named with their numbers; stop by default, skip on demand.
	lines := strings.SplitAfter(string(data), "\n")
	badFile := filepath.Join(t.TempDir(), "bad.jsonl")
	bad := lines[0] + "{\"v\":1,\"id\":\"x\"\n" + lines[1] + "not json\n"
	if err := os.WriteFile(badFile, []byte(bad), 0o600); err != nil {
		t.Fatal(err)
	}
	third := cfg("third", 3)
	code, _, errOut = run(t, "import", "-c", third, "--in", badFile)
	if code != 1 || !strings.Contains(errOut, "line 2: not a valid export record: not a JSON record") ||
		!strings.Contains(errOut, "imported 1 (0 dead)") || !strings.Contains(errOut, "stopped at line 2") {
		t.Fatalf("stop: %d %q", code, errOut)
	}
	code, _, errOut = run(t, "import", "-c", third, "--in", badFile, "--on-error=skip")
	if code != 1 || !strings.Contains(errOut, "imported 1 (0 dead), replaced 0, skipped 1 known, 2 bad line(s): lines 2, 4") ||
		!strings.Contains(errOut, "line 4: ") {
		t.Fatalf("skip: %d %q", code, errOut)
	}
	if code, _, errOut = run(t, "import", "-c", third, "--in", badFile, "--on-error=maybe"); code != 2 {
		t.Fatalf("--on-error=maybe: %d %q", code, errOut)
	}

	// The shard count recorded in Redis is checked before anything is read
	// or written.
	code, _, errOut = run(t, "import", "-c", cfg("new", 6), "--in", file)
	if code != 1 || !strings.Contains(errOut, "redis.shards is 6") {
		t.Fatalf("other shard count: %d %q", code, errOut)
	}

	for _, c := range []string{"export", "import"} {
		code, out, _ := run(t, c, "--help")
		if code != 0 || !strings.Contains(out, "delaybridge "+c+" -c") {
			t.Errorf("%s --help lacks an example: %q", c, out)
		}
	}
}
