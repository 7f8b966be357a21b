package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/delaybridge/delaybridge/pkg/ingest"
	"github.com/segmentio/kafka-go"
)

// Send produces one record to cfg.Topic on cfg.Brokers, with cfg.TLS and
// cfg.SASL, with acks=all, and waits for it, as a publisher would (for
// `delaybridge send`). The other fields of cfg are not used. It returns the
// record's timestamp, which it sets (Kafka keeps milliseconds): the time the
// daemon counts a delay from, unless the topic has
// message.timestamp.type=LogAppendTime (the broker's time then, a moment
// later).
func Send(ctx context.Context, cfg SourceParams, p ingest.Publication) (time.Time, error) {
	brokers, topic := cfg.Brokers, cfg.Topic
	tr := &kafka.Transport{ClientID: "delaybridge-send", TLS: cfg.TLS, SASL: cfg.SASL}
	defer tr.CloseIdleConnections()
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        topic,
		Balancer:     kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		MaxAttempts:  3,
		Transport:    tr,
	}
	defer w.Close()
	at := time.UnixMilli(time.Now().UnixMilli())
	msg := kafka.Message{Key: p.Key, Value: p.Body, Time: at}
	for _, kv := range p.Headers {
		msg.Headers = append(msg.Headers, kafka.Header{Key: kv.Key, Value: []byte(kv.Value)})
	}
	if err := w.WriteMessages(ctx, msg); err != nil {
		var we kafka.WriteErrors
		if errors.As(err, &we) && len(we) == 1 {
			err = we[0]
		}
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			return time.Time{}, fmt.Errorf("produce to %s: the topic does not exist on %v: %w", topic, brokers, err)
		}
		// A refused SASL exchange or client certificate reaches the writer
		// as a closed connection: a connection of our own says which.
		var probe func() error
		if cfg.TLS != nil || cfg.SASL != nil {
			probe = func() error {
				d := &kafka.Dialer{Timeout: 10 * time.Second, ClientID: tr.ClientID, TLS: cfg.TLS, SASLMechanism: cfg.SASL}
				return Probe(ctx, d, brokers)
			}
		}
		err = Diagnose(err, probe)
		return time.Time{}, fmt.Errorf("produce to %s on %v: %w", topic, brokers, err)
	}
	return at, nil
}
