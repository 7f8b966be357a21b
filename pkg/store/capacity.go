package store

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Capacity is the gate that holds parking back at the store's limits:
// limits.max_parked_messages (messages parked in the store),
// limits.max_redis_memory (Redis's used_memory) and each ingest's
// max_parked (its live messages, Stats.Sources). The parked counts (Stats)
// and Redis's memory are measured at most every quarter second, and the
// counts are counted up by what this process lets through in between, so a
// busy pipeline costs Redis a few reads a second, not one per batch; the
// counts are measured again at once when they say a limit is near. What
// it let through and is not parked yet (its Gate's done not called) counts
// as parked in a measure. So the gate of one process lets through no more
// than its limits; processes that share the store can pass them together
// by what they let through at the same time. It is safe for concurrent
// use: all pipelines of a process share one.
type Capacity struct {
	store     *Store
	maxParked int64
	maxMemory int64
	perSource map[string]int64
	ttl       time.Duration

	mu         sync.Mutex
	measuredAt time.Time
	parked     int64            // measured, plus what was let through since
	sources    map[string]int64 // the same per source with a bound
	memErr     error

	// pmu guards what was let through and is not parked yet, apart from mu,
	// which a measure holds across its round trip: a park that ends says
	// so without waiting for it.
	pmu        sync.Mutex
	pending    int64            // let through and not parked yet
	pendingSrc map[string]int64 // the same per source with a bound
}

// Gate is the capacity's gate of one source (Capacity.For), asked before n
// messages (n >= 1) are parked. It answers how many of them, the first
// take, may be parked now, and done, to call once they are parked (or
// will not be). take is n, or fewer when a limit would be passed, and err
// then says which (ErrFull) for the rest; take is 0 when a limit is
// reached (ErrFull) or the limits cannot be read (another error), and
// done is then nil.
type Gate func(ctx context.Context, n int) (take int, done func(), err error)

// NewCapacity returns the gate of maxParked (limits.max_parked_messages),
// maxMemory (limits.max_redis_memory) and perSource (ingest[].max_parked by
// ingest name; 0 or absent: no bound of its own); nil when nothing is
// bounded.
func NewCapacity(s *Store, maxParked, maxMemory int64, perSource map[string]int64) *Capacity {
	c := &Capacity{store: s, maxParked: maxParked, maxMemory: maxMemory, ttl: 250 * time.Millisecond,
		sources: map[string]int64{}, pendingSrc: map[string]int64{}}
	for src, n := range perSource {
		if n > 0 {
			if c.perSource == nil {
				c.perSource = map[string]int64{}
			}
			c.perSource[src] = n
		}
	}
	if maxParked <= 0 && maxMemory <= 0 && c.perSource == nil {
		return nil
	}
	return c
}

// For returns the gate of one source (an ingest's name; "" the admin
// API), which its pipeline calls before parking a batch
// (ingest.PipelineParams.Capacity): what it does not let through waits,
// and the pipeline asks again. A nil Capacity returns nil: no gate.
func (c *Capacity) For(source string) Gate {
	if c == nil {
		return nil
	}
	return func(ctx context.Context, n int) (int, func(), error) { return c.check(ctx, source, n) }
}

// check is the gate of source.
func (c *Capacity) check(ctx context.Context, source string, n int) (int, func(), error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	stale := time.Since(c.measuredAt) >= c.ttl
	srcMax := c.perSource[source]
	if (c.maxParked > 0 && (stale || c.parked+int64(n) > c.maxParked)) ||
		(srcMax > 0 && (stale || c.sources[source]+int64(n) > srcMax)) {
		// What is let through and not parked yet, read before the measure:
		// a park that ends during it is then counted by both (too many,
		// which holds back a little longer), never by neither (too few,
		// which would pass the limit).
		c.pmu.Lock()
		pending, pendingSrc := c.pending, maps.Clone(c.pendingSrc)
		c.pmu.Unlock()
		st, err := c.store.Stats(ctx)
		if err != nil {
			return 0, nil, err
		}
		c.parked = st.Parked + pending
		for src := range c.perSource {
			c.sources[src] = st.Sources[src].Live + pendingSrc[src]
		}
	}
	if c.maxMemory > 0 && stale {
		c.memErr = nil
		mem, err := c.store.Memory(ctx)
		switch {
		case err != nil:
			c.memErr = err
		case mem.Used >= c.maxMemory:
			c.memErr = full(FullMaxRedisMemory, "redis uses %d bytes, limits.max_redis_memory is %d: waiting for firing to make room", mem.Used, c.maxMemory)
		}
	}
	if stale {
		c.measuredAt = time.Now()
	}
	if c.memErr != nil {
		return 0, nil, c.memErr
	}
	fullParked := func() error {
		return full(FullMaxParkedMessages, "%d messages parked, limits.max_parked_messages is %d: waiting for firing to make room", c.parked, c.maxParked)
	}
	fullSource := func() error {
		return full(FullMaxParked, "ingest %q has %d messages parked, its max_parked is %d: waiting for them to fire (cancels go through)", source, c.sources[source], srcMax)
	}
	// The bound of the source first: at its own bound, an ingest waits for
	// its own messages to fire, whatever the store's.
	if srcMax > 0 && c.sources[source] >= srcMax {
		return 0, nil, fullSource()
	}
	if c.maxParked > 0 && c.parked >= c.maxParked {
		return 0, nil, fullParked()
	}
	take, why := int64(n), fullSource
	if srcMax > 0 && c.sources[source]+take > srcMax {
		take = srcMax - c.sources[source]
	}
	if c.maxParked > 0 && c.parked+take > c.maxParked {
		take, why = c.maxParked-c.parked, fullParked
	}
	c.parked += take
	if srcMax > 0 {
		c.sources[source] += take
	}
	c.pmu.Lock()
	c.pending += take
	if srcMax > 0 {
		c.pendingSrc[source] += take
	}
	c.pmu.Unlock()
	var rest error // why the rest of n waits
	if take < int64(n) {
		rest = why()
	}
	done := sync.OnceFunc(func() {
		c.pmu.Lock()
		defer c.pmu.Unlock()
		c.pending -= take
		if srcMax > 0 {
			c.pendingSrc[source] -= take
		}
	})
	return int(take), done, rest
}

// ErrFull is the error of Capacity's gate when a limit is reached (as
// opposed to Redis failing to answer): room comes back as messages fire.
// PauseReason says which limit.
var ErrFull = errors.New("store: full")

// IsOutOfMemory reports whether err is Redis refusing a write at its
// maxmemory (noeviction): a limit of Redis's own, which the daemon's
// (limits.max_redis_memory) should keep it from reaching. Like ErrFull it
// passes as messages fire.
func IsOutOfMemory(err error) bool {
	var re redis.Error // "OOM command not allowed...", after "ERR Error running script" before Redis 7
	return errors.As(err, &re) && strings.Contains(re.Error(), "OOM command not allowed")
}

// PauseReason is why an ingest waits before parking: the reason label of
// delaybridge_ingest_paused.
type PauseReason string

// The reasons, PauseReasons in the order the metric lists them.
const (
	FullMaxParked         PauseReason = "max_parked"          // the ingest's own ingests[].max_parked
	FullMaxParkedMessages PauseReason = "max_parked_messages" // limits.max_parked_messages
	FullMaxRedisMemory    PauseReason = "max_redis_memory"    // limits.max_redis_memory
	PausedRedis           PauseReason = "redis"               // Redis refuses parks, or the limits cannot be read
)

// PauseReasons lists every PauseReason.
var PauseReasons = []PauseReason{FullMaxParked, FullMaxParkedMessages, FullMaxRedisMemory, PausedRedis}

// fullError is ErrFull with the limit reached.
type fullError struct {
	reason PauseReason
	msg    string
}

func (e *fullError) Error() string        { return ErrFull.Error() + ": " + e.msg }
func (e *fullError) Is(target error) bool { return target == ErrFull }

func full(reason PauseReason, format string, args ...any) error {
	return &fullError{reason: reason, msg: fmt.Sprintf(format, args...)}
}

// PauseReasonOf returns the reason of a pause whose error is err (nil:
// ""): the limit an ErrFull reached, else PausedRedis.
func PauseReasonOf(err error) PauseReason {
	var fe *fullError
	switch {
	case err == nil:
		return ""
	case errors.As(err, &fe):
		return fe.reason
	}
	return PausedRedis
}

// Memory is what INFO memory says about a Redis node.
type Memory struct {
	Used      int64 // used_memory
	MaxMemory int64 // maxmemory; 0 when Redis has no limit
}

// Memory reads Redis's INFO memory; on a cluster, that of the master
// holding the store's keys that uses the most memory (ForEachMaster).
func (s *Store) Memory(ctx context.Context) (Memory, error) {
	var mu sync.Mutex
	var most Memory
	err := s.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		m, err := nodeMemory(ctx, c)
		mu.Lock()
		if m.Used > most.Used {
			most = m
		}
		mu.Unlock()
		return err
	})
	return most, err
}

// nodeMemory reads one Redis node's INFO memory.
func nodeMemory(ctx context.Context, rdb *redis.Client) (Memory, error) {
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return Memory{}, fmt.Errorf("redis INFO memory: %w", err)
	}
	var m Memory
	var found bool
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			if m.Used, err = strconv.ParseInt(v, 10, 64); err != nil {
				return Memory{}, fmt.Errorf("redis INFO memory: used_memory: %w", err)
			}
			found = true
		case "maxmemory":
			m.MaxMemory, _ = strconv.ParseInt(v, 10, 64) // absent or odd: no limit known
		}
	}
	if !found {
		return Memory{}, fmt.Errorf("redis INFO memory has no used_memory")
	}
	return m, nil
}
