//go:build bench

package bench

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

var (
	flagTransferN       = flag.Int("transfer-n", 1_000_000, "messages of TestExportImport")
	flagTransferCluster = flag.Bool("transfer-cluster", true, "TestExportImport: import into a 3-master Redis Cluster too")
)

// TestExportImport parks -transfer-n messages of about 100 bytes in a Redis
// with 16 shards, exports them with the real binary (delaybridge export),
// imports the file into another Redis with 5 shards and another key prefix,
// then again (idempotent: nothing imported), and into a 3-master Redis
// Cluster with 7 shards; it checks the counts and a sample of messages field
// by field, and reports the time and peak RSS (getrusage maxrss of the
// child) of each command.
//
//	go test -tags bench -run TestExportImport -timeout 30m -v ./test/bench/
func TestExportImport(t *testing.T) {
	ctx := context.Background()
	n := *flagTransferN
	bin := testenv.Build(t)
	dir := t.TempDir()
	src := testenv.Redis(t)
	dst := testenv.Redis(t)
	config := func(name, redisYAML string) string {
		p := filepath.Join(dir, name+".yaml")
		text := fmt.Sprintf("redis: %s\nsinks: [{name: out, nats: {url: \"nats://127.0.0.1:4222\"}}]\n", redisYAML)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	srcStore := store.New(src.Client(), store.Options{Prefix: "old", Shards: 16})
	srcCfg := config("src", fmt.Sprintf("{addr: %q, key_prefix: old, shards: 16}", src.Addr))

	base := time.Now().Add(24 * time.Hour).Truncate(time.Millisecond)
	start := time.Now()
	parkMany(t, srcStore, n, base)
	t.Logf("parked %d messages in %v", n, time.Since(start).Round(time.Millisecond))

	file := filepath.Join(dir, "parked.jsonl")
	res := runMeasured(t, bin, "export", "-c", srcCfg, "--out", file)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("export (16 shards, single Redis) to a %.0f MB file: %s", float64(fi.Size())/1e6, res)
	want := fmt.Sprintf("exported %d (0 dead)", n)
	if !strings.Contains(res.stderr, want) {
		t.Fatalf("export: %q, want %q", res.stderr, want)
	}

	type target struct {
		name  string
		cfg   string
		store *store.Store
	}
	targets := []target{{"single Redis, 5 shards, prefix new", config("dst", fmt.Sprintf("{addr: %q, key_prefix: new, shards: 5}", dst.Addr)),
		store.New(dst.Client(), store.Options{Prefix: "new", Shards: 5})}}
	if *flagTransferCluster {
		cl := testenv.RedisCluster(t, 3)
		targets = append(targets, target{"Redis Cluster of 3 masters, 7 shards", config("cluster", fmt.Sprintf("{cluster: true, addrs: [%q], key_prefix: cl, shards: 7}", cl.Addrs[0])),
			store.New(cl.Client(), store.Options{Prefix: "cl", Shards: 7})})
	}
	for i, tg := range targets {
		res := runMeasured(t, bin, "import", "-c", tg.cfg, "--in", file)
		t.Logf("import into %s: %s", tg.name, res)
		if want := fmt.Sprintf("imported %d (0 dead), replaced 0, skipped 0 known, 0 bad line(s)", n); !strings.Contains(res.stderr, want) {
			t.Fatalf("import: %q, want %q", res.stderr, want)
		}
		st, err := tg.store.Stats(ctx)
		if err != nil || st.Parked != int64(n) {
			t.Fatalf("%s: %d parked (%v), want %d", tg.name, st.Parked, err, n)
		}
		compareSample(t, srcStore, tg.store, n, 2000)
		if i == 0 {
			res := runMeasured(t, bin, "import", "-c", tg.cfg, "--in", file)
			t.Logf("import again into %s: %s", tg.name, res)
			if want := fmt.Sprintf("imported 0 (0 dead), replaced 0, skipped %d known", n); !strings.Contains(res.stderr, want) {
				t.Fatalf("second import: %q, want %q", res.stderr, want)
			}
		}
	}
}

// benchMessage is message i of TestExportImport: about 100 bytes of body,
// a header, and every few messages a key, a priority or a group.
func benchMessage(i int, base time.Time) *envelope.Message {
	id := fmt.Sprintf("m-%07d", i)
	body := []byte(strings.Repeat(id, 12)[:100])
	m := &envelope.Message{ID: id, DueAt: base.Add(time.Duration(i%86_400_000) * time.Millisecond), Sink: "out",
		Destination: "fired.bench", Ingest: "in", IngestedAt: base.Add(-24 * time.Hour), Body: body,
		Headers: envelope.Headers{{Key: "trace", Value: id}}}
	if i%3 == 0 {
		m.Key = []byte(id)
	}
	if i%10 == 0 {
		m.Priority = uint8(i / 10 % 10)
	}
	if i%7 == 0 {
		m.Group = fmt.Sprintf("g-%d", i%100)
	}
	return m
}

// parkMany parks n messages with store.Park, batches of 1000 on two
// connections.
func parkMany(t *testing.T, s *store.Store, n int, base time.Time) {
	const batch, workers = 1000, 2
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := make([]*envelope.Message, 0, batch)
			for lo := w * batch; lo < n; lo += workers * batch {
				msgs = msgs[:0]
				for i := lo; i < min(lo+batch, n); i++ {
					msgs = append(msgs, benchMessage(i, base))
				}
				if _, err := s.Park(context.Background(), msgs); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// compareSample compares k messages spread over the n parked, field by
// field, in both stores.
func compareSample(t *testing.T, a, b *store.Store, n, k int) {
	t.Helper()
	ctx := context.Background()
	for j := range k {
		id := fmt.Sprintf("m-%07d", j*n/k)
		x, err := a.Inspect(ctx, id)
		if err != nil {
			t.Fatalf("source %s: %v", id, err)
		}
		y, err := b.Inspect(ctx, id)
		if err != nil {
			t.Fatalf("target %s: %v", id, err)
		}
		if !reflect.DeepEqual(x.Message, y.Message) || x.State != y.State || !x.NextAt.Equal(y.NextAt) || x.Attempts != y.Attempts {
			t.Fatalf("%s differs:\n source %+v %+v\n target %+v %+v", id, x, x.Message, y, y.Message)
		}
	}
}

type measured struct {
	wall    time.Duration
	maxRSS  int64 // KiB
	cpu     time.Duration
	stderr  string
	command string
}

func (m measured) String() string {
	return fmt.Sprintf("%v wall, %v CPU, peak RSS %.1f MiB (%s)", m.wall.Round(time.Millisecond), m.cpu.Round(time.Millisecond),
		float64(m.maxRSS)/1024, strings.TrimSpace(m.stderr))
}

// runMeasured runs the binary to its end and returns its wall time, CPU
// time and peak RSS (getrusage of the child: ru_maxrss, KiB on Linux).
func runMeasured(t *testing.T, bin string, args ...string) measured {
	t.Helper()
	cmd := exec.Command(bin, args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	m := measured{wall: time.Since(start), stderr: stderr.String(), command: strings.Join(args, " ")}
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", bin, m.command, err, m.stderr)
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	m.maxRSS = ru.Maxrss
	m.cpu = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	return m
}
