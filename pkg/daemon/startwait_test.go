package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/daemon"
)

// waitLine is the WARN of a start that waits for Redis.
const waitLine = "redis: not ready at start; trying again"

// A start during a failover (the master answers nothing, as a SIGSTOPped
// or cut-off one does) waits for Redis instead of exiting, saying so, and
// runs once Redis answers; a start refused for what does not pass by
// itself (credentials Redis does not take) fails at once; a stop while it
// waits ends the start as a stop (context.Canceled), not a failure.
func TestStartWaitsForARedisPassingThrough(t *testing.T) {
	rs := testenv.Redis(t)
	px := testenv.NewProxy(t, rs.Addr)
	ns := testenv.NATS(t)
	parse := func(extra string) *config.Config {
		cfg, err := config.Parse(fmt.Appendf(nil, `
redis: {addr: "%s", key_prefix: p, shards: 2, dial_timeout: 300ms, read_timeout: 300ms%s}
admin: {listen: "127.0.0.1:0"}
sinks: [{name: s, nats: {url: "%s"}}]
`, px.Addr, extra, ns.URL), func(string) (string, bool) { return "", false })
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	start := func(ctx context.Context, cfg *config.Config, logs *syncBuffer) <-chan error {
		made := make(chan error, 1)
		go func() {
			d, err := daemon.New(ctx, cfg, slog.New(slog.NewTextHandler(logs, nil)))
			if err != nil {
				made <- err
				return
			}
			runCtx, stop := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- d.Run(runCtx) }()
			t.Cleanup(func() { stop(); <-done })
			// Ready means Redis and the sink answer.
			testenv.Eventually(t, 20*time.Second, func() bool {
				if a := d.AdminAddr(); a == "" || strings.HasSuffix(a, ":0") {
					return false
				}
				code, _ := getBody(t, "http://"+d.AdminAddr()+"/readyz")
				return code == http.StatusOK
			}, "ready after Redis answered")
			made <- nil
		}()
		return made
	}

	t.Run("waits through a master that answers nothing", func(t *testing.T) {
		px.Stall()
		var logs syncBuffer
		made := start(context.Background(), parse(""), &logs)
		testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(logs.String(), waitLine) },
			"no WARN that the start waits for Redis")
		px.Flow()
		select {
		case err := <-made:
			if err != nil {
				t.Fatalf("the start failed: %v\nlog:\n%s", err, logs.String())
			}
		case <-time.After(60 * time.Second):
			t.Fatalf("no start within a minute of Redis answering; log:\n%s", logs.String())
		}
	})

	t.Run("a stop while it waits is a stop", func(t *testing.T) {
		px.Stall()
		defer px.Flow()
		var logs syncBuffer
		ctx, stop := context.WithCancel(context.Background())
		made := start(ctx, parse(""), &logs)
		testenv.Eventually(t, 20*time.Second, func() bool { return strings.Contains(logs.String(), waitLine) },
			"no WARN that the start waits for Redis")
		stop()
		if err := <-made; !errors.Is(err, context.Canceled) {
			t.Fatalf("stopped while waiting: %v, want an error wrapping context.Canceled", err)
		}
	})

	t.Run("start_timeout 0 fails at once", func(t *testing.T) {
		px.Stall()
		defer px.Flow()
		var logs syncBuffer
		err := <-start(context.Background(), parse(`, start_timeout: 0s`), &logs)
		if err == nil || !strings.Contains(err.Error(), "is Redis running") {
			t.Fatalf("start_timeout 0 with Redis answering nothing: %v, want the start to fail saying what to check", err)
		}
		if strings.Contains(logs.String(), waitLine) {
			t.Errorf("the start waited with start_timeout 0:\n%s", logs.String())
		}
	})

	t.Run("credentials fail at once", func(t *testing.T) {
		var logs syncBuffer
		err := <-start(context.Background(), parse(`, username: nobody, password: "not-this-one"`), &logs)
		if err == nil || !strings.Contains(err.Error(), "credentials") {
			t.Fatalf("credentials Redis does not take: %v, want the start to fail saying to check the credentials", err)
		}
		if strings.Contains(logs.String(), waitLine) {
			t.Errorf("the start waited for a refusal that does not pass by itself:\n%s", logs.String())
		}
	})
}
