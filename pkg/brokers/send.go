package brokers

import (
	"context"
	"fmt"

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

// Send publishes a message with the delay headers to an ingest's broker, the
// way an application would.
func Send(ctx context.Context, cfg *config.Config, r SendRequest) error {
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
		return fmt.Errorf("no ingest named %q in the configuration (ingests: %v)", r.Ingest, names)
	}
	if r.Delay != "" && r.At != "" {
		return fmt.Errorf("give --delay or --at, not both")
	}
	h := make(envelope.Headers, 0, len(r.Headers)+3)
	if r.Delay != "" {
		if _, reason := envelope.ParseDelay(r.Delay); reason != "" {
			return fmt.Errorf("--delay: %s", reason)
		}
		h = append(h, envelope.Header{Key: envelope.HeaderDelay, Value: r.Delay})
	}
	if r.At != "" {
		if _, reason := envelope.ParseDeliverAt(r.At); reason != "" {
			return fmt.Errorf("--at: %s", reason)
		}
		h = append(h, envelope.Header{Key: envelope.HeaderDeliverAt, Value: r.At})
	}
	if r.ID != "" {
		h = append(h, envelope.Header{Key: envelope.HeaderMessageID, Value: r.ID})
	}
	h = append(h, r.Headers...)
	b, err := ingestOf(ic)
	if err != nil {
		return err
	}
	if err := b.Send(ctx, ic, ingest.Publication{Headers: h, Body: r.Body, Key: r.Key, Subject: r.Subject}); err != nil {
		return fmt.Errorf("ingest %s: %w", ic.Name, err)
	}
	return nil
}
