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

// streamNamesAPI is the subject of the lookup, as a refusal of it names it
// (the sink's JetStream context uses the default API prefix).
const streamNamesAPI = jetstream.DefaultAPIPrefix + "STREAM.NAMES"

// streamLookups are a sink's lookups of the stream that stores a subject
// ($JS.API.STREAM.NAMES, answered by JetStream's leader from the streams'
// configurations, leaderless ones included). A stream found is kept with
// its subjects (its configuration, when $JS.API.STREAM.INFO answers within
// infoLookup) for patternsFor, so that the subjects of one stream (an
// entity's ID in each) need one lookup; an answer of none is kept per
// subject for storedByFor, for maxLooked subjects at most. At most
// lookupRate lookups a second (lookupBurst at once), so that a batch of
// many subjects and every shard asking at once do not make the sink wait
// or flood a JetStream leader that may be struggling. After a lookup that
// got no answer none is made for a while: noLookupFor when the server
// refused it (the user may not ask: nothing can be known), jsLookEvery
// when JetStream did not answer (nor will it meanwhile).
type streamLookups struct {
	limit  *rate.Limiter
	off    atomic.Int64 // Unix ns: no lookup before
	offWhy atomic.Int32 // the lookState meanwhile

	mu      sync.Mutex
	none    map[string]time.Time // subject -> when no stream stored it
	streams map[string]foundStream
}

// foundStream is a stream a lookup found: the subjects it stores (its
// configuration's patterns, or the subject looked up) and when.
type foundStream struct {
	subjects []string
	at       time.Time
}

// The bounds of streamLookups.
const (
	storedByFor = time.Second
	patternsFor = 10 * time.Second
	infoLookup  = 250 * time.Millisecond
	maxLooked   = 4096
	lookupRate  = 20
	lookupBurst = 20
)

func newStreamLookups() *streamLookups {
	return &streamLookups{limit: rate.NewLimiter(lookupRate, lookupBurst), none: map[string]time.Time{}, streams: map[string]foundStream{}}
}

// known answers from what earlier lookups found.
func (l *streamLookups) known(subject string, now time.Time) (string, lookState, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for name, f := range l.streams {
		if now.Sub(f.at) >= patternsFor {
			delete(l.streams, name)
			continue
		}
		for _, p := range f.subjects {
			if p == subject || Destinations.Match(p, subject) {
				return name, lookFound, true
			}
		}
	}
	if at, ok := l.none[subject]; ok && now.Sub(at) < storedByFor {
		return "", lookNone, true
	}
	return "", lookUnknown, false
}

// storedBy says which stream of the account stores subject, as far as a
// lookup can tell (streamLookups), each within duplicateLookup.
func (s *Sink) storedBy(subject string) (string, lookState) {
	l := s.streams
	now := time.Now()
	if stream, st, ok := l.known(subject, now); ok {
		return stream, st
	}
	switch {
	case now.UnixNano() < l.off.Load():
		return "", lookState(l.offWhy.Load())
	case subject == "" || s.js == nil || !l.limit.Allow():
		return "", lookUnknown
	}
	ctx, cancel := context.WithTimeout(context.Background(), duplicateLookup)
	defer cancel()
	from, _ := s.denied.mark()
	stream, err := s.js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		subjects := []string{subject}
		ictx, icancel := context.WithTimeout(ctx, infoLookup)
		if st, err := s.js.Stream(ictx, stream); err == nil && len(st.CachedInfo().Config.Subjects) > 0 {
			subjects = st.CachedInfo().Config.Subjects
		}
		icancel()
		l.mu.Lock()
		if len(l.streams) >= maxLooked {
			clear(l.streams)
		}
		l.streams[stream] = foundStream{subjects: subjects, at: now}
		l.mu.Unlock()
		return stream, lookFound
	case errors.Is(err, jetstream.ErrStreamNotFound):
		l.mu.Lock()
		if len(l.none) >= maxLooked {
			clear(l.none)
		}
		l.none[subject] = now
		l.mu.Unlock()
		return "", lookNone
	case s.denied.since(from, streamNamesAPI) != nil:
		// The server refused the question (permissions): nothing can be
		// known, and asking again will not change that.
		l.offWhy.Store(int32(lookUnknown))
		l.off.Store(time.Now().Add(noLookupFor).UnixNano())
		return "", lookUnknown
	}
	// No answer in time, a 503, no responders, the connection lost:
	// JetStream does not answer, and will not meanwhile.
	l.offWhy.Store(int32(lookUnavailable))
	l.off.Store(time.Now().Add(jsLookEvery).UnixNano())
	return "", lookUnavailable
}
