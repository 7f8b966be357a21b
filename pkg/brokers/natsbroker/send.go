package natsbroker

import (
	"context"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// Send publishes one message to the ingest's subject, as a publisher would
// (for `delaybridge send`). A subject with wildcards is made concrete by
// replacing '*' and '>' with "send". With JetStream it waits for the PubAck.
func Send(ctx context.Context, cfg SourceParams, p ingest.Publication) error {
	subject := p.Subject
	if subject == "" {
		subject = ConcreteSubject(cfg.Subject)
	}
	nc, err := nats.Connect(cfg.URL, append([]nats.Option{nats.Name("delaybridge send")}, cfg.Options...)...)
	if err != nil {
		return fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	msg := nats.NewMsg(subject)
	msg.Data = p.Body
	for _, kv := range p.Headers {
		msg.Header.Add(kv.Key, kv.Value)
	}
	if cfg.Stream == "" {
		if err := nc.PublishMsg(msg); err != nil {
			return err
		}
		return Flush(ctx, nc) // a CLI context has no deadline
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("publish to %s (is delaybridge or the stream %s there?): %w", subject, cfg.Stream, err)
	}
	return nil
}

// ConcreteSubject replaces the wildcard tokens of a subscription subject.
func ConcreteSubject(subject string) string {
	toks := strings.Split(subject, ".")
	for i, t := range toks {
		if t == "*" || t == ">" {
			toks[i] = "send"
		}
	}
	return strings.Join(toks, ".")
}
