package logrepeat

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// A flood of one key logs its first occurrence; the others within the
// interval are counted, and the count comes with the key's next line, or
// from Due once the interval ended. The time is the caller's (an injected
// clock): nothing here waits.
func TestOneLinePerKeyPerInterval(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := New[int](10*time.Second, 100)

	logged := 0
	for i := range 1000 {
		if ok, quiet := l.Allow("rabbit/nowhere", t0.Add(time.Duration(i)*time.Millisecond), i); ok {
			logged++
			if quiet != 0 {
				t.Errorf("the first line says %d not logged, want 0", quiet)
			}
		}
	}
	if logged != 1 {
		t.Fatalf("%d lines for 1000 occurrences within the interval, want 1", logged)
	}
	if ok, _ := l.Allow("rabbit/other", t0.Add(time.Second), 0); !ok {
		t.Error("another key waited for the first's interval")
	}
	if due, _ := l.Due(t0.Add(9 * time.Second)); len(due) != 0 {
		t.Errorf("Due before the interval ended: %+v", due)
	}

	due, other := l.Due(t0.Add(10 * time.Second))
	if len(due) != 1 || due[0].Key != "rabbit/nowhere" || due[0].Quiet != 999 || due[0].Last != 999 || other != 0 {
		t.Fatalf("Due at the interval's end: %+v, other %d; want rabbit/nowhere with 999 not logged and the last value", due, other)
	}
	// The summary was a line: the interval starts over from it.
	if ok, _ := l.Allow("rabbit/nowhere", t0.Add(11*time.Second), 0); ok {
		t.Error("logged again one second after the summary line")
	}
	// The first occurrence after the interval logs, with the count since.
	if ok, quiet := l.Allow("rabbit/nowhere", t0.Add(20*time.Second), 0); !ok || quiet != 1 {
		t.Errorf("after the interval: logged %v with %d not logged, want true with 1", ok, quiet)
	}
	// rabbit/other was quiet for its whole interval: forgotten.
	if due, _ := l.Due(t0.Add(30 * time.Second)); len(due) != 0 {
		t.Errorf("Due with nothing kept quiet: %+v", due)
	}
	if n := l.Len(); n != 0 {
		t.Errorf("%d keys remembered after every interval ended quietly, want 0", n)
	}
}

// However many keys fail, the Limiter remembers at most its bound: the
// least recently seen key goes, and what it kept quiet is handed by Due as
// other, never lost.
func TestKeysAreBounded(t *testing.T) {
	t0 := time.Unix(1_700_000_000, 0)
	l := New[string](time.Minute, 3)
	for i := range 10 {
		key := fmt.Sprintf("dest-%d", i)
		l.Allow(key, t0, key)
		l.Allow(key, t0, key) // one kept quiet per key
	}
	if n := l.Len(); n != 3 {
		t.Fatalf("%d keys remembered, want the bound, 3", n)
	}
	due, other := l.Due(t0.Add(time.Minute))
	if len(due) != 3 || other != 7 {
		t.Fatalf("Due: %d summaries and %d other, want 3 (the keys kept) and 7 (one per key evicted)", len(due), other)
	}
	for _, s := range due {
		if s.Key < "dest-7" || s.Quiet != 1 {
			t.Errorf("summary %+v: want one of the three most recent keys, 1 not logged", s)
		}
	}
	if _, other := l.Due(t0.Add(2 * time.Minute)); other != 0 {
		t.Errorf("other handed twice: %d", other)
	}
}

// A Warner logs the first line of a key, counts the others, and sums them
// up once the interval ended; Run does that at its end too.
func TestWarner(t *testing.T) {
	var b strings.Builder
	w := NewWarner(slog.New(slog.NewTextHandler(&b, nil)), "publish failed", time.Minute, 8)
	t0 := time.Unix(1000, 0)
	for i := range 3 {
		w.Warn("k", t0.Add(time.Duration(i)*time.Second), "i", i)
	}
	w.Flush(t0.Add(30 * time.Second)) // the interval has not ended
	if n := strings.Count(b.String(), `msg="publish failed"`); n != 1 || strings.Contains(b.String(), "repeats") {
		t.Fatalf("after 3 lines of one key in the interval:\n%s", b.String())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	w.Run(ctx, func() time.Time { return t0.Add(time.Second) }) // ends at once, summing up
	if !strings.Contains(b.String(), `msg="publish failed (repeats)" i=2 not_logged=2 within=1m0s`) {
		t.Fatalf("no summary of the 2 not logged:\n%s", b.String())
	}
}
