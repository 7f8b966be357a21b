package dev

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// syncBuffer is a bytes.Buffer safe for the printer and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}
func (s *syncBuffer) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// The quickstart end to end: the welcome message (5 s delay) fires and is
// printed. Run with the in-process Redis a machine without redis-server
// gets, the harder case (it reads no Lua script flags).
func TestDevFiresWithTheInProcessRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server: the fallback
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Options{Dir: t.TempDir(), Out: out, Log: daemon.NewLogger(config.Log{Level: "error", Format: "text"}, out), SelfPath: "delaybridge"})
	}()
	if !testenv.Poll(30*time.Second, func() bool { return strings.Contains(out.String(), `body="hello from delaybridge"`) }) {
		cancel()
		t.Fatalf("the welcome message did not fire; output:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "miniredis") {
		t.Errorf("no warning about the in-process Redis:\n%s", out.String())
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("dev stopped with %v", err)
	}
}
