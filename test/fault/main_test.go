//go:build fault

// Package fault runs the real delaybridge binary against real servers started
// on loopback (redis-server, embedded nats-server, kfake) and injects the
// failures operators see: the daemon killed with SIGKILL, the sink broker gone
// for 10 s, each kind of sink broker (NATS, RabbitMQ, Kafka) stopped for longer
// than the whole retry budget, the ingest broker restarted, Redis restarted or
// killed, Redis unreachable while messages arrive, the network to Redis cut, a
// Sentinel failover, SIGTERM under load and while Redis is down, one of two
// daemons killed, daemons whose own clock is 5 minutes off, and the
// dead-letter sink down while messages die. Every scenario sends thousands of messages with delays of
// 0-5 s, records every ID sent and every copy the sink stored (with the sink's
// timestamp), and checks: nothing lost, duplicates no more than what was in
// flight at the fault.
//
// It is behind the build tag "fault" so that `go test ./...` (CI) skips it:
//
//	make fault
//	go test -tags fault -count=1 -timeout 20m -v ./test/fault/ -args -report ../../docs/reliability.md
//
// With -report it replaces the generated section of that markdown file
// (between the fault markers) with the results table; -seed repeats a run's
// random choices (delays, kill moments).
package fault

import (
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/delaybridge/delaybridge/internal/testenv"
)

var (
	flagReport = flag.String("report", "", "markdown file whose generated section (between fault markers) is replaced with the results, e.g. ../../docs/reliability.md; empty: do not write")
	flagSeed   = flag.Uint64("seed", 0, "seed of the random choices (delays, kill moments); 0: from the clock")
	flagScale  = flag.Float64("scale", 1, "multiplies every scenario's message count (e.g. 0.3 for a quick run)")
)

var suiteStart time.Time

func TestMain(m *testing.M) {
	flag.Parse()
	if *flagSeed == 0 {
		*flagSeed = uint64(time.Now().UnixNano())
	}
	fmt.Printf("fault suite: seed %d (repeat with -args -seed %d)\n", *flagSeed, *flagSeed)
	suiteStart = time.Now()
	code := testenv.Main(m)
	wall := time.Since(suiteStart)
	fmt.Printf("\nfault suite: wall time %s\n%s\n", wall.Round(time.Second), renderTable())
	if *flagReport != "" {
		if err := writeReport(*flagReport, wall); err != nil {
			fmt.Fprintf(os.Stderr, "fault: writing %s: %v\n", *flagReport, err)
			if code == 0 {
				code = 1
			}
		} else {
			fmt.Printf("fault suite: results written to %s\n", *flagReport)
		}
	}
	os.Exit(code)
}
