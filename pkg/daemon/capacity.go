package daemon

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/delaybridge/delaybridge/pkg/store"
)

// capacity checks limits.max_parked_messages and max_redis_memory for the
// ingest pipelines. The parked count is measured at most every quarter
// second and counted up by what this process parks in between, so a busy
// pipeline costs Redis a few reads a second, not one per batch; it is
// measured again at once when the count says the limit is near. A batch is
// let through while the count is under the limit, so the limit can be passed
// by at most one batch per instance.
type capacity struct {
	store     *store.Store
	maxParked int64
	maxMemory int64
	ttl       time.Duration

	mu         sync.Mutex
	measuredAt time.Time
	parked     int64 // measured, plus what was let through since
	memErr     error
}

func newCapacity(s *store.Store, maxParked, maxMemory int64) func(context.Context, int) error {
	if maxParked <= 0 && maxMemory <= 0 {
		return nil
	}
	c := &capacity{store: s, maxParked: maxParked, maxMemory: maxMemory, ttl: 250 * time.Millisecond}
	return c.check
}

// check returns nil when n more messages may be parked, else why not.
func (c *capacity) check(ctx context.Context, n int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	stale := time.Since(c.measuredAt) >= c.ttl
	if c.maxParked > 0 && (stale || c.parked+int64(n) > c.maxParked) {
		st, err := c.store.Stats(ctx)
		if err != nil {
			return err
		}
		c.parked = st.Parked
	}
	if c.maxMemory > 0 && stale {
		c.memErr = nil
		used, err := usedMemory(ctx, c.store.Client())
		switch {
		case err != nil:
			c.memErr = err
		case used >= c.maxMemory:
			c.memErr = fmt.Errorf("redis uses %d bytes, limits.max_redis_memory is %d: waiting for firing to make room", used, c.maxMemory)
		}
	}
	if stale {
		c.measuredAt = time.Now()
	}
	if c.memErr != nil {
		return c.memErr
	}
	if c.maxParked > 0 && c.parked >= c.maxParked {
		return fmt.Errorf("%d messages parked, limits.max_parked_messages is %d: waiting for firing to make room", c.parked, c.maxParked)
	}
	c.parked += int64(n)
	return nil
}

// usedMemory is INFO memory's used_memory; on a cluster, the largest of
// the masters'.
func usedMemory(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	m, err := redisMemory(ctx, rdb)
	return m.used, err
}

// memory is what INFO memory says about a Redis node.
type memory struct {
	used      int64 // used_memory
	maxmemory int64 // maxmemory; 0 when Redis has no limit
}

// redisMemory reads INFO memory; on a cluster, that of the master using the
// most memory.
func redisMemory(ctx context.Context, rdb redis.UniversalClient) (memory, error) {
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		var mu sync.Mutex
		var most memory
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			m, err := redisMemory(ctx, c)
			mu.Lock()
			if m.used > most.used {
				most = m
			}
			mu.Unlock()
			return err
		})
		return most, err
	}
	info, err := rdb.Info(ctx, "memory").Result()
	if err != nil {
		return memory{}, fmt.Errorf("redis INFO memory: %w", err)
	}
	var m memory
	var found bool
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "used_memory":
			if m.used, err = strconv.ParseInt(v, 10, 64); err != nil {
				return memory{}, fmt.Errorf("redis INFO memory: used_memory: %w", err)
			}
			found = true
		case "maxmemory":
			m.maxmemory, _ = strconv.ParseInt(v, 10, 64) // absent or odd: no limit known
		}
	}
	if !found {
		return memory{}, fmt.Errorf("redis INFO memory has no used_memory")
	}
	return m, nil
}
