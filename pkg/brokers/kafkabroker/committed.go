package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// fetchCommitted fetches one partition from offset under read_committed
// and returns its records without those of aborted transactions. Under
// read_committed the broker holds back what is not decided yet, but sends
// the records of aborted transactions with a list of them, for the client
// to drop, as Kafka's own consumers do; kafka.Client.Fetch does not pass
// that list on, so the request is made here with the protocol's own types.
// The error is the broker's (a kafka.Error: errors.Is(err,
// kafka.OffsetOutOfRange)) or the round trip's.
func fetchCommitted(ctx context.Context, c *kafka.Client, topic string, partition int, offset int64, maxWait time.Duration, maxBytes int) (protocol.RecordReader, error) {
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout+maxWait)
		defer cancel()
	}
	tr := c.Transport
	if tr == nil {
		tr = kafka.DefaultTransport
	}
	m, err := tr.RoundTrip(ctx, c.Addr, &fetchapi.Request{
		ReplicaID:      -1,
		MaxWaitTime:    int32(maxWait.Milliseconds()),
		MinBytes:       1,
		MaxBytes:       int32(maxBytes),
		IsolationLevel: int8(kafka.ReadCommitted),
		SessionID:      -1,
		SessionEpoch:   -1,
		Topics: []fetchapi.RequestTopic{{Topic: topic, Partitions: []fetchapi.RequestPartition{{
			Partition: int32(partition), CurrentLeaderEpoch: -1, FetchOffset: offset, LogStartOffset: -1, PartitionMaxBytes: int32(maxBytes),
		}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("kafka fetch: %w", err)
	}
	res := m.(*fetchapi.Response)
	if res.ErrorCode != 0 {
		return nil, kafka.Error(res.ErrorCode)
	}
	if len(res.Topics) == 0 || len(res.Topics[0].Partitions) == 0 {
		return nil, errors.New("kafka fetch: the answer names no partition")
	}
	p := &res.Topics[0].Partitions[0]
	if p.ErrorCode != 0 {
		return nil, kafka.Error(p.ErrorCode)
	}
	var batches []protocol.RecordReader
	switch r := p.RecordSet.Records.(type) {
	case nil:
	case *protocol.RecordStream:
		batches = r.Records
	default:
		batches = []protocol.RecordReader{r}
	}
	aborted := slices.Clone(p.AbortedTransactions)
	slices.SortFunc(aborted, func(a, b fetchapi.ResponseTransaction) int { return int(a.FirstOffset - b.FirstOffset) })
	return &committedReader{batches: batches, aborted: aborted, inAborted: map[int64]bool{}}, nil
}

// committedReader reads the batches of a fetch, skipping those of aborted
// transactions and the control batches (transaction markers): a producer's
// aborted transaction begins at the first offset the broker lists for it
// and ends at its marker.
type committedReader struct {
	batches   []protocol.RecordReader
	aborted   []fetchapi.ResponseTransaction // by first offset, not begun yet
	inAborted map[int64]bool                 // producers inside an aborted transaction
}

func (c *committedReader) ReadRecord() (*protocol.Record, error) {
	for len(c.batches) > 0 {
		switch b := c.batches[0].(type) {
		case *protocol.ControlBatch:
			delete(c.inAborted, b.ProducerID) // its transaction ended, committed or aborted
			c.batches = c.batches[1:]
			continue
		case *protocol.RecordBatch:
			for len(c.aborted) > 0 && c.aborted[0].FirstOffset <= b.BaseOffset {
				c.inAborted[c.aborted[0].ProducerID] = true
				c.aborted = c.aborted[1:]
			}
			if b.Attributes.Transactional() && c.inAborted[b.ProducerID] {
				c.batches = c.batches[1:]
				continue
			}
		}
		rec, err := c.batches[0].ReadRecord()
		if errors.Is(err, io.EOF) {
			c.batches = c.batches[1:]
			continue
		}
		return rec, err
	}
	return nil, io.EOF
}
