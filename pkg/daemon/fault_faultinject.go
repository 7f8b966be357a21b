//go:build faultinject

package daemon

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/delaybridge/delaybridge/pkg/scheduler"
	"github.com/delaybridge/delaybridge/pkg/sinks"
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

// FaultStampPublishEnv names the environment variable that, in a
// faultinject binary, adds a header of that name to every message a sink
// publishes: the wall clock in Unix nanoseconds as the sink's Publish
// began. It tells when this process began a publish from when its broker
// stored the message, which a broker slow to store it (or a client that
// sends its buffer when a paused process resumes) puts later.
const FaultStampPublishEnv = "DELAYBRIDGE_FAULT_STAMP_PUBLISH"

// faultSink is s with its publishes stamped by FaultStampPublishEnv.
func faultSink(s sinks.Sink, log *slog.Logger) sinks.Sink {
	name := os.Getenv(FaultStampPublishEnv)
	if name == "" {
		return s
	}
	log.Warn("faultinject: every published message carries the time its publish began", "header", name)
	st := stamped{Sink: s, header: name}
	if _, ok := s.(sinks.Prober); ok {
		return stampedProber{st}
	}
	return st
}

type stamped struct {
	sinks.Sink
	header string
}

func (s stamped) Publish(ctx context.Context, msgs []sinks.Outgoing) []error {
	at := strconv.FormatInt(time.Now().UnixNano(), 10)
	out := make([]sinks.Outgoing, len(msgs))
	for i, o := range msgs {
		m := *o.Message
		m.Headers = append(m.Headers[:len(m.Headers):len(m.Headers)], envelope.Header{Key: s.header, Value: at})
		out[i] = sinks.Outgoing{Message: &m, Attempt: o.Attempt}
	}
	return s.Sink.Publish(ctx, out)
}

// Ready is the sink's own.
func (s stamped) Ready() error {
	if r, ok := s.Sink.(sinks.Ready); ok {
		return r.Ready()
	}
	return nil
}

// stampedProber is stamped for a sink that can be probed.
type stampedProber struct{ stamped }

func (s stampedProber) Probe(ctx context.Context) error { return s.Sink.(sinks.Prober).Probe(ctx) }
