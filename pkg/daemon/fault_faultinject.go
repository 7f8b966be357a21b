//go:build faultinject

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/scheduler"
)

// FaultClockSkewEnv names the environment variable that, in a binary built
// with the tag faultinject (the fault suite's, never a release), skews this
// process's own clock by a Go duration ("5m", "-5m"). Go reads the kernel's
// vDSO clock, so no outside tool (libfaketime) can skew it; this hook is how
// the suite runs a daemon whose clock is wrong.
const FaultClockSkewEnv = "DELAYBRIDGE_FAULT_CLOCK_SKEW"

// localClock is the wall clock plus the skew of FaultClockSkewEnv.
func localClock() (now func() time.Time, sched scheduler.Clock, skew time.Duration) {
	v := os.Getenv(FaultClockSkewEnv)
	if v == "" {
		return time.Now, scheduler.SystemClock{}, 0
	}
	skew, err := time.ParseDuration(v)
	if err != nil {
		// A test-only build: a typo must not pass as "no skew".
		panic(fmt.Sprintf("%s=%q: %v", FaultClockSkewEnv, v, err))
	}
	c := skewedClock{skew: skew}
	return c.Now, c, skew
}

// skewedClock is the wall clock off by skew; Add moves the monotonic
// reading too, so differences with unskewed readings show the skew.
type skewedClock struct {
	scheduler.SystemClock
	skew time.Duration
}

func (c skewedClock) Now() time.Time { return time.Now().Add(c.skew) }

// FaultHoldAcksEnv names the environment variable that, in a faultinject
// binary, holds every ingest acknowledgement for a Go duration ("5s")
// before it goes to the broker: a test kills the daemon within it to stop
// it between parking a message and acknowledging it.
const FaultHoldAcksEnv = "DELAYBRIDGE_FAULT_HOLD_ACKS"

// faultSource is src with its acknowledgements held by FaultHoldAcksEnv.
func faultSource(src ingest.Source, log *slog.Logger) ingest.Source {
	v := os.Getenv(FaultHoldAcksEnv)
	if v == "" {
		return src
	}
	hold, err := time.ParseDuration(v)
	if err != nil {
		panic(fmt.Sprintf("%s=%q: %v", FaultHoldAcksEnv, v, err))
	}
	log.Warn("faultinject: ingest acknowledgements are held on purpose", "hold", hold)
	return heldAcks{Source: src, hold: hold}
}

type heldAcks struct {
	ingest.Source
	hold time.Duration
}

func (h heldAcks) Read(ctx context.Context) (*envelope.Incoming, ingest.AckFunc, error) {
	in, ack, err := h.Source.Read(ctx)
	if err != nil {
		return in, ack, err
	}
	return in, func(_ context.Context, err error) error {
		time.AfterFunc(h.hold, func() { _ = ack(context.Background(), err) })
		return nil
	}, nil
}

// Ready is the source's own.
func (h heldAcks) Ready() error {
	if r, ok := h.Source.(ingest.Ready); ok {
		return r.Ready()
	}
	return nil
}
