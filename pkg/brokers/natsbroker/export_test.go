package natsbroker

import (
	"time"

	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// StandingFloor is the acknowledgement floor a JetStream Source would
// create its consumer again after, for tests.
func StandingFloor(src ingest.Source) uint64 {
	st := &src.(*Source).stood
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.floor
}

// Classify is the Sink's reading of a publish error, for tests.
func Classify(err error) error { return (&Sink{cfg: SinkParams{Name: "t"}}).classify("", err) }

// RecreateStreamAfter is how long a stream deleted under a running ingest
// is left to its deletion, for tests.
const RecreateStreamAfter = recreateStreamAfter
const PullExpiry = pullExpiry

// WithMaxPending returns p with the PubAcks a sink awaits at most set to
// n, for tests.
func WithMaxPending(p SinkParams, n int) SinkParams {
	p.maxPending = n
	return p
}

// PublishTimeoutOf is the time a Sink waits for a PubAck at most, for
// tests.
func PublishTimeoutOf(s any) time.Duration { return s.(*Sink).cfg.PublishTimeout }
