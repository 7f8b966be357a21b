package admin

import (
	"bytes"
	"context"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// A second status written through the recorder (an error met after the
// answer began) is dropped without Go's "superfluous
// response.WriteHeader" line, and the first is what the client gets and
// the request log says.
func TestRecorderDropsASecondStatus(t *testing.T) {
	var mu sync.Mutex
	var logged bytes.Buffer
	var rec *recorder
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		rec = &recorder{ResponseWriter: w}
		rec.WriteHeader(http.StatusOK)
		_, _ = rec.Write([]byte("{}"))
		rec.WriteHeader(http.StatusInternalServerError)
	}))
	srv.Config.ErrorLog = log.New(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logged.Write(p)
	}), "", 0)
	srv.Start()
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	srv.Close() // the handler and its logging are done
	mu.Lock()
	defer mu.Unlock()
	if resp.StatusCode != http.StatusOK || rec.status != http.StatusOK || strings.Contains(logged.String(), "superfluous") {
		t.Fatalf("status %d, recorded %d, server log %q", resp.StatusCode, rec.status, logged.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// Failed requests are logged once per method and status per
// log.repeat_interval, and the repeats summed up: a Redis that does not
// answer, or a backlog of requests whose clients gave up, is a line per
// interval, not one per request.
func TestFailedRequestsAreLoggedOncePerInterval(t *testing.T) {
	r := testenv.Redis(t)
	rdb := redis.NewClient(&redis.Options{Addr: r.Client().Options().Addr, MaxRetries: -1}) // a failure at once
	t.Cleanup(func() { _ = rdb.Close() })
	st := store.New(rdb, store.Options{Prefix: "f", Shards: 2})
	var logs testenv.Output
	s := New(Params{Listen: "127.0.0.1:0", Store: st, RepeatInterval: time.Hour,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	r.Kill() // every request that reads Redis fails now
	for range 5 {
		resp, err := http.Get("http://" + s.Addr() + "/v1/stats")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 500 {
			t.Fatalf("GET /v1/stats without Redis: %d", resp.StatusCode)
		}
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := logs.String()
	if n := strings.Count(out, `msg="admin request failed"`); n != 1 || !strings.Contains(out, `msg="admin request failed (repeats)"`) || !strings.Contains(out, "not_logged=4") {
		t.Fatalf("%d lines for 5 failed requests, want 1 and a summary of 4:\n%s", n, out)
	}
}
