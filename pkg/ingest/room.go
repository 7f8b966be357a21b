package ingest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/delaybridge/delaybridge/pkg/envelope"
	"github.com/delaybridge/delaybridge/pkg/store"
)

// The waiting room holds the messages to park that were read while the
// store is at its limits (limits.max_parked_messages, max_redis_memory:
// PipelineParams.Capacity answers store.ErrFull): not parked and not yet
// acknowledged, in the order they came. Reading goes on, so that what
// frees room is not stuck behind them: a cancel (x-delay-cancel, a
// kafka-scheduler tombstone) of a message in the room takes it out, and a
// cancel of a parked one or of a group goes to the store at once (the
// contract's "Room for everyone"). While the room holds messages, every
// new one to park joins it, so that they are parked in the order they
// came; parkRoom parks them as room comes back. The room holds at most
// MaxInFlight messages: past that, handle waits, and reading with it.
type waitingRoom struct {
	// mu guards items, and is held while parkRoom parks what it took, so
	// that a cancel that does not find its message in the room finds it
	// parked.
	mu    sync.Mutex
	items []waiting
	space *sync.Cond // signalled when items leave
	wake  chan struct{}
	max   int
	err   error // why the room fills (the capacity's answer)
	log   *slog.Logger
	// warned is when the last pause was logged (at most one line per
	// roomWarnEvery: at a limit the room fills and empties as messages
	// fire), and announced that its end is to be logged.
	warned    time.Time
	announced bool
}

// roomWarnEvery bounds the lines that say the room fills.
const roomWarnEvery = time.Minute

// waiting is a message in the room and the item it was read as.
type waiting struct {
	m  *envelope.Message
	it item
	// heard is when its broker last heard of it (time.Now): when it came
	// to the room, then when it was last said to be in progress
	// (progressRoom).
	heard time.Time
}

func newWaitingRoom(max int, log *slog.Logger) *waitingRoom {
	r := &waitingRoom{wake: make(chan struct{}, 1), max: max, log: log}
	r.space = sync.NewCond(&r.mu)
	return r
}

// waitingErr says why messages wait, nil when none does.
func (r *waitingRoom) waitingErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.items) == 0 {
		return nil
	}
	if r.err == nil {
		return fmt.Errorf("%d messages wait for the store to have room", len(r.items))
	}
	return fmt.Errorf("%d messages wait for the store to have room: %w", len(r.items), r.err)
}

// len is how many messages wait.
func (r *waitingRoom) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.items)
}

// add puts ws in the room, waiting while it is full (or until ctx ends:
// then it reports false and adds nothing).
func (r *waitingRoom) add(ctx context.Context, ws []waiting, why error) bool {
	stop := context.AfterFunc(ctx, func() {
		r.mu.Lock()
		r.space.Broadcast()
		r.mu.Unlock()
	})
	defer stop()
	r.mu.Lock()
	defer r.mu.Unlock()
	for len(r.items)+len(ws) > max(r.max, len(ws)) && ctx.Err() == nil {
		r.space.Wait()
	}
	if ctx.Err() != nil {
		return false
	}
	if len(r.items) == 0 && why != nil && time.Since(r.warned) >= roomWarnEvery {
		r.warned, r.announced = time.Now(), true
		r.log.Warn("the store has no room for this ingest's messages: they wait, unacknowledged, and reading goes on (cancels go through); see delaybridge_ingest_paused", "reason", why)
	}
	r.items = append(r.items, ws...)
	if why != nil {
		r.err = why
	}
	select {
	case r.wake <- struct{}{}:
	default:
	}
	return true
}

// takeID takes every waiting message of ID id out of the room: a
// redelivery of one that waits (its channel closed meanwhile) waits
// beside it.
func (r *waitingRoom) takeID(id string) []waiting {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []waiting
	kept := r.items[:0]
	for _, w := range r.items {
		if w.m.ID == id {
			out = append(out, w)
		} else {
			kept = append(kept, w)
		}
	}
	clear(r.items[len(kept):])
	r.items = kept
	if len(out) > 0 {
		r.space.Broadcast()
	}
	return out
}

// takeGroup takes the waiting messages of a group out of the room.
func (r *waitingRoom) takeGroup(group string) []waiting {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []waiting
	keep := r.items[:0]
	for _, w := range r.items {
		if w.m.Group == group {
			out = append(out, w)
		} else {
			keep = append(keep, w)
		}
	}
	r.items = keep
	if len(out) > 0 {
		r.space.Broadcast()
	}
	return out
}

// roomFor says how many of n messages to park may be parked now, the first
// take, with done to call once they are; the rest go to the waiting room,
// and why says why (the store is near a limit: ErrFull; nil: the room
// holds messages already, which the new ones wait behind). take is 0 and
// why another error when the limits cannot be read.
func (pl *Pipeline) roomFor(ctx context.Context, n int) (take int, done func(), why error) {
	if pl.p.Capacity == nil {
		return n, func() {}, nil
	}
	if pl.room.len() > 0 {
		return 0, nil, nil
	}
	return pl.p.Capacity(ctx, n)
}

// parkRoom parks what waits in the room, in order, a batch at a time, as
// the store has room for it, and acknowledges it; until ctx ends, when
// what still waits is given back to the broker.
func (pl *Pipeline) parkRoom(ctx context.Context) {
	defer func() {
		r := pl.room
		r.mu.Lock()
		left := r.items
		r.items = nil
		r.space.Broadcast()
		r.mu.Unlock()
		if len(left) > 0 {
			batch := make([]item, len(left))
			for i, w := range left {
				batch[i] = w.it
			}
			pl.nackAll(batch, errors.New("stopping: the store had no room for it; the broker delivers it again"))
		}
	}()
	tick := time.NewTicker(roomPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-pl.room.wake:
		}
		for pl.parkRoomBatch(ctx) {
		}
		pl.progressRoom(ctx)
	}
}

// progressRoom tells the broker that the messages waiting in the room are
// still being handled, each at most once per the source's ProgressEvery
// (ingest.Progresser), so that it does not deliver them again while they
// wait: JetStream would, every ack_wait, each time to be read and dropped
// as a re-read. It does so only while they wait for room in a store that
// answers (the capacity's last answer is store.ErrFull) and the work was
// not handed back: while this instance cannot reach Redis, the broker
// delivers them again, to the instances that can. A message settled
// meanwhile may still be told: the broker ignores that of a message it no
// longer holds.
func (pl *Pipeline) progressRoom(ctx context.Context) {
	p, ok := pl.Source().(Progresser)
	if !ok {
		return
	}
	every := p.ProgressEvery()
	if every <= 0 {
		return
	}
	if pl.cut.Load() {
		return
	}
	r := pl.room
	now := time.Now() // the broker's timer runs on the wall clock, not Redis's
	var acks []AckFunc
	r.mu.Lock()
	if !errors.Is(r.err, store.ErrFull) {
		r.mu.Unlock()
		return
	}
	for i := range r.items {
		if w := &r.items[i]; now.Sub(w.heard) >= every {
			w.heard = now
			acks = append(acks, w.it.ack)
		}
	}
	r.mu.Unlock()
	// Each is told, whatever the others' answers: one settled meanwhile
	// answers an error (nats.go: already acknowledged).
	failed := 0
	var last error
	for _, ack := range acks {
		if err := ack(ctx, ErrInProgress); err != nil {
			failed, last = failed+1, err
		}
	}
	if failed > 0 {
		r.log.Debug("could not tell the broker that some waiting messages are in progress; it may deliver them again, to be dropped as re-reads", "count", failed, "err", last)
	}
}

// roomPoll is how often the waiting room asks whether the store has room
// again (the capacity gate measures every quarter second).
const roomPoll = 250 * time.Millisecond

// parkRoomBatch parks the first batch of the room if the store has room
// for it, and reports whether it did (and more may follow).
func (pl *Pipeline) parkRoomBatch(ctx context.Context) bool {
	r := pl.room
	r.mu.Lock()
	n := min(len(r.items), parkBatch)
	if n == 0 {
		r.mu.Unlock()
		return false
	}
	n, done, why := pl.p.Capacity(ctx, n)
	if n == 0 {
		r.err = why
		r.mu.Unlock()
		return false
	}
	ws := append([]waiting(nil), r.items[:n]...)
	msgs := make([]*envelope.Message, n)
	for i, w := range ws {
		msgs[i] = w.m
	}
	refused, err := pl.parkChecked(ctx, msgs)
	done()
	if err == nil {
		r.items = r.items[n:]
		r.space.Broadcast()
		if why != nil {
			r.err = why
		}
		if len(r.items) == 0 && r.announced {
			r.announced = false
			r.log.Info("the store has room again: the messages that waited are parked")
		}
	}
	r.mu.Unlock()
	if err != nil {
		return false // Redis failed: tried again at the next poll
	}
	var rejects []store.Rejected
	var codes []envelope.Code
	for _, rf := range refused {
		rejects = append(rejects, store.Rejected{Message: rf.m, Reason: rf.err.Error()})
		codes = append(codes, envelope.CodeOf(rf.err))
	}
	rejectErr := pl.reject(ctx, rejects, codes)
	ackCtx, cancel := context.WithTimeout(context.Background(), ackTimeout)
	defer cancel()
	confirmer, confirms := pl.Source().(AckConfirmer)
	var mark uint64
	if confirms {
		mark = confirmer.AckMark()
	}
	var sent []*envelope.Message // acked: their re-read marks go once the acks are confirmed
	for _, w := range ws {
		var err error
		if rejectErr != nil && slices.ContainsFunc(refused, func(rf refusal) bool { return rf.m == w.m }) {
			err = rejectErr // not kept as dead: the broker delivers it again
		}
		if pl.acknowledge(ackCtx, w.it.ack, err) && err == nil {
			sent = append(sent, w.m)
		}
	}
	if confirms {
		pl.confirmAcks(ackCtx, confirmer, mark, sent)
	}
	return true
}
