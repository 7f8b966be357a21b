package kafkabroker

import (
	"cmp"
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
func fetchCommitted(ctx context.Context, c *kafka.Client, topic string, partition int, offset int64, maxWait time.Duration, maxBytes int) (*committedReader, error) {
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
	slices.SortFunc(aborted, func(a, b fetchapi.ResponseTransaction) int { return cmp.Compare(a.FirstOffset, b.FirstOffset) })
	return &committedReader{batches: batches, aborted: aborted, inAborted: map[int64]bool{}, answered: len(batches) > 0}, nil
}

// committedReader reads the batches of a fetch as Kafka's own
// read_committed consumers do: a producer's aborted transaction begins at
// the first offset the broker lists for it, and its data batches are
// skipped until its ABORT marker; transaction markers (control batches)
// are skipped. Next is the offset after the last record read or skipped,
// where the next fetch begins even when every batch was skipped (an
// aborted transaction larger than a fetch, a marker at the end of the log).
type committedReader struct {
	batches   []protocol.RecordReader
	aborted   []fetchapi.ResponseTransaction // by first offset, not begun yet
	inAborted map[int64]bool                 // producers inside an aborted transaction
	open      bool                           // batches[0]'s records are being read
	next      int64
	answered  bool // the fetch held batches (maybe nothing to read in them)
}

// Answered reports whether the fetch held any batch: one that did and
// moved nothing on (Next) holds only what kafka-go does not show, such as
// the empty batches a compacted topic keeps.
func (c *committedReader) Answered() bool { return c.answered }

// Next is the offset after the last record read or skipped; 0 before any.
func (c *committedReader) Next() int64 { return c.next }

func (c *committedReader) ReadRecord() (*protocol.Record, error) {
	for len(c.batches) > 0 {
		b := c.batches[0]
		if !c.open && c.skip(b) {
			c.drain(b)
			c.batches = c.batches[1:]
			continue
		}
		c.open = true
		rec, err := b.ReadRecord()
		if errors.Is(err, io.EOF) {
			c.batches, c.open = c.batches[1:], false
			continue
		}
		if err != nil {
			return nil, err
		}
		c.next = rec.Offset + 1
		return rec, nil
	}
	return nil, io.EOF
}

// skip takes in a batch's header and reports whether its records are
// skipped: a marker (which, for ABORT, ends its producer's aborted
// transaction), or data of a producer inside an aborted transaction.
func (c *committedReader) skip(b protocol.RecordReader) bool {
	switch b := b.(type) {
	case *protocol.ControlBatch:
		c.begun(b.BaseOffset)
		for {
			r, err := b.ReadControlRecord()
			if err != nil {
				break
			}
			c.next = r.Offset + 1
			if r.Type == controlAbort {
				delete(c.inAborted, b.ProducerID)
			}
		}
		return true
	case *protocol.RecordBatch:
		if b.ProducerID >= 0 {
			c.begun(b.BaseOffset)
		}
		return b.Attributes.Transactional() && c.inAborted[b.ProducerID]
	}
	return false
}

// controlAbort is the type of an ABORT marker's control record (COMMIT
// is 1).
const controlAbort = 0

// begun takes in the aborted transactions that began by offset.
func (c *committedReader) begun(offset int64) {
	for len(c.aborted) > 0 && c.aborted[0].FirstOffset <= offset {
		c.inAborted[c.aborted[0].ProducerID] = true
		c.aborted = c.aborted[1:]
	}
}

// drain reads what is left of a skipped batch, for Next.
func (c *committedReader) drain(b protocol.RecordReader) {
	for {
		r, err := b.ReadRecord()
		if err != nil {
			return
		}
		c.next = r.Offset + 1
		if r.Key != nil {
			r.Key.Close()
		}
		if r.Value != nil {
			r.Value.Close()
		}
	}
}
