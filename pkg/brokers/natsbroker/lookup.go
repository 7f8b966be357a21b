package natsbroker

import (
	"context"
	"errors"
	"slices"
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
	lookLikely                       // over lookupRate while a stream was found down lately: taken for one of its
)

// streamNamesAPI is the subject of the lookup, as a refusal of it names it
// (the sink's JetStream context uses the default API prefix).
const streamNamesAPI = jetstream.DefaultAPIPrefix + "STREAM.NAMES"

// streamLookups are a sink's lookups of the stream that stores a subject
// ($JS.API.STREAM.NAMES, answered by JetStream's leader from the streams'
// configurations, leaderless ones included). A stream found is kept with
// its subjects (its configuration, when $JS.API.STREAM.INFO answers within
// the lookup's time) for patternsFor, so that the subjects of one stream (an
// entity's ID in each) need one lookup; an answer of none is kept per
// subject for storedByFor, for maxLooked subjects at most. At most
// lookupRate lookups a second (lookupBurst at once), so that a batch of
// many subjects and every shard asking at once do not make the sink wait
// or flood a JetStream leader that may be struggling; a subject over that
// rate while a stream of the account was found down within patternsFor
// is taken for one of that stream's (a server that is not the stream's
// peer does not answer its configuration: its subjects come one lookup
// at a time), a misrouted one so given the benefit of the doubt while
// that outage lasts. After a lookup that
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
// configuration's patterns, or the subjects looked up when its
// configuration did not come: noInfo) and when.
type foundStream struct {
	subjects []string
	noInfo   bool
	at       time.Time
}

// The bounds of streamLookups.
const (
	storedByFor = time.Second
	patternsFor = 10 * time.Second
	maxLooked   = 4096
	lookupRate  = 20
	lookupBurst = 20
)

func newStreamLookups() *streamLookups {
	return &streamLookups{limit: rate.NewLimiter(lookupRate, lookupBurst), none: map[string]time.Time{}, streams: map[string]foundStream{}}
}

// lately names the stream found last within patternsFor, "" for none.
func (l *streamLookups) lately(now time.Time) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	name, at := "", time.Time{}
	for n, f := range l.streams {
		if now.Sub(f.at) < patternsFor && f.at.After(at) {
			name, at = n, f.at
		}
	}
	return name
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
	case subject == "" || s.js == nil:
		return "", lookUnknown
	case !l.limit.Allow():
		if stream := l.lately(now); stream != "" {
			return stream, lookLikely
		}
		return "", lookUnknown
	}
	ctx, cancel := context.WithTimeout(context.Background(), duplicateLookup)
	defer cancel()
	from, _ := s.denied.mark()
	stream, err := s.js.StreamNameBySubject(ctx, subject)
	switch {
	case err == nil:
		l.mu.Lock()
		f, ok := l.streams[stream]
		l.mu.Unlock()
		if ok && f.noInfo && now.Sub(f.at) < patternsFor {
			// Its configuration did not come lately: this subject joins
			// those looked up, without asking again (in a slice of its
			// own: known may be reading the one in the map).
			f.subjects = append(slices.Clip(f.subjects[:min(len(f.subjects), maxLooked-1)]), subject)
		} else {
			f = foundStream{subjects: []string{subject}, noInfo: true}
			if st, err := s.js.Stream(ctx, stream); err == nil && len(st.CachedInfo().Config.Subjects) > 0 {
				f = foundStream{subjects: st.CachedInfo().Config.Subjects}
			}
		}
		f.at = now
		l.mu.Lock()
		if len(l.streams) >= maxLooked {
			clear(l.streams)
		}
		l.streams[stream] = f
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
