// Package logrepeat keeps a log line that repeats (the same failure of the
// same destination, a thousand times a second in a flood) to one line per
// key per interval (log.repeat_interval), with a count of the repeats it
// kept quiet.
//
// A Limiter answers Allow for each occurrence: the first of a key logs,
// the ones within the interval after it are counted; the first after the
// interval logs again with that count. Due hands the counts of the keys
// whose interval ended without a new occurrence, so that a flood that
// stopped is still summed up in a line. Memory is bounded: a key quiet for
// a whole interval is forgotten by Due, and past max keys the least
// recently seen is evicted, its count handed by the next Due as Other.
//
// The caller gives the time of each call, so that tests inject a clock. A
// Limiter is safe for concurrent use.
package logrepeat

import (
	"container/list"
	"sync"
	"time"
)

// Limiter limits log lines per key; V is what a line says (its message and
// attributes), kept from the last occurrence for the summary. Create it
// with New.
type Limiter[V any] struct {
	interval time.Duration
	max      int

	mu    sync.Mutex
	lru   *list.List // of *entry, the most recently seen at the front
	byKey map[string]*list.Element
	other int // quiet occurrences of evicted keys, for the next Due
}

type entry[V any] struct {
	key    string
	last   V         // the last occurrence's value
	logged time.Time // when the key's last line was logged
	quiet  int       // occurrences since then not logged
}

// New returns a Limiter that logs a key at most once per interval and
// remembers at most keys keys (at least 1).
func New[V any](interval time.Duration, keys int) *Limiter[V] {
	return &Limiter[V]{interval: interval, max: max(keys, 1), lru: list.New(), byKey: map[string]*list.Element{}}
}

// Interval returns the interval the Limiter was made with.
func (l *Limiter[V]) Interval() time.Duration { return l.interval }

// Allow reports whether an occurrence of key at now, which says v, is
// logged. When it is, quiet is how many occurrences of key since its last
// line were not.
func (l *Limiter[V]) Allow(key string, now time.Time, v V) (ok bool, quiet int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if el, found := l.byKey[key]; found {
		e := el.Value.(*entry[V])
		e.last = v
		l.lru.MoveToFront(el)
		if now.Sub(e.logged) < l.interval {
			e.quiet++
			return false, 0
		}
		quiet, e.quiet, e.logged = e.quiet, 0, now
		return true, quiet
	}
	for l.lru.Len() >= l.max {
		oldest := l.lru.Back()
		e := oldest.Value.(*entry[V])
		l.other += e.quiet
		delete(l.byKey, e.key)
		l.lru.Remove(oldest)
	}
	l.byKey[key] = l.lru.PushFront(&entry[V]{key: key, last: v, logged: now})
	return true, 0
}

// Summary is the occurrences of a key not logged during an interval that
// ended at the time Due was called, with the value of the last one.
type Summary[V any] struct {
	Key   string
	Quiet int
	Last  V
}

// Due returns the keys whose interval since their last line has ended with
// occurrences not logged, and counts them as logged now (the caller logs
// the summary line, which starts a new interval); it forgets the keys whose
// interval ended with none. other is the quiet occurrences of keys evicted
// since the last call, which no summary names.
func (l *Limiter[V]) Due(now time.Time) (due []Summary[V], other int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for el := l.lru.Front(); el != nil; {
		next := el.Next()
		e := el.Value.(*entry[V])
		if now.Sub(e.logged) >= l.interval {
			if e.quiet > 0 {
				due = append(due, Summary[V]{Key: e.key, Quiet: e.quiet, Last: e.last})
				e.quiet, e.logged = 0, now
			} else {
				delete(l.byKey, e.key)
				l.lru.Remove(el)
			}
		}
		el = next
	}
	other, l.other = l.other, 0
	return due, other
}

// Len returns how many keys the Limiter remembers.
func (l *Limiter[V]) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.lru.Len()
}
