package natsbroker

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"
)

// lookState is what storedBy could tell of a subject.
type lookState int

const (
	lookUnknown     lookState = iota // not known: the user may not ask, or over lookupRate
	lookNone                         // no stream of the account stores the subject
	lookFound                        // a stream stores it
	lookUnavailable                  // JetStream did not answer, or answered 503 (a cluster without its leader)
)

// streamNamesAPI is the subject of the lookup, as a refusal of it names it.
const streamNamesAPI = jetstream.DefaultAPIPrefix + "STREAM.NAMES"

// streamLookups are a sink's lookups of the stream that stores a subject
// ($JS.API.STREAM.NAMES, answered by JetStream's leader from the streams'
// configurations, leaderless ones included): each answer kept
// storedByFor, for maxLooked subjects at most; at most lookupRate a
// second (lookupBurst at once), so that a batch of many subjects and
// every shard asking at once do not make the sink wait or flood a
// JetStream leader that may be struggling. After a lookup that got no
// answer none is made for a while: noLookupFor when the server refused
// it (the user may not ask: nothing can be known), jsLookEvery when it
// did not answer (JetStream not answering, meanwhile too).
type streamLookups struct {
	limit  *rate.Limiter
	off    atomic.Int64 // Unix ns: no lookup before
	offWhy atomic.Int32 // the lookState meanwhile

	mu     sync.Mutex
	answer map[string]streamLook
}

// streamLook is one answer: the stream ("" for none) and when.
type streamLook struct {
	stream string
	at     time.Time
}

// The bounds of streamLookups.
const (
	storedByFor = time.Second
	maxLooked   = 4096
	lookupRate  = 20
	lookupBurst = 20
)

func newStreamLookups() *streamLookups {
	return &streamLookups{limit: rate.NewLimiter(lookupRate, lookupBurst), answer: map[string]streamLook{}}
}

// storedBy says which stream of the account stores subject, as far as a
// lookup can tell (streamLookups), each within duplicateLookup.
func (s *Sink) storedBy(subject string) (string, lookState) {
	l := s.streams
	now := time.Now()
	l.mu.Lock()
	a, ok := l.answer[subject]
	l.mu.Unlock()
	switch {
	case ok && now.Sub(a.at) < storedByFor && a.stream != "":
		return a.stream, lookFound
	case ok && now.Sub(a.at) < storedByFor:
		return "", lookNone
	case now.UnixNano() < l.off.Load():
		return "", lookState(l.offWhy.Load())
	case subject == "" || s.js == nil || !l.limit.Allow():
		return "", lookUnknown
	}
	ctx, cancel := context.WithTimeout(context.Background(), duplicateLookup)
	defer cancel()
	from, _ := s.denied.mark()
	stream, err := s.js.StreamNameBySubject(ctx, subject)
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
	case errors.Is(err, jetstream.ErrStreamNotFound):
		stream = ""
	case errors.As(err, &apiErr) && apiErr.Code == 503:
		return "", lookUnavailable
	case ctx.Err() != nil && s.denied.since(from, streamNamesAPI) != nil:
		l.offWhy.Store(int32(lookUnknown))
		l.off.Store(time.Now().Add(noLookupFor).UnixNano())
		return "", lookUnknown
	case ctx.Err() != nil:
		l.offWhy.Store(int32(lookUnavailable))
		l.off.Store(time.Now().Add(jsLookEvery).UnixNano())
		return "", lookUnavailable
	default:
		return "", lookUnknown
	}
	l.mu.Lock()
	if len(l.answer) >= maxLooked {
		clear(l.answer)
	}
	l.answer[subject] = streamLook{stream: stream, at: now}
	l.mu.Unlock()
	if stream == "" {
		return "", lookNone
	}
	return stream, lookFound
}
