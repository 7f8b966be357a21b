package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// Redis CPU (INFO commandstats usec of EVALSHA) per message, per phase.
func TestProbePhases(t *testing.T) {
	ctx := context.Background()
	r := testenv.Redis(t)
	c := r.Client()
	s := New(c, Options{Prefix: "p", Shards: 1, DedupeWindow: 2 * time.Minute})
	usec := func() float64 {
		for _, l := range strings.Split(c.Info(ctx, "commandstats").Val(), "\n") {
			if strings.HasPrefix(l, "cmdstat_evalsha:") {
				for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(l, "cmdstat_evalsha:")), ",") {
					if v, ok := strings.CutPrefix(f, "usec="); ok {
						x, _ := strconv.ParseFloat(v, 64)
						return x
					}
				}
			}
		}
		return 0
	}
	const n, batch = 20000, 100
	now := time.Now()
	phase := func(name string, do func()) {
		c.ConfigResetStat(ctx)
		start := time.Now()
		do()
		fmt.Printf("%-8s %6.2f us/msg in Redis, %6.2f us/msg wall\n", name, usec()/n, float64(time.Since(start).Microseconds())/n)
	}
	phase("park", func() {
		for i := 0; i < n; i += batch {
			var ms []*envelope.Message
			for j := i; j < i+batch; j++ {
				m := &envelope.Message{ID: fmt.Sprintf("m%07d", j), DueAt: now.Add(300 * time.Millisecond).Truncate(time.Millisecond), Sink: "s", Destination: "d.x", Body: make([]byte, 100),
					Origin: envelope.Origin{Log: "STREAM", Pos: uint64(j + 1)}}
				ms = append(ms, m)
			}
			if _, err := s.Park(ctx, ms); err != nil {
				t.Fatal(err)
			}
		}
	})
	var leases []*Lease
	phase("claim", func() {
		for range n / batch {
			l, err := s.ClaimAhead(ctx, 0, nil, nil, Ask{Max: batch, Lease: time.Minute, Ahead: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			leases = append(leases, l)
		}
	})
	testenv.Eventually(t, 5*time.Second, func() bool { return time.Now().After(now.Add(310 * time.Millisecond)) })
	phase("commit", func() {
		for _, l := range leases {
			if _, _, err := s.Commit(ctx, l, l.Messages, nil); err != nil {
				t.Fatal(err)
			}
		}
	})
	phase("ack", func() {
		for _, l := range leases {
			var ds []Done
			for _, m := range l.Messages {
				ds = append(ds, Done{ID: m.ID, Origin: m.Message.Origin})
			}
			if _, err := s.Ack(ctx, l, ds); err != nil {
				t.Fatal(err)
			}
		}
	})
	info := c.Info(ctx, "memory").Val()
	_ = info
}
