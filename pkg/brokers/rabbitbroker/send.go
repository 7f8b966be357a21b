package rabbitbroker

import (
	"context"
	"errors"
	"fmt"

	"github.com/delaybridge/delaybridge/pkg/ingest"
	amqp "github.com/rabbitmq/amqp091-go"
)

// Send publishes one persistent message to cfg.Queue through the default
// exchange, as a publisher would (for `delaybridge send`), and waits for the
// broker's publisher confirm. p.Headers become the AMQP headers (string
// values; of duplicate keys the first wins). The publish is mandatory: when
// no queue of that name exists the broker returns the message and Send
// fails. The other fields of cfg are not used.
func Send(ctx context.Context, cfg SourceParams, p ingest.Publication) error {
	queue, h, body := cfg.Queue, p.Headers, p.Body
	conn, err := Dial(ctx, cfg.URL, "delaybridge send", cfg.Auth)
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("rabbitmq: open channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("rabbitmq: confirm mode: %w", err)
	}
	returns := ch.NotifyReturn(make(chan amqp.Return, 1))
	table := make(amqp.Table, len(h))
	for _, kv := range h {
		if len(kv.Key) > 255 {
			return fmt.Errorf("rabbitmq: header name %.40q... is longer than 255 bytes", kv.Key)
		}
		if _, dup := table[kv.Key]; !dup {
			table[kv.Key] = kv.Value
		}
	}
	dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, true, false, amqp.Publishing{
		Headers:      table,
		Body:         body,
		DeliveryMode: amqp.Persistent,
	})
	if err != nil {
		return fmt.Errorf("rabbitmq: publish to queue %q: %w", queue, err)
	}
	acked, err := dc.WaitContext(ctx)
	if err != nil {
		return fmt.Errorf("rabbitmq: no confirm for the publish to queue %q: %w", queue, err)
	}
	// A return is sent before the confirm of its message, and amqp091-go
	// hands it to the returns channel before it handles the confirm.
	select {
	case r, ok := <-returns:
		if !ok {
			return fmt.Errorf("rabbitmq: channel closed before the publish to queue %q was confirmed", queue)
		}
		return fmt.Errorf("rabbitmq: queue %q does not exist (message returned: %d %s); is delaybridge running with this ingest?",
			queue, r.ReplyCode, r.ReplyText)
	default:
	}
	if !acked {
		return errors.New("rabbitmq: the broker refused the message (nack)")
	}
	return nil
}
