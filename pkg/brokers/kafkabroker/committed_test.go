package kafkabroker

import (
	"errors"
	"io"
	"slices"
	"testing"

	"github.com/segmentio/kafka-go/protocol"
	fetchapi "github.com/segmentio/kafka-go/protocol/fetch"
)

// The reading of a read_committed fetch, batch by batch, as Kafka's own
// consumers read it (kfake answers too kindly to show every case: it sends
// no more than the transactions that begin in the fetch, and more than a
// fetch's bytes at once).
func TestCommittedReader(t *testing.T) {
	const p, q = 7, 8 // producer IDs; -1: not transactional
	data := func(producer int64, txn bool, offsets ...int64) protocol.RecordReader {
		recs := make([]protocol.Record, len(offsets))
		for i, o := range offsets {
			recs[i] = protocol.Record{Offset: o, Value: protocol.NewBytes([]byte("x"))}
		}
		var attrs protocol.Attributes
		if txn {
			attrs = protocol.Transactional
		}
		return &protocol.RecordBatch{Attributes: attrs, BaseOffset: offsets[0], ProducerID: producer, Records: protocol.NewRecordReader(recs...)}
	}
	marker := func(producer, offset int64, abort bool) protocol.RecordReader {
		typ := int16(1)
		if abort {
			typ = controlAbort
		}
		b := protocol.NewControlBatch(protocol.ControlRecord{Offset: offset, Type: typ})
		b.BaseOffset, b.ProducerID, b.Attributes = offset, producer, protocol.Transactional|protocol.Control
		return b
	}
	for _, c := range []struct {
		name     string
		aborted  []fetchapi.ResponseTransaction
		batches  []protocol.RecordReader
		want     []int64
		wantNext int64
	}{
		{"an aborted transaction among others", []fetchapi.ResponseTransaction{{ProducerID: p, FirstOffset: 0}},
			[]protocol.RecordReader{data(p, true, 0, 1), data(-1, false, 2), marker(p, 3, true), data(p, true, 4), marker(p, 5, false)},
			[]int64{2, 4}, 6},
		{"begun before the fetch, its marker first: the next transaction is read", []fetchapi.ResponseTransaction{{ProducerID: p, FirstOffset: 0}},
			[]protocol.RecordReader{marker(p, 2, true), data(-1, false, 3), data(p, true, 4), marker(p, 5, false)},
			[]int64{3, 4}, 6},
		{"only what is skipped: the next fetch begins after it", []fetchapi.ResponseTransaction{{ProducerID: p, FirstOffset: 10}},
			[]protocol.RecordReader{data(p, true, 10, 11, 12), marker(p, 13, true)},
			nil, 14},
		{"two producers, one aborted", []fetchapi.ResponseTransaction{{ProducerID: q, FirstOffset: 1}},
			[]protocol.RecordReader{data(p, true, 0), data(q, true, 1), marker(p, 2, false), data(q, true, 3), marker(q, 4, true), data(q, true, 5)},
			[]int64{0, 5}, 6},
	} {
		r := &committedReader{batches: slices.Clone(c.batches), aborted: c.aborted, inAborted: map[int64]bool{}}
		var got []int64
		for {
			rec, err := r.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
			got = append(got, rec.Offset)
		}
		if !slices.Equal(got, c.want) || r.Next() != c.wantNext {
			t.Errorf("%s: read %v, next %d; want %v, next %d", c.name, got, r.Next(), c.want, c.wantNext)
		}
	}
	// A batch with no record (a compacted topic keeps them) moves nothing
	// on, and the fetch says it held one: the loop pauses, not spins.
	empty := &committedReader{batches: []protocol.RecordReader{&protocol.RecordBatch{BaseOffset: 5, ProducerID: -1, Records: protocol.NewRecordReader()}},
		inAborted: map[int64]bool{}, answered: true}
	if _, err := empty.ReadRecord(); !errors.Is(err, io.EOF) || empty.Next() != 0 || !empty.Answered() {
		t.Errorf("an empty batch: %v, next %d, answered %v", err, empty.Next(), empty.Answered())
	}
}
