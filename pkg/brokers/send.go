package brokers

import (
	"context"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/pkg/config"
	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// SendRequest is one message for `delaybridge send`.
type SendRequest struct {
	Ingest  string
	Delay   string // x-delay value, or ""
	At      string // x-deliver-at value, or ""
	ID      string // x-message-id value, or ""
	Headers envelope.Headers
	Body    []byte
	Key     []byte // Kafka only: the record key
	Subject string // NATS only: the subject to publish to (default: the ingest's, wildcards replaced)
}

// DueAfter is when a message sent with delay d is due, computed as the
// daemon computes it (pkg/envelope): d after at, its publish time as the
// broker recorded it (Send's), rounded up to the millisecond (never
// early). Where the broker records none (at is zero) the daemon counts
// from when it reads the message: due is then d after now rounded up to
// the millisecond, as the daemon reads its clock, and estimate is true.
func DueAfter(at time.Time, d time.Duration, now time.Time) (due time.Time, estimate bool) {
	base := at
	if at.IsZero() {
		base, estimate = envelope.CeilMillis(now), true
	}
	return envelope.CeilMillis(base.Add(d)), estimate
}

// Send publishes a message with the delay headers to an ingest's broker, the
// way an application would. It returns the message's publish time as the
// broker records it, which a delay counts from, or the zero time where the
// broker records none precisely (Ingest.Send).
func Send(ctx context.Context, cfg *config.Config, r SendRequest) (time.Time, error) {
	var ic *config.Ingest
	for i := range cfg.Ingest {
		if cfg.Ingest[i].Name == r.Ingest {
			ic = &cfg.Ingest[i]
		}
	}
	if ic == nil {
		names := make([]string, len(cfg.Ingest))
		for i, in := range cfg.Ingest {
			names[i] = in.Name
		}
		return time.Time{}, fmt.Errorf("no ingest named %q in the configuration (ingests: %v)", r.Ingest, names)
	}
	if r.Delay != "" && r.At != "" {
		return time.Time{}, fmt.Errorf("give --delay or --at, not both")
	}
	h := make(envelope.Headers, 0, len(r.Headers)+3)
	if r.Delay != "" {
		if _, reason := envelope.ParseDelay(r.Delay); reason != "" {
			return time.Time{}, fmt.Errorf("--delay: %s", reason)
		}
		h = append(h, envelope.Header{Key: envelope.HeaderDelay, Value: r.Delay})
	}
	if r.At != "" {
		if _, reason := envelope.ParseDeliverAt(r.At); reason != "" {
			return time.Time{}, fmt.Errorf("--at: %s", reason)
		}
		h = append(h, envelope.Header{Key: envelope.HeaderDeliverAt, Value: r.At})
	}
	if r.ID != "" {
		h = append(h, envelope.Header{Key: envelope.HeaderMessageID, Value: r.ID})
	}
	h = append(h, r.Headers...)
	b, err := ingestOf(ic)
	if err != nil {
		return time.Time{}, err
	}
	at, err := b.Send(ctx, ic, ingest.Publication{Headers: h, Body: r.Body, Key: r.Key, Subject: r.Subject})
	if err != nil {
		return time.Time{}, fmt.Errorf("ingest %s: %w", ic.Name, err)
	}
	return at, nil
}
