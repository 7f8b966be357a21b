package natsbroker

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/delaybridge/delaybridge/pkg/ingest"
)

// Send publishes one message to the ingest's subject, as a publisher would
// (for `delaybridge send`). A subject with wildcards is made concrete by
// replacing '*' and '>' with "send". With JetStream it waits for the PubAck
// and returns the time the stream stored the message with, the one the
// daemon counts a delay from (asked of the stream: zero when the account
// may not read it); core NATS records none: zero.
func Send(ctx context.Context, cfg SourceParams, p ingest.Publication) (time.Time, error) {
	subject := p.Subject
	if subject == "" {
		subject = ConcreteSubject(cfg.Subject)
	}
	nc, err := nats.Connect(cfg.URL, append([]nats.Option{nats.Name("delaybridge send")}, cfg.Options...)...)
	if err != nil {
		return time.Time{}, fmt.Errorf("connect to nats: %w", err)
	}
	defer nc.Close()
	msg := nats.NewMsg(subject)
	msg.Data = p.Body
	for _, kv := range p.Headers {
		msg.Header.Add(kv.Key, kv.Value)
	}
	if cfg.Stream == "" {
		if err := nc.PublishMsg(msg); err != nil {
			return time.Time{}, err
		}
		return time.Time{}, Flush(ctx, nc) // a CLI context has no deadline
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return time.Time{}, err
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return time.Time{}, fmt.Errorf("publish to %s (is delaybridge or the stream %s there?): %w", subject, cfg.Stream, err)
	}
	return storedAt(ctx, js, ack), nil
}

// storedAt returns the time the stream of ack stored its message with
// (the JetStream message time the daemon reads), zero when the stream does
// not answer within a second.
func storedAt(ctx context.Context, js jetstream.JetStream, ack *jetstream.PubAck) time.Time {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := js.Stream(ctx, ack.Stream)
	if err != nil {
		return time.Time{}
	}
	m, err := st.GetMsg(ctx, ack.Sequence)
	if err != nil {
		return time.Time{}
	}
	return m.Time
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
