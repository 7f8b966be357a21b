package kafkabroker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/delaybridge/delaybridge/pkg/envelope"
)

// generation is one consumer-group generation of this member: the partitions
// assigned to it and the committer. Everything runs under kg.Start, so that
// kafka-go waits for it before joining the next generation, and the final
// commit goes out before the partitions can belong to anyone else.
type generation struct {
	src   *Source
	kg    *kafka.Generation
	parts []*partition

	// from is how many partitions of the topic the group's assignment was
	// made from, when this member made it (it leads the group); else -1.
	from int

	// acked is signalled by acknowledgements while the generation ends, so
	// that finish notices when nothing handed out is outstanding.
	acked chan struct{}
}

func newGeneration(s *Source, kg *kafka.Generation, from int) *generation {
	g := &generation{src: s, kg: kg, from: from, acked: make(chan struct{}, 1)}
	s.mu.Lock()
	recreated := s.wasMissing
	if len(kg.Assignments[s.cfg.Topic]) > 0 && !s.topicMissing {
		s.wasMissing = false // the first generation that reads the topic created again
	}
	s.mu.Unlock()
	for _, a := range kg.Assignments[s.cfg.Topic] {
		start := a.Offset
		if start == kafka.LastOffset && recreated {
			// Nothing committed in a topic created since this Source
			// started: every record in it came after, none is skipped.
			start = kafka.FirstOffset
		}
		g.parts = append(g.parts, &partition{
			g:         g,
			topic:     s.cfg.Topic,
			id:        a.ID,
			start:     start,
			committed: max(a.Offset, -1), // FirstOffset/LastOffset: nothing committed
			wake:      make(chan struct{}, 1),
		})
	}
	return g
}

// start launches the committer, the topic watcher and one fetcher per
// partition.
func (g *generation) start() {
	ids := make([]int, len(g.parts))
	for i, p := range g.parts {
		ids[i] = p.id
	}
	g.src.log.Info("kafka partitions assigned", "generation", g.kg.ID, "partitions", ids)
	g.kg.Start(g.commitLoop)
	g.kg.Start(g.watchTopic)
	for _, p := range g.parts {
		g.kg.Start(p.run)
	}
}

// commitLoop commits finished offsets every CommitInterval and, when the
// generation ends, once more after giving up the partitions.
func (g *generation) commitLoop(ctx context.Context) {
	t := time.NewTicker(g.src.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.finish()
			return
		case <-t.C:
			_ = g.commit()
		}
	}
}

// finish ends the generation: no more records are handed out, records
// already handed out get a little time to be acknowledged (not on Close:
// the caller has stopped acknowledging), the partitions are revoked (later
// acknowledgements are ignored) and what is finished is committed.
func (g *generation) finish() {
	for _, p := range g.parts {
		p.setStopping()
	}
	if !g.src.isClosed() {
		deadline := time.NewTimer(g.src.drain)
	wait:
		for !g.drained() {
			select {
			case <-g.acked:
			case <-deadline.C:
				break wait
			}
		}
		deadline.Stop()
	}
	for _, p := range g.parts {
		p.revoke()
	}
	err := g.commit()
	g.src.log.Info("kafka partitions revoked", "generation", g.kg.ID)
	g.src.endGeneration(g, err)
}

// drained reports whether no record handed out is still unacknowledged.
func (g *generation) drained() bool {
	for _, p := range g.parts {
		p.mu.Lock()
		n := p.handed
		p.mu.Unlock()
		if n > 0 {
			return false
		}
	}
	return true
}

// commit commits the committable offset of every partition that moved.
// It may move back: a topic deleted and created again numbers its records
// from 0 again, below the old topic's last commit (outOfRange).
func (g *generation) commit() error {
	offsets := make(map[int]int64)
	for _, p := range g.parts {
		p.mu.Lock()
		if p.cp != nil {
			if c := p.cp.committable(); c != p.committed {
				offsets[p.id] = c
			}
		}
		p.mu.Unlock()
	}
	if len(offsets) == 0 {
		return nil
	}
	err := g.kg.CommitOffsets(map[string]map[int]int64{g.src.cfg.Topic: offsets})
	if err != nil {
		g.src.log.Warn("kafka offset commit failed; retrying at the next interval", "generation", g.kg.ID, "err", err)
		g.src.setCommitErr(err)
		return err
	}
	g.src.setCommitErr(nil)
	for _, p := range g.parts {
		if off, ok := offsets[p.id]; ok {
			p.mu.Lock()
			p.committed = off
			p.mu.Unlock()
		}
	}
	return nil
}

// partition is one assigned partition in one generation: its fetcher and
// its checkpointer.
type partition struct {
	g     *generation
	topic string
	id    int
	start int64 // committed offset, or kafka.FirstOffset/LastOffset

	wake chan struct{} // capacity 1: room freed, or rewind requested

	mu          sync.Mutex
	epoch       uint64        // bumped by begin; records of older epochs are stale
	cp          *checkpointer // nil until the start offset is known
	committed   int64         // last committed offset; -1 when none
	unacked     int           // fetched in this epoch and not yet acknowledged
	handed      int           // of those, handed out by Read
	stopping    bool          // generation ending: hand out nothing more
	revoked     bool          // generation ended: ignore acknowledgements
	rewind      bool          // a record was nacked: re-read from committable
	cancelFetch context.CancelFunc
	// fetchErr is the last error of looking up, fetching or reading the
	// partition; a fetch answered clears it (one of its records that
	// cannot be read sets it again).
	fetchErr error
	// fetching is when the fetch waiting for its answer was sent; zero
	// when none waits.
	fetching time.Time
}

// record is a fetched record on its way to Read.
type record struct {
	p      *partition
	epoch  uint64
	offset int64
	in     *envelope.Incoming
	acked  atomic.Bool
}

// ack is the record's ingest.AckFunc.
func (r *record) ack(_ context.Context, err error) error {
	if r.acked.Swap(true) {
		return nil // a second call: the contract says once; ignore it
	}
	r.p.finish(r.epoch, r.offset, err)
	return nil
}

// run fetches the partition until the generation ends.
func (p *partition) run(ctx context.Context) {
	log := p.g.src.log.With("partition", p.id)
	offset := p.start
	for ctx.Err() == nil {
		if offset < 0 {
			abs, err := p.g.src.resolveOffset(ctx, p.topic, p.id, offset)
			if err != nil {
				if ctx.Err() == nil {
					p.setFetchErr(err)
					log.Debug("kafka: cannot look up start offset; retrying", "err", err)
				}
				if !sleep(ctx, time.Second) {
					return
				}
				continue
			}
			offset = abs
		}
		if !p.begin(offset) {
			return
		}
		offset = p.fetch(ctx, offset)
		if offset < 0 {
			return
		}
		log.Info("kafka: a record was not handled; re-reading the partition from its first unfinished record", "offset", offset)
		if !sleep(ctx, rewindPause) {
			return
		}
	}
}

// begin starts a new epoch at offset: everything fetched before is
// forgotten (its acknowledgements are ignored) and will be fetched again.
func (p *partition) begin(offset int64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping || p.revoked {
		return false
	}
	p.epoch++
	p.cp = newCheckpointer(offset)
	p.unacked, p.handed, p.rewind = 0, 0, false
	return true
}

// outOfRange is where to read on when the partition has no record at
// offset (kafka.OffsetOutOfRange): from its oldest record, which is after
// offset when retention deleted what was not read yet (nothing older
// exists any more), and before it when offset is past the partition's end
// (the topic was deleted and created again: the records there now came
// after, and none may be skipped). A log truncated below offset (an
// unclean leader election, which Kafka disables by default) is read again
// from its oldest record too: it cannot be told from a topic created
// again (the group's committed offset is written again by its running
// members, and the topic's ID is not read here), and reading a record
// twice, which the dedupe window catches while it is recent, is better
// than losing the new ones. False (and it logs nothing) when the
// partition's offsets cannot be read, or it has a record at offset after
// all: the fetch is tried again.
func (p *partition) outOfRange(ctx context.Context, offset int64) (int64, bool) {
	src := p.g.src
	first, err := src.resolveOffset(ctx, p.topic, p.id, kafka.FirstOffset)
	if err != nil {
		return 0, false
	}
	if first > offset {
		src.log.Warn("kafka: the offset to read was deleted (by retention?) before it was read; reading from the oldest record", "partition", p.id, "offset", offset, "oldest", first)
		return first, true
	}
	end, err := src.resolveOffset(ctx, p.topic, p.id, kafka.LastOffset)
	if err != nil || end >= offset {
		return 0, false
	}
	src.log.Warn("kafka: the offset to read is past the end of the partition (the topic was deleted and created again, or its log truncated); reading it from its oldest record", "partition", p.id, "offset", offset, "end", end, "oldest", first, "records", end-first)
	return first, true
}

// fetch reads from offset until ctx ends (it returns -1) or a nack asks for
// a rewind (it returns the offset to re-read from).
//
// It fetches with the protocol's own request (fetchCommitted), not a
// kafka.Reader: the Reader reads a null and an empty value (key, header
// value) alike as nil, and a scheduled tombstone must stay one; nor
// kafka.Client.Fetch, which drops the list of aborted transactions whose
// records read_committed leaves to the client to skip.
func (p *partition) fetch(ctx context.Context, offset int64) int64 {
	cfg := &p.g.src.cfg
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	p.mu.Lock()
	p.cancelFetch = cancel
	epoch := p.epoch
	p.mu.Unlock()
	defer p.setFetching(false)
	for {
		p.setFetching(true)
		recs, err := fetchCommitted(fctx, p.g.src.client, p.topic, p.id, offset, fetchMaxWait, fetchMaxBytes)
		p.setFetching(false)
		switch {
		case ctx.Err() != nil:
			return -1
		case fctx.Err() != nil:
			return p.rewindOffset() // a nack cancelled the fetch
		case errors.Is(err, kafka.OffsetOutOfRange):
			if next, ok := p.outOfRange(ctx, offset); ok {
				offset = next
				continue
			}
		}
		if err != nil {
			p.setFetchErr(err)
			p.g.src.log.Debug("kafka: fetch failed; retrying", "partition", p.id, "err", err)
			if !sleep(fctx, 100*time.Millisecond) && ctx.Err() != nil {
				return -1
			}
			continue
		}
		p.setFetchErr(nil) // answered; a record it cannot read sets it again
		from := offset
		for {
			rec, err := recs.ReadRecord()
			if errors.Is(err, io.EOF) {
				// What was skipped (an aborted transaction, markers) is
				// not fetched again.
				offset = max(offset, recs.Next())
				if offset == from && recs.Answered() && !sleep(fctx, emptyFetchPause) && ctx.Err() != nil {
					// Nothing to read and nothing to skip that kafka-go
					// shows (a compacted topic keeps empty batches): the
					// broker answers such a fetch at once, so wait a
					// little before the next instead of spinning.
					return -1
				}
				break
			}
			if err != nil {
				p.setFetchErr(err)
				break
			}
			if rec.Offset < offset {
				continue // a batch may start before the offset asked for
			}
			in, err := incoming(p.topic, p.id, rec)
			if err != nil {
				p.setFetchErr(err)
				break
			}
			if at, ok := p.waitRoom(ctx, cfg.MaxInFlightPerPartition); !ok {
				return at
			}
			p.mu.Lock()
			if p.stopping || p.revoked {
				p.mu.Unlock()
				return -1
			}
			p.cp.add(rec.Offset)
			p.unacked++
			p.fetchErr = nil
			p.mu.Unlock()
			select {
			case p.g.src.recs <- &record{p: p, epoch: epoch, offset: rec.Offset, in: in}:
			case <-ctx.Done():
				return -1
			}
			offset = rec.Offset + 1
		}
	}
}

const (
	// emptyFetchPause is the wait after a fetch that held batches and
	// moved nothing on (a fetch with nothing at all waits at the broker,
	// fetchMaxWait).
	emptyFetchPause = 100 * time.Millisecond

	// fetchMaxWait is how long the broker holds a fetch that finds nothing
	// new before it answers.
	fetchMaxWait = time.Second

	// fetchUnanswered is how long a fetch may wait for its answer before
	// Ready says the partition's leader does not answer: the broker
	// answers within fetchMaxWait, and a request times out only after the
	// client's timeout (10 s).
	fetchUnanswered = 5 * time.Second
)

// fetchMaxBytes bounds one fetch of a partition.
const fetchMaxBytes = 1 << 20

// waitRoom waits until fewer than max records of the partition are
// unacknowledged. It returns false with the offset to re-read from when a
// nack asks for a rewind (-1 when ctx ended).
func (p *partition) waitRoom(ctx context.Context, max int) (int64, bool) {
	for {
		p.mu.Lock()
		rewind, room := p.rewind, p.unacked < max
		p.mu.Unlock()
		if rewind {
			return p.rewindOffset(), false
		}
		if room {
			return 0, true
		}
		select {
		case <-ctx.Done():
			return -1, false
		case <-p.wake:
		}
	}
}

// rewindOffset is where to re-read from after a nack: the first record of
// the partition not finished yet.
func (p *partition) rewindOffset() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cp.committable()
}

// handOut reports whether a record of epoch may go to the caller of Read,
// and counts it as handed out.
func (p *partition) handOut(epoch uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopping || p.revoked || epoch != p.epoch {
		return false
	}
	p.handed++
	return true
}

// finish records the acknowledgement of the record at off.
func (p *partition) finish(epoch uint64, off int64, err error) {
	p.mu.Lock()
	if p.revoked || epoch != p.epoch {
		p.mu.Unlock()
		return
	}
	p.unacked--
	p.handed--
	var cancel context.CancelFunc
	if err == nil {
		p.cp.finish(off)
	} else if !p.rewind {
		p.rewind = true
		cancel = p.cancelFetch
	}
	stopping := p.stopping
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
	if stopping {
		select {
		case p.g.acked <- struct{}{}:
		default:
		}
	}
}

func (p *partition) setStopping() {
	p.mu.Lock()
	p.stopping = true
	p.mu.Unlock()
}

func (p *partition) revoke() {
	p.mu.Lock()
	p.revoked = true
	p.mu.Unlock()
}

func (p *partition) setFetchErr(err error) {
	p.mu.Lock()
	p.fetchErr = err
	p.mu.Unlock()
}

// setFetching records that a fetch was sent (on) or answered (off).
func (p *partition) setFetching(on bool) {
	p.mu.Lock()
	if on {
		p.fetching = time.Now()
	} else {
		p.fetching = time.Time{}
	}
	p.mu.Unlock()
}

// fetchError says why the partition cannot be read: its last error, until
// a fetch is answered, or a fetch waiting for its answer
// longer than fetchUnanswered (a broker that takes requests and answers
// none: stopped, overloaded, or cut off by the network).
func (p *partition) fetchError() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.fetchErr != nil {
		return p.fetchErr
	}
	if !p.fetching.IsZero() {
		if d := time.Since(p.fetching); d > fetchUnanswered {
			return fmt.Errorf("no answer to a fetch for %s (is its leader stopped, overloaded or cut off by the network?)", d.Truncate(time.Second))
		}
	}
	return nil
}

// sleep waits d or until ctx ends; it reports whether ctx is still alive.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
