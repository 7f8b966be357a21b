//go:build fault

package fault

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// newKafkaPublisher produces to the topic "delayed" with acks=all, one
// record at a time (a record counts as sent when the cluster acknowledged
// it). kafka-go has no idempotent producer: a resend after a lost
// acknowledgement is a second record, which the daemon parks as a no-op
// (same x-message-id) unless the first copy was already delivered.
func newKafkaPublisher(t *testing.T, name string, brokers []string) *publisher {
	w := &kafka.Writer{
		Addr:         kafka.TCP(brokers...),
		Topic:        "delayed",
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		Balancer:     &kafka.RoundRobin{},
		MaxAttempts:  2,
		WriteTimeout: 2 * time.Second,
		ReadTimeout:  2 * time.Second,
	}
	t.Cleanup(func() { _ = w.Close() })
	p := newPublisher(t, name)
	p.send = func(ctx context.Context, id string, delay time.Duration, at time.Time) error {
		h := kafka.Header{Key: envelope.HeaderDelay, Value: []byte(strconv.FormatInt(delay.Milliseconds(), 10))}
		if !at.IsZero() {
			h = kafka.Header{Key: envelope.HeaderDeliverAt, Value: []byte(strconv.FormatInt(at.UnixMilli(), 10))}
		}
		return w.WriteMessages(ctx, kafka.Message{
			Key:     []byte(id),
			Value:   []byte(id),
			Headers: []kafka.Header{h, {Key: envelope.HeaderMessageID, Value: []byte(id)}},
		})
	}
	return p
}

// kafkaLag returns, for the daemon's group, the records not yet committed
// summed over the partitions of "delayed".
func (w *world) kafkaLag(partitions int) (int64, error) {
	c := &kafka.Client{Addr: kafka.TCP(w.kafka.Brokers...), Timeout: 3 * time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	parts := make([]int, partitions)
	reqs := make([]kafka.OffsetRequest, partitions)
	for i := range parts {
		parts[i] = i
		reqs[i] = kafka.LastOffsetOf(i)
	}
	committed, err := c.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: "delaybridge", Topics: map[string][]int{"delayed": parts}})
	if err != nil {
		return 0, err
	}
	last, err := c.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{"delayed": reqs}})
	if err != nil {
		return 0, err
	}
	end := map[int]int64{}
	for _, po := range last.Topics["delayed"] {
		if po.Error != nil {
			return 0, po.Error
		}
		end[po.Partition] = po.LastOffset
	}
	var lag int64
	for _, po := range committed.Topics["delayed"] {
		if po.Error != nil {
			return 0, po.Error
		}
		off := max(po.CommittedOffset, 0)
		lag += end[po.Partition] - off
	}
	if len(committed.Topics["delayed"]) != partitions {
		return 0, fmt.Errorf("offsets of %d partitions, want %d", len(committed.Topics["delayed"]), partitions)
	}
	return lag, nil
}
